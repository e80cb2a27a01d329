"""The CLI's contract with the people and tools that run it: one ``--json`` shape for every command (success
and failure alike), option choices built from modelyard's registries and refused by typer before any work,
click's own usage errors for ranges, full command summaries in ``modelyard --help``, "1 error" / "2 errors",
and plain unwrapped lines when stderr or stdout is not a terminal.

The envelope of the commands whose success needs a server, vLLM or a quantizer is checked by the tests that
run them, through ``tests.conftest.json_result`` (which checks the envelope): ingest (tests/e2e/test_cli_errors.py,
test_hub_ingest.py), demo (tests/e2e/conftest.py), quantize (tests/unit/test_quantize.py), smoke
(tests/e2e/test_serve_smoke_vllm.py), upgrade-check (tests/e2e/test_upgrade_vllm.py), publish (tests/e2e/test_publish_oci.py, test_publish_s3.py), watch,
promote and deploy (tests/e2e/test_watch_promote.py); pull and approve print the same envelope through the same
function (``emit_json``) and are listed in :data:`SUCCESS_ELSEWHERE`.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console
from typer.main import get_command
from typer.testing import CliRunner

from modelyard import progress
from modelyard.artifact.schemas import REPORT_SCHEMA
from modelyard.checks.base import VLLM_DTYPES
from modelyard.checks.report import counted
from modelyard.cli import _common, _reporters, app
from modelyard.cli._common import first_sentence
from modelyard.cli._reporters import stage_line
from modelyard.model.modes import SERVE_MODES
from modelyard.stages.quantize import ALL_SCHEMES
from modelyard.stages.quantize.compat import RUNTIMES
from modelyard.stages.serve.gpus import GPUS
from modelyard.stages.serve.plan import KV_CACHE_DTYPES
from modelyard.stages.smoke.server import LEVELS
from tests.conftest import ENVELOPE_KEYS, SHARED_CASES, json_envelope, json_error, json_result, run_cli
from tests.unit.test_bundle import _build_artifact
from tests.unit.test_signing import _keypair

#: every command with --json: its failure (argv after the command, with {tmp} for a fresh folder) -> exit code
#: and error type. Each fails before any work (a missing input, a bad value, a missing option).
FAILURES = {
    "ingest": (["file://{tmp}/nope"], 2, "SourceNotFoundError"),
    "verify": (["{tmp}/nope"], 2, "SourceNotFoundError"),
    "quantize": (["{tmp}", "--scheme", "int3", "-o", "{tmp}/q"], 2, "UsageError"),
    "smoke": (["{tmp}"], 2, "MissingConfigError"),
    "upgrade-check": (["--store", "{tmp}/none", "--runtime", "0.31.0"], 2, "StoreError"),
    "serve-plan": (["{tmp}", "--gpu", "H100-80GB"], 2, "MissingConfigError"),
    "bundle": (["{tmp}/nope", "-o", "{tmp}/b.tar.zst"], 2, "BundleError"),
    "unbundle": (["{tmp}/nope.tar.zst", "-o", "{tmp}/u"], 2, "BundleError"),
    "doctor": (["{tmp}"], 2, "MissingConfigError"),
    "rollout": (["{tmp}", "--serve", "{tmp}/serve"], 2, "MissingConfigError"),
    "publish": (["{tmp}", "--to", "ftp://x"], 2, "PublishError"),
    "pull": (["oci://127.0.0.1:9/x:y"], 2, "InvalidTargetError"),
    "sign": (["{tmp}", "--key", "{tmp}/k.pem"], 2, "SigningKeyError"),
    "verify-signature": (["{tmp}"], 2, "SigningKeyError"),
    "list": (["--store", "{tmp}/none"], 2, "StoreError"),
    "show": (["x", "--store", "{tmp}/none"], 2, "StoreError"),
    "bom": (["{tmp}/none"], 2, "InvalidTargetError"),
    "demo": (["--smoke", "nope"], 2, "UsageError"),
    "watch": (["--config", "{tmp}/nope.yaml", "--once"], 2, "SourceNotFoundError"),
    "promote": (["no-revision", "--to", "{tmp}/prod"], 2, "InvalidSourceError"),
    "approve": (["some-run"], 2, "UsageError"),
    "deploy": (["--config", "{tmp}/w.yaml"], 2, "UsageError"),
    "deploy-ingest": (["--crash-after", "-1"], 2, "UsageError"),
}
#: commands whose success is run here (see :func:`test_json_success`); the others in :data:`SUCCESS_ELSEWHERE`
SUCCESS_HERE = ("verify", "serve-plan", "bundle", "unbundle", "sign", "verify-signature", "list", "show", "doctor", "bom")
SUCCESS_ELSEWHERE = ("ingest", "quantize", "smoke", "upgrade-check", "rollout", "publish", "pull", "demo", "watch", "promote", "approve", "deploy",
                     "deploy-ingest")


@pytest.fixture()
def stderr(monkeypatch) -> io.StringIO:
    """What the commands print on stderr in-process (a console that is not a terminal, as in CI)."""
    buf = io.StringIO()
    monkeypatch.setattr(_common, "err", Console(file=buf, width=80))
    return buf


def _help(command: str) -> str:
    """``modelyard COMMAND --help`` with every run of whitespace made one space (the help wraps at 80 columns,
    also after a hyphen: "air-" / "gapped")."""
    r = CliRunner().invoke(app, [command, "--help"] if command else ["--help"])
    assert r.exit_code == 0, r.output
    return re.sub(r"(?<=\w-) (?=\w)", "", " ".join(r.output.split()))


# ---- one --json shape ----------------------------------------------------------------------------------


def test_every_json_command_is_tested_and_documented():
    commands = get_command(app).commands
    with_json = {name for name, c in commands.items() if any(p.name == "as_json" for p in c.params)}
    assert with_json == set(FAILURES) == set(SUCCESS_HERE) | set(SUCCESS_ELSEWHERE)
    groups = {name: c for name, c in commands.items() if hasattr(c, "commands")}  # typer vendors click: no click.Group
    assert with_json == set(commands) - {"patch"} - set(groups)  # patch prints a diff, not an object
    subcommands = {f"{g} {name}": c for g, group in groups.items() for name, c in group.commands.items()}
    assert sorted(subcommands) == ["server start", "server status", "server stop"]
    assert all(any(p.name == "as_json" for p in c.params) for c in subcommands.values())
    doc = (Path(__file__).parents[2] / "docs" / "reference" / "json.md").read_text()
    for name in [*with_json, *subcommands]:
        assert f"| `{name}` |" in doc, name
    assert list(_common.ENVELOPE_KEYS) == ENVELOPE_KEYS


@pytest.mark.parametrize("command", sorted(FAILURES))
def test_json_failure(command, tmp_path, stderr):
    args, code, kind = FAILURES[command]
    r = CliRunner().invoke(app, [command, *(a.format(tmp=tmp_path) for a in args), "--json"])
    assert r.exit_code == code, r.output
    env = json_envelope(r.stdout, command, code)
    assert (env["result"], env["error"]["type"]) == (None, kind), env
    assert env["error"]["message"] and stderr.getvalue() == ""


@pytest.fixture(scope="module")
def store_artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


@pytest.mark.parametrize("command", SUCCESS_HERE)
def test_json_success(command, store_artifact, tiny_llama_dir, tmp_path, monkeypatch, stderr):
    """Each command's envelope on success; the result is the command's own object."""
    from modelyard.stages import host_facts

    home = store_artifact.parents[1]
    priv, pub = _keypair(tmp_path)
    signed = tmp_path / "signed"
    if command in ("verify-signature",):
        import shutil

        shutil.copytree(store_artifact, signed)
        assert CliRunner().invoke(app, ["sign", str(signed), "--key", str(priv)]).exit_code == 0
    bundle = tmp_path / "a.tar.zst"
    if command == "unbundle":
        assert CliRunner().invoke(app, ["bundle", str(store_artifact), "-o", str(bundle)]).exit_code == 0
    if command == "doctor":
        monkeypatch.setenv("MODELYARD_VLLM_PYTHON", str(tmp_path / "no-vllm"))
        monkeypatch.setattr(host_facts.shutil, "which", lambda _: None)
    sign_copy = tmp_path / "to-sign"
    if command == "sign":
        import shutil

        shutil.copytree(store_artifact, sign_copy)
    argv = {
        "verify": [str(tiny_llama_dir)],
        "serve-plan": [str(tiny_llama_dir), "--gpu", "L4-24GB", "--no-write"],
        "bundle": [str(store_artifact), "-o", str(tmp_path / "b.tar.zst")],
        "unbundle": [str(bundle), "-o", str(tmp_path / "u")],
        "sign": [str(sign_copy), "--key", str(priv)],
        "verify-signature": [str(signed), "--key", str(pub)],
        "list": ["--store", str(home)],
        "show": ["tiny", "--store", str(home)],
        "doctor": [],
        "bom": ["tiny", "--store", str(home), "-o", str(tmp_path / "bom.json")],
    }[command]
    stderr.truncate(0)  # what the set-up printed
    stderr.seek(0)
    r = CliRunner().invoke(app, [command, *argv, "--json"])
    assert r.exit_code == 0, r.output
    result = json_result(r.stdout, command)
    manifest = json.loads((store_artifact / "manifest.json").read_text())
    expected = {
        "verify": lambda d: d["summary"] == {"errors": 0, "warnings": 0, "infos": 0, "not_judged": 0, "passed": True},
        "serve-plan": lambda d: (d["gpu"], d["serve_dir"]) == ("L4-24GB", None),
        "bundle": lambda d: d["bytes_out"] == (tmp_path / "b.tar.zst").stat().st_size,
        "unbundle": lambda d: d["content_digest"] == manifest["content_digest"],
        "sign": lambda d: d == {"signature": str(sign_copy / "model.sig"), "method": "key"},
        "verify-signature": lambda d: (d["method"], d["scope"], d["files"]) == (
            "key", "artifact", sum(1 for p in signed.rglob("*") if p.is_file() and p.name not in ("model.sig", "manifest.json"))),
        "list": lambda d: (d["store"], [a["revision"] for a in d["artifacts"]]) == (str(home), [manifest["revision"]]),
        "show": lambda d: d["content_digest"] == manifest["content_digest"],
        "doctor": lambda d: (d["host"]["gpus"], d["needs"]) == ([], []),
        "bom": lambda d: (d["path"], d["spec_version"], d["files"]) == (
            str(tmp_path / "bom.json"), "1.6", len(manifest["files"]) + 3),
    }[command]
    assert expected(result), result
    assert stderr.getvalue() == ""  # --json: no progress


def test_doctor_takes_a_store_reference(store_artifact, tmp_path, monkeypatch):
    """doctor NAME[@REV] --store judges the stored artifact, as show and serve-plan read it (it took folders only,
    and a name gave missing_config without naming the store)."""
    from modelyard.stages import host_facts

    monkeypatch.setenv("MODELYARD_VLLM_PYTHON", str(tmp_path / "no-vllm"))
    monkeypatch.setattr(host_facts.shutil, "which", lambda _: None)
    home = store_artifact.parents[1]
    by_path = CliRunner().invoke(app, ["doctor", str(store_artifact), "--json"])
    by_ref = CliRunner().invoke(app, ["doctor", f"tiny@{store_artifact.name[:8]}", "--store", str(home), "--json"])
    assert (by_ref.exit_code, json_envelope(by_ref.stdout, "doctor", 1)["result"]["needs"]) == (
        by_path.exit_code, json_envelope(by_path.stdout, "doctor", 1)["result"]["needs"])
    r = CliRunner().invoke(app, ["doctor", "nosuch", "--store", str(home), "--json"])
    err = json_error(r.stdout, "doctor", 2)
    assert (err["code"], err["message"]) == ("store_failed", f"the store {home} holds no artifact named 'nosuch'")


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases is not beside this checkout")
def test_verify_json_with_errors_keeps_the_report_schema_inside_the_envelope():
    case = SHARED_CASES / "C01-llama3-eot-not-stop"
    r = run_cli("verify", str(case), "--json")
    assert (r.returncode, r.stderr) == (1, "")
    env = json_envelope(r.stdout, "verify", 1)
    jsonschema.validate(env["result"], json.loads(REPORT_SCHEMA.read_text()))
    assert env["error"] == {"type": "VerificationFailedError", "code": "verification_failed",
                            "message": f"{case} has 1 error, 0 warnings",
                            "fix": "Each finding in result.findings names the file, the field and the fix."}


def test_usage_error_with_json_is_the_envelope_and_without_is_one_error_line(tmp_path):
    r = run_cli("serve-plan", str(tmp_path), "--gpu", "V100", "--json")
    assert (r.returncode, r.stderr) == (2, "")
    assert json_error(r.stdout, "serve-plan", 2) == {
        "type": "UsageError", "code": "usage", "message": "Invalid value for '--gpu': 'V100' is not one of "
                                         + ", ".join(repr(g) for g in GPUS) + ".",
        "fix": "See `modelyard serve-plan --help`."}
    r = run_cli("serve-plan", str(tmp_path), "--gpu", "V100")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        "error[usage]: Invalid value for '--gpu': 'V100' is not one of " + ", ".join(repr(g) for g in GPUS) + ".",
        "fix: See `modelyard serve-plan --help`."]
    r = run_cli("serve-plan")
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (
        2, "", ["error[usage]: Missing argument 'path'.", "fix: See `modelyard serve-plan --help`."])


# ---- choices from the registries -------------------------------------------------------------------------

CHOICES = [  # (command, option, the registry's values)
    ("ingest", "--serve", SERVE_MODES), ("verify", "--serve", SERVE_MODES), ("smoke", "--serve", SERVE_MODES),
    ("patch", "--serve", SERVE_MODES),
    ("ingest", "--dtype", VLLM_DTYPES), ("verify", "--dtype", VLLM_DTYPES),
    ("ingest", "--quantize", tuple(ALL_SCHEMES)), ("quantize", "--scheme", tuple(ALL_SCHEMES)),
    ("ingest", "--runtime", RUNTIMES), ("quantize", "--runtime", RUNTIMES), ("verify", "--runtime", ("none", "local")),
    ("ingest", "--smoke", LEVELS), ("demo", "--smoke", LEVELS), ("smoke", "--smoke", LEVELS),
    ("promote", "--require-smoke", LEVELS),
    ("ingest", "--gpu", tuple(GPUS)), ("serve-plan", "--gpu", tuple(GPUS)),
    ("serve-plan", "--kv-cache-dtype", KV_CACHE_DTYPES),
]


@pytest.mark.parametrize(("command", "option", "values"), CHOICES, ids=[f"{c}{o}" for c, o, _ in CHOICES])
def test_choices_are_the_registry_and_shown_in_help(command, option, values):
    assert f"{option} <{'|'.join(values)}>" in _help(command)


@pytest.mark.parametrize(("command", "option", "values"), CHOICES, ids=[f"{c}{o}" for c, o, _ in CHOICES])
def test_a_value_outside_the_choices_is_typers_usage_error_before_any_work(command, option, values, stderr):
    """The path does not exist either: the bad value is refused first, by typer (exit 2), not by the command."""
    args = {"ingest": ["file:///nowhere"], "verify": ["/nowhere"], "smoke": ["/nowhere"], "patch": ["/nowhere"],
            "quantize": ["/nowhere", "--scheme", "w8a8"], "serve-plan": ["/nowhere", "--gpu", "L4-24GB"], "demo": [],
            "promote": ["x@y", "--to", "/nowhere"]}[command]
    r = CliRunner().invoke(app, [command, *args, option, "bogus"])
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", "")
    assert stderr.getvalue().splitlines() == [f"error[usage]: Invalid value for '{option}': 'bogus' is not one of "
                                     + ", ".join(repr(v) for v in values) + ".", f"fix: See `modelyard {command} --help`."]


@pytest.mark.parametrize(("argv", "option", "bound"), [
    (["serve-plan", "/m", "--gpu", "L4-24GB", "--gpus", "-1"], "--gpus' / '--gpus-per-node", "greater than or equal to 1"),
    (["ingest", "file:///m", "--gpus", "0"], "--gpus", "greater than or equal to 1"),
    (["serve-plan", "/m", "--gpu", "L4-24GB", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization",
     "less than or equal to 1"),
    (["serve-plan", "/m", "--gpu", "L4-24GB", "--gpu-memory-utilization", "0"], "--gpu-memory-utilization",
     "greater than or equal to 0.01"),
    (["quantize", "/m", "--scheme", "w8a8", "-o", "/o", "--max-kl", "-1"], "--max-kl", "greater than or equal to 0"),
    (["quantize", "/m", "--scheme", "w8a8", "-o", "/o", "--max-ppl-ratio", "0.5"], "--max-ppl-ratio",
     "greater than or equal to 1"),
    (["doctor", "--timeout", "0"], "--timeout", "greater than or equal to 1"),
])
def test_range_errors_are_typers_usage_errors(argv, option, bound, stderr):
    r = CliRunner().invoke(app, argv)
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", "")
    assert stderr.getvalue().splitlines() == [f"error[usage]: Invalid value for '{option}': Input should be {bound}",
                                              f"fix: See `modelyard {argv[0]} --help`."]


# ---- help, grammar --------------------------------------------------------------------------------------


def test_top_level_help_shows_each_command_s_whole_first_sentence():
    text = _help("").split(" Commands: ")[1]
    commands = get_command(app).commands
    for name, c in commands.items():
        sentence = first_sentence(c.help or "")
        assert sentence.endswith(".") and f"{name} {sentence}" in text, name
    assert "..." not in text
    assert first_sentence("Size PATH on --gpus x --gpu: weights (vllm.yaml, README.md).\nMore. Even more.") == \
        "Size PATH on --gpus x --gpu: weights (vllm.yaml, README.md)."


def test_counts_say_1_error_and_2_errors():
    assert [counted(n, "error") for n in (0, 1, 2)] == ["0 errors", "1 error", "2 errors"]
    assert counted(1, "warning") == "1 warning"
    from modelyard.checks.base import Finding, Severity
    from modelyard.checks.report import Report

    one = Report(findings=(Finding("x.y", Severity.ERROR, "bad"), Finding("x.z", Severity.WARNING, "meh")))
    assert "**Verdict:** FAIL (1 error, 1 warning)" in one.to_markdown()


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases is not beside this checkout")
def test_verify_verdict_is_one_unwrapped_line_with_singular_counts(tmp_path):
    """Piped: the verdict and a path far past 80 columns stay one line; 1 error, 0 warnings."""
    import shutil

    deep = tmp_path / ("a-folder-name-long-enough-to-push-the-verdict-past-eighty-columns-" * 2) / "C01"
    shutil.copytree(SHARED_CASES / "C01-llama3-eot-not-stop", deep)
    r = run_cli("verify", str(deep))
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == f"FAIL {deep}: 1 error, 0 warnings"
    assert all(len(ln) < 400 or ln.startswith(("        ", "FAIL")) for ln in r.stdout.splitlines())
    findings = [ln for ln in r.stdout.splitlines() if ln.startswith("        ") and not ln.startswith("        fix")]
    assert len(findings) == 2 and len(findings[0]) > 200  # the long message is one line too


# ---- output when stderr is not a terminal -----------------------------------------------------------------

TIME = re.compile(r" in \d+\.\d s$")


def _lines(text: str) -> list[str]:
    """``text``'s lines with each stage's seconds made ``in X s``."""
    return [TIME.sub(" in X s", ln) for ln in text.splitlines()]


def test_stage_line():
    assert stage_line("hashing (sha256)", 272_600_000, 272_600_000, "B", 0.94) == "hashing (sha256): 272.6 MB in 0.9 s"
    assert stage_line("writing report and manifest", 3, 3, "files", 0.01) == "writing report and manifest: 3 files in 0.0 s"
    assert stage_line("vLLM smoke load + chat", 0, None, "B", 48.04) == "vLLM smoke load + chat: done in 48.0 s"


def test_piped_progress_is_one_plain_line_per_finished_stage(store_artifact, tmp_path, stderr):
    """bundle then unbundle, stderr not a terminal: one line each, the bytes each stage declared (bundle: the
    files after manifest.json; unbundle: everything the bundle declares, bytes_in)."""
    b = tmp_path / "a.tar.zst"
    r = CliRunner().invoke(app, ["bundle", str(store_artifact), "-o", str(b), "--json"])
    assert r.exit_code == 0, r.output
    bytes_in = json_result(r.stdout, "bundle")["bytes_in"]
    r = CliRunner().invoke(app, ["bundle", str(store_artifact), "-o", str(b), "--force"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["unbundle", str(b), "-o", str(tmp_path / "u")])
    assert r.exit_code == 0, r.output
    assert _lines(stderr.getvalue()) == [
        f"bundling {store_artifact.name}: {_reporters.decimal(_bundled_bytes(store_artifact))} in X s",
        f"unbundling {b.name}: {_reporters.decimal(bytes_in)} in X s"]


@pytest.mark.parametrize("width", [60, 80])
def test_bars_on_a_narrow_terminal_keep_one_line_per_stage(width):
    """On a terminal the bars stay, one line per stage however narrow: a long description is cut, never wrapped."""
    buf = io.StringIO()
    reporter = _reporters.RichReporter(Console(file=buf, width=width, force_terminal=True))
    for description, total in (("converting SmolLM2-135M-Instruct.Q4_1.gguf to safetensors", 98_400_000),
                               ("hashing (sha256)", 272_600_000), ("vLLM smoke load + chat", None)):
        h = reporter.start(description, total, "B")
        reporter.advance(h, total or 0)
        reporter.finish(h)
    reporter.close()
    final = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue()).split("\r")[-1].splitlines()
    assert len(final) == 3 and all(len(ln) <= width for ln in final), final
    assert final[0].split("━")[0].rstrip().endswith("…")  # the long description, cut
    assert final[0].endswith("98.4 MB/98.4 MB   0:00:00") and final[2].endswith("done              0:00:00")


def test_a_failed_stage_prints_no_line(stderr):
    reporter = _reporters.LineReporter(_common.err)
    progress.set_reporter(reporter)
    try:
        with pytest.raises(RuntimeError), progress.task("hashing (sha256)", total=10) as adv:
            adv(4)
            raise RuntimeError("disk gone")
        with progress.task("packaging model/", total=10) as adv:
            adv(10)
    finally:
        progress.set_reporter(None)
    assert _lines(stderr.getvalue()) == ["packaging model/: 10 bytes in X s"]


def test_a_long_stage_prints_a_heartbeat_when_stderr_is_not_a_terminal():
    """A stage that runs past the heartbeat interval prints "still running" lines with its progress (a 623 s
    quantize printed nothing in a CI log); a finished stage prints its one line and no more heartbeats."""
    import time

    buf = io.StringIO()
    reporter = _reporters.LineReporter(Console(file=buf, width=80), heartbeat=0.3)
    progress.set_reporter(reporter)
    try:
        with progress.task("downloading weights", total=2_000_000_000) as adv:
            adv(500_000_000)
            time.sleep(1.45)
        with progress.task("quantizing (w4a16)") as adv:
            time.sleep(1.45)
        time.sleep(0.8)
    finally:
        progress.set_reporter(None)
        reporter.close()
    lines = [re.sub(r"\d+ s$", "N s", re.sub(r"in [0-9.]+ s", "in X s", ln)) for ln in buf.getvalue().splitlines()]
    beats = [ln for ln in lines if "still running" in ln]
    assert set(beats) == {"downloading weights: still running, 500.0 MB/2.0 GB after N s",
                          "quantizing (w4a16): still running after N s"}
    assert 3 <= sum("downloading" in b for b in beats) <= 5 and 3 <= sum("quantizing" in b for b in beats) <= 5
    assert lines[-1] == "quantizing (w4a16): done in X s"
    assert "downloading weights: 2.0 GB in X s" in lines


def test_library_output_on_stderr_is_dropped_while_a_command_works(store_artifact, tmp_path):
    """What a library writes on file descriptor 2 (a tqdm bar, a warning) while a command works never reaches the
    user's stderr, unless --verbose; modelyard's own line does. (transformers' GGUF conversion bar printed there.)"""
    bar = "Converting and de-quantizing GGUF tensors...: 100%|##########| 272/272"
    for verbose in (False, True):
        out = tmp_path / f"b{verbose}.tar.zst"
        r = _run_noisy(bar, ["bundle", str(store_artifact), "-o", str(out), *(["-v"] if verbose else [])])
        assert r.returncode == 0, r.stderr
        own = f"bundling {store_artifact.name}: {_reporters.decimal(_bundled_bytes(store_artifact))} in X s"
        if verbose:
            assert bar in _lines(r.stderr) and "a library's warning" in r.stderr and _lines(r.stderr)[-1] == own
        else:
            assert _lines(r.stderr) == [own]


def _bundled_bytes(artifact: Path) -> int:
    """The bytes ``bundle`` reports for ``artifact``: every file it packs after manifest.json."""
    return sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file() and p.name != "manifest.json")


def _run_noisy(bar: str, argv: list[str]):
    """Run the CLI in a child whose ``bundle_artifact`` first writes ``bar`` on file descriptor 2 and warns."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    child = ("import os, sys, warnings\nimport modelyard.cli.artifacts as a\nfrom modelyard.cli import main\n"
             "from modelyard.transport.refs import bundle_artifact\n"
             f"def noisy(*x, **k):\n    os.write(2, {(bar + chr(10)).encode()!r})\n"
             "    warnings.warn(\"a library's warning\", UserWarning, stacklevel=1)\n"
             "    return bundle_artifact(*x, **k)\n"
             "a.bundle_artifact = noisy\nsys.argv = ['modelyard', *sys.argv[1:]]\nmain()\n")
    return subprocess.run([sys.executable, "-c", child, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--format", "sarif"]], ids=["table", "json", "sarif"])
def test_a_closed_stdout_is_not_an_internal_error(tiny_llama_dir, fmt):
    """`modelyard verify ... | head`: the reader closing the pipe ends the command quietly with 141 (128 + SIGPIPE,
    what a shell reports for `yes | head`), not exit 3 "internal error: SystemExit" or BrokenPipeError."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    p = subprocess.Popen([sys.executable, "-m", "modelyard", "verify", str(tiny_llama_dir), *fmt], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first line
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert (p.returncode, err) == (141, "")


def test_help_has_a_short_flag_and_shells_complete_commands():
    """-h as --help, for every command (the hub CLI's habit); shell completion through click's protocol."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    for args in ([], ["verify"], ["server", "start"]):
        r = CliRunner().invoke(app, [*args, "-h"], prog_name="modelyard")
        assert r.exit_code == 0 and r.stdout.startswith(f"Usage: modelyard {' '.join(args)}".rstrip() + " "), r.stdout
        assert r.stdout == CliRunner().invoke(app, [*args, "--help"], prog_name="modelyard").stdout
    env = {**os.environ, "_MODELYARD_COMPLETE": "complete_bash", "COMP_WORDS": "modelyard veri", "COMP_CWORD": "1"}
    script = Path(sys.executable).parent / "modelyard"  # the console script the package installs, as a shell runs it
    r = subprocess.run([str(script)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.split()) == (0, ["verify", "verify-signature"])
    r = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="modelyard")
    assert r.exit_code == 0 and "_MODELYARD_COMPLETE=complete_bash" in r.stdout


def test_revision_is_an_alias_of_at_rev():
    from modelyard.errors import InvalidSourceError
    from modelyard.model.source import with_revision

    assert [with_revision(u, r) for u, r in (("hf://org/m", "v1"), ("hf://org/m@v1", "v1"),
                                              ("https://huggingface.co/org/m", "abc"), ("hf://org/m@x", None))] == [
        "hf://org/m@v1", "hf://org/m@v1", "hf://org/m@abc", "hf://org/m@x"]
    with pytest.raises(InvalidSourceError) as ei:
        with_revision("hf://org/m@v2", "v1")
    assert ei.value.message == "'hf://org/m@v2' names revision 'v2' and --revision says 'v1'"
    r = CliRunner().invoke(app, ["ingest", "/nonexistent-model", "--revision", "v1", "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["message"] == (
        "--revision 'v1' applies to hub sources; '/nonexistent-model' is a file source")

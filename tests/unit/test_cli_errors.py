"""The CLI's one failure handler (modelyard.cli._common.Command) and --version: exact output and exit
codes, through the real ``python -m modelyard`` (main()) and through typer's CliRunner."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from modelyard.cli import _common, app, main
from modelyard.errors import SourceNotFoundError
from modelyard.stages import quantize, verify
from modelyard.version import __version__
from tests.conftest import json_envelope, json_error, run_cli

INTERNAL_LINE = "internal error: RuntimeError: boom (re-run with --verbose for details)\n"
INTERNAL_ERROR = {"type": "InternalError", "code": "internal", "message": "internal error: RuntimeError: boom",
                  "fix": "Re-run with --verbose for details."}


def internal_json(command: str) -> dict:
    """The envelope of an internal error in ``command``."""
    return {"ok": False, "command": command, "exit_code": 3, "result": None, "error": INTERNAL_ERROR}


@pytest.fixture()
def stderr(monkeypatch) -> io.StringIO:
    """What the commands print on stderr in-process (the real ``err`` console writes to a copy of fd 2,
    which CliRunner does not capture)."""
    buf = io.StringIO()
    monkeypatch.setattr(_common, "err", Console(file=buf, width=200))
    return buf


def _boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_version():
    assert __version__ and __version__[0].isdigit()
    r = CliRunner().invoke(app, ["--version"])
    assert (r.exit_code, r.stdout) == (0, f"modelyard {__version__}\n")
    p = run_cli("--version")
    assert (p.returncode, p.stdout, p.stderr) == (0, f"modelyard {__version__}\n", "")


def test_verify_missing_path(tmp_path: Path):
    missing = tmp_path / "nope"
    r = run_cli("verify", str(missing))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error[source_not_found]: {missing} does not exist\n"
                        "fix: Pass the model folder (the one with config.json).\n")


def test_verify_missing_path_json(tmp_path: Path):
    missing = tmp_path / "nope"
    r = run_cli("verify", str(missing), "--json")
    assert (r.returncode, r.stderr) == (2, "")
    assert json.loads(r.stdout) == {"ok": False, "command": "verify", "exit_code": 2, "result": None, "error": {
        "type": "SourceNotFoundError", "code": "source_not_found", "message": f"{missing} does not exist",
        "fix": "Pass the model folder (the one with config.json)."}}
    json_envelope(r.stdout, "verify", 2)  # and its keys in order


def test_smoke_of_a_missing_or_file_path_names_the_path(tmp_path: Path):
    missing, file = tmp_path / "nope", tmp_path / "f.txt"
    file.write_text("x")
    fix = "fix: Pass a model or artifact folder (`modelyard list` shows the store's artifacts).\n"
    r = run_cli("smoke", str(missing), "--smoke", "load")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error[source_not_found]: {missing} does not exist\n" + fix)
    r = run_cli("smoke", str(file), "--smoke", "load")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error[source_not_found]: {file} is not a folder\n" + fix)


def test_runner_and_main_agree(tmp_path: Path, stderr: io.StringIO, monkeypatch, capsys):
    missing = tmp_path / "nope"
    r = CliRunner().invoke(app, ["verify", str(missing)])
    assert (r.exit_code, r.stdout) == (2, "")
    assert stderr.getvalue() == (f"error[source_not_found]: {missing} does not exist\n"
                                 "fix: Pass the model folder (the one with config.json).\n")
    monkeypatch.setattr(sys, "argv", ["modelyard", "verify", str(missing), "--json"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    assert json_error(capsys.readouterr().out, "verify", 2)["type"] == "SourceNotFoundError"


def test_internal_error(tiny_llama_dir: Path, stderr: io.StringIO, monkeypatch):
    monkeypatch.setattr(verify, "verify_folder", _boom)
    r = CliRunner().invoke(app, ["verify", str(tiny_llama_dir)])
    assert (r.exit_code, r.stdout, stderr.getvalue()) == (3, "", INTERNAL_LINE)


def test_internal_error_json(tiny_llama_dir: Path, stderr: io.StringIO, monkeypatch):
    monkeypatch.setattr(verify, "verify_folder", _boom)
    r = CliRunner().invoke(app, ["verify", str(tiny_llama_dir), "--json"])
    assert (r.exit_code, json.loads(r.stdout), stderr.getvalue()) == (3, internal_json("verify"), "")


def test_internal_error_verbose_shows_the_traceback(tiny_llama_dir: Path, stderr: io.StringIO, monkeypatch):
    monkeypatch.setattr(verify, "verify_folder", _boom)
    r = CliRunner().invoke(app, ["verify", str(tiny_llama_dir), "--verbose"])
    assert r.exit_code == 3
    text = stderr.getvalue()
    assert "Traceback" in text and "in verify" in text and "RuntimeError: boom" in text
    assert "in invoke" not in text  # the handler's and typer's frames are left out
    assert text.endswith(INTERNAL_LINE)


def test_interrupted(tiny_llama_dir: Path, stderr: io.StringIO, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify, "verify_folder", interrupt)
    r = CliRunner().invoke(app, ["verify", str(tiny_llama_dir)])
    assert (r.exit_code, r.stdout, stderr.getvalue()) == (130, "", "interrupted\n")
    r = CliRunner().invoke(app, ["verify", str(tiny_llama_dir), "--json"])
    assert (r.exit_code, json_error(r.stdout, "verify", 130), stderr.getvalue()) == (
        130, {"type": "Interrupted", "code": "interrupted", "message": "interrupted", "fix": None}, "interrupted\n")


def test_error_json_with_progress_command(tmp_path: Path, stderr: io.StringIO, monkeypatch):
    """A command that shows progress (bundle) fails the same way, and leaves no progress display behind."""
    monkeypatch.setattr("modelyard.cli.artifacts.bundle_artifact", _boom)
    r = CliRunner().invoke(app, ["bundle", str(tmp_path), "-o", str(tmp_path / "b.tar.zst"), "--json"])
    assert (r.exit_code, json.loads(r.stdout), stderr.getvalue()) == (3, internal_json("bundle"), "")
    r = CliRunner().invoke(app, ["bundle", str(tmp_path), "-o", str(tmp_path / "b.tar.zst")])
    assert r.exit_code == 3 and stderr.getvalue().startswith(INTERNAL_LINE)
    assert _common._reporter is None


def test_demo_missing_package_json(stderr: io.StringIO, monkeypatch):
    def gone():
        raise SourceNotFoundError("gone", fix="reinstall")

    monkeypatch.setattr("modelyard.cli.ingest.demo_gguf_path", gone)
    r = CliRunner().invoke(app, ["demo", "--json"])
    assert r.exit_code == 2
    assert json_error(r.stdout, "demo", 2) == {"type": "SourceNotFoundError", "code": "source_not_found",
                                               "message": "gone", "fix": "reinstall"}




def test_quantize_failure_removes_the_empty_out_dir(tiny_llama_dir: Path, tmp_path: Path, stderr: io.StringIO,
                                                    monkeypatch):
    monkeypatch.setattr(quantize, "quantize_model", _boom)
    out = tmp_path / "q"
    r = CliRunner().invoke(app, ["quantize", str(tiny_llama_dir), "--scheme", "w4a16", "--out", str(out), "--json"])
    assert (r.exit_code, json.loads(r.stdout)) == (3, internal_json("quantize"))
    assert not out.exists()


def test_verify_refuses_json_and_markdown_together(tmp_path):
    r = CliRunner().invoke(app, ["verify", str(tmp_path), "--json", "--markdown"])
    assert r.exit_code == 2
    assert json_error(r.stdout, "verify", 2) == {
        "type": "InvalidTargetError", "code": "invalid_target",
        "message": "--json and --markdown both ask for the report on stdout",
        "fix": "Pass one of them (the JSON report carries everything the Markdown one shows)."}


def test_help_keeps_brackets_and_shows_no_bool_metavar():
    """Help is plain text: a NAME[@REVISION] in a help string is printed, not taken as rich markup,
    and a flag shows no ``<bool>`` value."""
    show = CliRunner().invoke(app, ["show", "--help"], env={"COLUMNS": "120"}).output
    assert "NAME[@REVISION] in the store, or an artifact folder" in show
    ingest = CliRunner().invoke(app, ["ingest", "--help"], env={"COLUMNS": "120"}).output
    assert "tar:///path/bundle.tar.zst" in ingest and "<bool>" not in ingest


def test_one_word_per_meaning_with_the_old_spellings_as_hidden_aliases(tiny_llama_dir, tmp_path):
    """--store is a store, -o/--output a new path; --out, --into, --write and smoke --level still work,
    are not in --help, and clash when given twice with different values."""
    a, b = tmp_path / "a", tmp_path / "b"
    r = CliRunner().invoke(app, ["quantize", str(tiny_llama_dir), "--scheme", "w8a8", "--out", str(a), "-o", str(b), "--json"])
    assert (r.exit_code, json_error(r.stdout, "quantize", 2)["message"]) == (
        2, "--output was given twice, under two spellings, with different values")
    assert not a.exists() and not b.exists()
    r = CliRunner().invoke(app, ["pull", "oci://127.0.0.1:9/x:y", "--json"])
    assert (r.exit_code, json_error(r.stdout, "pull", 2)["message"]) == (2, "--output is required")
    r = CliRunner().invoke(app, ["list", "--out", str(tmp_path / "none"), "--json"])
    assert (r.exit_code, json_error(r.stdout, "list", 2)["message"]) == (2, f"there is no store at {tmp_path / 'none'}")
    for command, old in (("ingest", "--out"), ("list", "--out"), ("patch", "--out"), ("unbundle", "--into"),
                         ("serve-plan", "--write"), ("smoke", "--level")):
        text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "120"}).output
        assert old not in text.replace("--output", ""), (command, old)


def test_show_in_a_store_that_does_not_exist_says_so(tmp_path):
    r = CliRunner().invoke(app, ["show", "nosuch", "--store", str(tmp_path / "none"), "--json"])
    assert (r.exit_code, json_error(r.stdout, "show", 2)["message"]) == (2, f"there is no store at {tmp_path / 'none'}")


def test_show_refuses_what_is_no_artifact(tmp_path):
    """A missing folder is source_not_found (as verify and ingest say it), a manifest.json of ``{}`` is refused
    (it parsed, every key having a default, and show printed a guessed name), a broken one gives one fix."""
    r = CliRunner().invoke(app, ["show", str(tmp_path / "gone"), "--json"])
    err = json_error(r.stdout, "show", 2)
    assert (err["code"], err["message"]) == ("source_not_found", f"{tmp_path / 'gone'} does not exist")
    art = tmp_path / "art"
    art.mkdir()
    (art / "manifest.json").write_text("{}")
    r = CliRunner().invoke(app, ["show", str(art), "--json"])
    err = json_error(r.stdout, "show", 2)
    assert (err["code"], err["message"]) == (
        "store_failed", f"{art}/manifest.json is not a modelyard manifest: it has no name, revision, content_digest, files")
    (art / "manifest.json").write_text("{not json")
    r = run_cli("show", str(art))
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        f"error[store_failed]: {art}/manifest.json is not valid JSON: Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)",
        "fix: Re-create the artifact with `modelyard ingest`; manifest.json was edited or cut."])

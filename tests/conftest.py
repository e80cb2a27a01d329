from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Quiet Prefect in-process (its shutdown message otherwise hits pytest's closed capture stream).
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# ingest asks the runtime venv's vLLM during verify when it exists (10-25 s of vLLM import per verify on 2
# cores): the many ingests of the suite test other stages, so they run without it; the oracle and ingest with
# it are tested in tests/e2e/test_runtime_oracle_vllm.py, which sets MODELYARD_VERIFY_RUNTIME=auto.
os.environ.setdefault("MODELYARD_VERIFY_RUNTIME", "none")

from modelyard.errors import code_of
from tests.fixtures import make_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SHARED_CASES = ROOT.parent / "shared" / "cases"

# the tiers (unit, integration, slow) and the suite's clock and budget
pytest_plugins = ["tests.suite_clock"]


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real `modelyard` CLI in a subprocess (as a user would). ``env`` adds to this process's
    environment; a key given as None is removed (e.g. ``PREFECT_API_URL=None``: the command starts its own
    private Prefect API instead of the session's server)."""
    e = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "modelyard", *args], capture_output=True, text=True, env=e,
                          timeout=timeout, cwd=ROOT)


#: the keys of every ``--json`` object, in order (modelyard.cli._common.ENVELOPE_KEYS, docs/reference/json.md)
ENVELOPE_KEYS = ["ok", "command", "exit_code", "result", "error"]


def json_envelope(stdout: str, command: str, exit_code: int = 0) -> dict:
    """The one JSON object a ``--json`` command printed on ``stdout`` (nothing else there), after checking
    the envelope: its keys in order, ``command``, ``exit_code``, ``ok`` (true exactly when ``exit_code``
    is 0) and ``error`` (null exactly then, else ``{type, message, fix, ...}``)."""
    env = json.loads(stdout)
    assert list(env) == ENVELOPE_KEYS, env
    assert (env["ok"], env["command"], env["exit_code"]) == (exit_code == 0, command, exit_code), env
    if exit_code == 0:
        assert env["error"] is None, env
    else:
        assert list(env["error"])[:4] == ["type", "code", "message", "fix"], env
        assert env["error"]["code"] == code_of(env["error"]["type"]), env
    return env


def json_result(stdout: str, command: str, exit_code: int = 0):
    """The ``result`` of a ``--json`` command's envelope (:func:`json_envelope` checks the envelope)."""
    return json_envelope(stdout, command, exit_code)["result"]


def json_error(stdout: str, command: str, exit_code: int) -> dict:
    """The ``error`` of a failed ``--json`` command's envelope (:func:`json_envelope` checks the envelope)."""
    return json_envelope(stdout, command, exit_code)["error"]


def generated_doc(path: Path, text: str) -> None:
    """Assert that the generated page ``path`` reads ``text`` (what its generator gives now);
    ``MODELYARD_UPDATE_GOLDEN=1`` rewrites it first (review the diff)."""
    if os.environ.get("MODELYARD_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.read_text() == text, f"{path.name} is stale: MODELYARD_UPDATE_GOLDEN=1 rewrites it"


def store_beside(demo_run, root: Path) -> Path:  # noqa: ANN001 - the demo_run fixture's (store, result)
    """A store of one's own at ``root`` holding a hard-linked copy of the demo artifact (same name and revision):
    the demo store is shared read-only by the session's tests, and a LoRA adapter must lie beside its base
    (``<store>/<base name>/<revision>``). Returns ``root``."""
    import shutil

    demo_home, out = demo_run
    base = Path(out["artifact"])
    shutil.copytree(base, root / base.relative_to(demo_home), symlinks=True, copy_function=os.link)
    return root


def store_artifacts(home: Path) -> list[Path]:
    """Every published artifact folder under ``home`` (name/revision with a manifest)."""
    return sorted(p.parent for p in home.glob("*/*/manifest.json"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    d = make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    for p in d.iterdir():
        p.chmod(0o444)
    return d


@pytest.fixture(scope="session")
def tiny_sharded_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-sharded") / "tiny-sharded", shards=2)


def load_json(p: Path):
    return json.loads(Path(p).read_text())


@pytest.fixture(scope="session")
def tiny128(tmp_path_factory) -> Path:
    """The tiny Llama with hidden 128 / intermediate 256, so that quantization groups of 128 fit."""
    d = make_tiny_llama(tmp_path_factory.mktemp("tiny128") / "tiny128", hidden=128, intermediate=256)
    for p in d.iterdir():
        p.chmod(0o444)
    return d


def built_once(tmp_path_factory, name: str, build):
    """``build(folder)`` run once per test run, also across pytest-xdist workers: the first worker to ask builds
    into ``<the run's base temp>/<name>`` under a file lock and pickles what ``build`` returned; the others wait
    for the lock and read it. Whoever uses the result only reads it (as one serial session shared it before).
    Without xdist the run's base temp is the session's own. A failed build is tried again by the next worker."""
    import pickle

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if done.is_file():
            return pickle.loads(done.read_bytes())
        folder = shared / name
        if folder.exists():  # a failed build's leftovers
            import shutil

            shutil.rmtree(folder)
        folder.mkdir()
        result = build(folder)
        done.write_bytes(pickle.dumps(result))
        return result


@pytest.fixture(scope="session")
def quantized(tiny128, tmp_path_factory):
    """Every quantization scheme applied once to ``tiny128`` (8 calibration samples of 64 tokens):
    scheme -> pipeline.quantize.QuantizeResult. Built once per run (:func:`built_once`)."""
    from modelyard.settings import Settings
    from modelyard.stages import quantize as q

    return built_once(tmp_path_factory, "quantized", lambda root: {
        s: q.quantize_model(tiny128, root / s, s, settings=Settings(), num_samples=8, max_seq_len=64) for s in q.SCHEMES})


@pytest.fixture(scope="session")
def legacy_quantized(tiny128, tmp_path_factory):
    """The legacy formats (gptq via gptqmodel, awq-gemm via autoawq), each made once from ``tiny128``
    in its own venv: scheme -> QuantizeResult. Built once per run (:func:`built_once`)."""
    from modelyard.settings import Settings
    from modelyard.stages import quantize as q

    return built_once(tmp_path_factory, "legacy", lambda root: {
        s: q.quantize_model(tiny128, root / s, s, settings=Settings(), num_samples=8, max_seq_len=64) for s in q.LEGACY_SCHEMES})


# --------------------------------------------------------------------------- two workers (pytest-xdist)

#: modules that share one session fixture too costly to build in both workers (a vLLM server), kept in one worker
GROUPS = {"vllm-server": ("test_bench_slo_vllm.py", "test_serve_smoke_vllm.py", "test_metrics_prometheus.py",
                          "test_proxy_nginx.py", "test_rollout_nginx.py")}

_MODULE_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope=["']module["']""")


@functools.cache
def work_unit(path: str) -> str | None:
    """The work unit of the tests in the module at ``path`` (relative to the root, as a node id starts), or None
    for a module whose tests go to whichever worker is free, one by one: the named group of :data:`GROUPS` its
    file is in, else the module itself when it defines a module-scoped fixture (built once, in one worker)."""
    name = path.rsplit("/", 1)[-1]
    group = next((g for g, files in GROUPS.items() if name in files), None)
    if group is None and _MODULE_FIXTURE.search((Path(__file__).parent.parent / path).read_text()):
        group = path
    return group


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 - xdist's Producer, Scheduling
    """Under ``--dist loadgroup``, xdist's own group scheduler with the units of :func:`work_unit`.

    xdist's ``xdist_group`` mark cannot be used: it renames the node id (``item._nodeid``), which pytest 9 no
    longer reads (``Node.nodeid`` comes from ``_id``), so every test stayed its own unit. The controller groups
    the collected ids here instead, from the file each id names."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid.split("::", 1)[0]) or nodeid

    return ByWorkUnit(config, log)


# --------------------------------------------------------------------------- one Prefect server per session

_SESSION_SERVER: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Start ONE Prefect server and ONE warm facts worker for the whole run, the product's own kept server
    (``modelyard server start``: modelyard.runtime.prefect_server.start), before any test module is imported,
    and hand them to every command through the environment: ``PREFECT_API_URL`` (so no ``ingest`` starts a
    private API server) and ``MODELYARD_FACTS_WORKER`` (so no ``verify`` imports transformers cold). In this
    process the worker is not asked (in-process tests patch the code it would run); it serves subprocesses.

    ``MODELYARD_TEST_SHARED_PREFECT=0`` leaves every command to start its own private API, as a user's
    first command does. Tests that check that path drop ``PREFECT_API_URL`` themselves and say why."""
    global _SESSION_SERVER
    if hasattr(config, "workerinput") and os.environ.get("MODELYARD_FACTS_WORKER"):
        from modelyard.checks import facts_worker

        facts_worker._dead.add(os.environ[facts_worker.ENV])  # a worker computes its own facts, as the controller
    if not os.environ.get("MODELYARD_VLLM_CACHE") and not hasattr(config, "workerinput"):
        # one vLLM cache for every runtime subprocess of the run (modelyard.runtime.venv.vllm_cache_root): the
        # first load inspects each model class, the others read it (each test's store is fresh, so the default,
        # <home>/.cache/vllm, would be cold every time)
        import tempfile

        os.environ["MODELYARD_VLLM_CACHE"] = tempfile.mkdtemp(prefix="modelyard-test-vllm-cache-")
    _start_engine_host(config)
    if os.environ.get("MODELYARD_TEST_SHARED_PREFECT", "1") == "0" or os.environ.get("PREFECT_API_URL") \
            or config.option.collectonly or hasattr(config, "workerinput"):
        return
    import tempfile

    from modelyard.checks import facts_worker
    from modelyard.runtime import prefect_server

    _SESSION_SERVER = Path(tempfile.mkdtemp(prefix="modelyard-test-prefect-"))
    st, _ = prefect_server.start(_SESSION_SERVER)
    os.environ["PREFECT_API_URL"] = st.api_url
    if st.facts_socket and not os.environ.get(facts_worker.ENV):
        os.environ[facts_worker.ENV] = st.facts_socket
        facts_worker._dead.add(st.facts_socket)  # this process computes its facts itself (docstring)


_ENGINE_HOST = None


def _start_engine_host(config: pytest.Config) -> None:
    """ONE warm vLLM engine host for the run (modelyard.runtime.engine_host): the runtime venv's interpreter with
    vLLM imported once; every load smoke, support measurement and runtime oracle of the runtime venv runs in a fork
    of it, a fresh process each, instead of importing vLLM again (7-10 s of CPU each on 2 cores). A run whose
    variables read at import differ (another thread count, an ISA cap) is refused by the host and starts cold.
    ``MODELYARD_ENGINE_HOST=off`` runs every one cold."""
    global _ENGINE_HOST
    if os.environ.get("MODELYARD_ENGINE_HOST") or config.option.collectonly or hasattr(config, "workerinput"):
        return
    import tempfile

    from modelyard.runtime import engine_host
    from modelyard.runtime.venv import runtime_env
    from modelyard.settings import Settings

    settings = Settings()
    python = settings.vllm_interpreter()
    if not python.exists():
        return
    tmp = tempfile.mkdtemp(prefix="modelyard-test-engine-")
    # the smoke's environment (modelyard.stages.smoke.smoke_load): the runtime's, compile off
    env = runtime_env(settings, tmp) | {"TORCH_COMPILE_DISABLE": "1"}
    proc, sock = engine_host.start(python, env, log=Path(tmp) / "engine-host.log")
    _ENGINE_HOST = (proc, Path(tmp), Path(sock).parent)
    os.environ["MODELYARD_ENGINE_HOST"] = sock


def engine_host_log() -> str:
    """What the session's engine host logged (its runs and refusals), or ""."""
    if _ENGINE_HOST is None:
        return ""
    try:
        return (_ENGINE_HOST[1] / "engine-host.log").read_text(errors="replace")
    except OSError:
        return ""


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's TerminalReporter
    log = engine_host_log()
    if log:
        runs = log.count("engine host: run ")
        refused = [line for line in log.splitlines() if line.startswith("engine host: refused")]
        terminalreporter.write_line(f"engine host: {runs} runs in forks of one warm vLLM interpreter, {len(refused)} "
                                    "refused (started cold)")
        for line in sorted(set(refused))[:10]:
            terminalreporter.write_line(f"  {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _SESSION_SERVER, _ENGINE_HOST
    if _ENGINE_HOST is not None:
        import shutil

        proc, tmp, sock_dir = _ENGINE_HOST
        from modelyard.runtime import engine_host

        engine_host.stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
        _ENGINE_HOST = None
    if _SESSION_SERVER is not None:
        import shutil

        from modelyard.runtime import prefect_server

        prefect_server.stop(_SESSION_SERVER)
        shutil.rmtree(_SESSION_SERVER, ignore_errors=True)
        _SESSION_SERVER = None

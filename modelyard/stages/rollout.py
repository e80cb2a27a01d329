"""rollout: shift traffic from the stable server to the canary in steps, behind the nginx front of
serve/'s canary form (:mod:`modelyard.stages.serve.canary`), and roll back when a step fails.

At each step (percent of requests to the canary, e.g. 10, 50, 100):

1. ``canary/upstream.conf`` gets the step's weights (temporary file + rename) and nginx reloads (the
   ``reload`` command, default ``docker compose exec -T nginx nginx -s reload`` run in serve/);
2. the front answers one request (the model name the clients use), so the reload did not break it;
3. the canary is judged directly (its own URL) by the server smoke
   (:func:`~modelyard.stages.smoke.server.smoke_server`): API checks, stop, golden prompts, the
   numerical gate (vLLM's prompt_logprobs against transformers on the canary's model) and the bench load
   judged against the SLO targets;
4. the step **bakes** for ``bake`` seconds under the front's real traffic (:mod:`modelyard.stages.bake`): every
   ``poll`` seconds the canary's ``/health`` must answer, and its own series (from ``/metrics``, the series the
   canary form's Prometheus scrapes) must show no more 5xx answers than the ``error_rate`` target allows (0 by
   default) among the API requests it served meanwhile, and latency quantiles of those requests within the
   latency targets given.

Any failure of a step, whatever its kind (a gate or SLO miss, an exception such as a canary that stops
answering mid-step, a step that runs past ``step_timeout`` seconds, SIGTERM or Ctrl-C), sets the weights back
to 0 % canary (all traffic to the stable server), reloads, records why, and only then ends the rollout as
rolled back (exit 1). Clients are spared meanwhile by the canary form's nginx, which sends a request the
canary fails to the stable server (:data:`~modelyard.stages.serve.canary.RETRY_LINES`).

The state is ``canary/rollout.json``, written (temporary file + rename) at every transition: ``started`` →
``stepping`` → ``baking`` → ``in progress`` (a step passed) … → ``done``, or ``rolling back`` →
``rolled back``. It names the servers and the reload command, so a rollout killed outright (SIGKILL, a
crash) can be continued from the last step that passed (``resume``) or rolled back from the file alone
(:func:`rollback`); a new rollout refuses to start over an unfinished one.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelyard.errors import InvalidTargetError, RolloutError
from modelyard.model.modes import DEFAULT_SERVE, check_mode, default_prompt
from modelyard.settings import Settings
from modelyard.stages.bake import POLL_SECONDS, BakeVerdict, bake
from modelyard.stages.serve.canary import CANARY_SERVER, STABLE_SERVER, UPSTREAM_FILE, upstream_conf
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke.bench import BenchSpec
from modelyard.stages.smoke.golden import load_golden

DEFAULT_RELOAD = "docker compose exec -T nginx nginx -s reload"
HISTORY_FILE = "rollout.json"
#: states of rollout.json after which a new rollout may start
FINISHED = ("done", "rolled back")
#: seconds a step may take, front check, smoke and bake together, before it fails (and is rolled back)
STEP_TIMEOUT = 1800.0
RELOAD_TIMEOUT = 60.0  # seconds
#: seconds after a reload before the front is asked: nginx's old workers finish and new ones start
SETTLE_SECONDS = 2.0


@dataclass(frozen=True)
class RolloutStep:
    """One step: ``percent`` to the canary; ``passed``; ``failed`` (the checks, golden prompts and SLO
    targets that failed); the canary's ``smoke`` result (:meth:`ServerSmokeResult.to_dict`) and the
    front's answer status; ``seconds`` the step took."""

    percent: int
    passed: bool
    failed: tuple[str, ...]
    front_status: int | None
    smoke: dict[str, Any] | None
    seconds: float
    bake: BakeVerdict | None = None


@dataclass(frozen=True)
class RolloutResult:
    """``passed`` when every step passed (the canary then takes ``percent`` = the last step);
    ``rolled_back`` when a step failed and traffic went back to the stable server (``percent`` 0);
    ``reason`` names the failed step and what failed in it."""

    passed: bool
    percent: int
    rolled_back: bool
    steps: tuple[RolloutStep, ...]
    reason: str | None = None
    history: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def set_weights(canary_dir: Path, percent: int, *, reload: str, cwd: Path, stable: str = STABLE_SERVER,
                canary: str = CANARY_SERVER, timeout: float = RELOAD_TIMEOUT) -> None:
    """Write ``canary_dir/upstream.conf`` for ``percent`` (0..100) to the canary and run ``reload``
    (a shell-style command line, split with :func:`shlex.split`, run in ``cwd``). Raises
    :class:`RolloutError` when the command is missing, fails or exceeds ``timeout`` seconds; the file
    is then already written (the next reload picks it up)."""
    dest = canary_dir / UPSTREAM_FILE
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(upstream_conf(percent, stable=stable, canary=canary), encoding="utf-8")
    tmp.replace(dest)
    try:
        r = subprocess.run(shlex.split(reload), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise RolloutError(f"the reload command {reload!r} was not found: {exc.strerror}",
                           fix="Pass --reload with the command that reloads nginx (e.g. `nginx -s reload`).") from None
    except subprocess.TimeoutExpired:
        raise RolloutError(f"the reload command {reload!r} did not finish within {timeout:.0f} s",
                           fix="Check that nginx runs; pass --reload with the command that reloads it.") from None
    if r.returncode != 0:
        raise RolloutError(f"the reload command {reload!r} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}",
                           fix="Fix nginx (`nginx -t` names the error) or pass --reload with the right command.")


def ask_front(front: str, name: str, mode: str, api_key: str | None, timeout: float = 120.0) -> int | None:
    """POST one short greedy request for ``name`` through the front at ``front``; its HTTP status
    (None when it could not connect)."""
    path, body = (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say OK."}]}) if mode == "chat"
                  else ("/v1/completions", {"prompt": "OK"}))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.post(front.rstrip("/") + path, json={"model": name, "max_tokens": 4, "temperature": 0, **body},
                       headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return None
    return r.status_code


def _write_history(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_history(serve_dir: Path) -> dict[str, Any] | None:
    """``serve_dir/canary/rollout.json`` as a mapping, or None when there is none. Raises
    :class:`RolloutError` (exit 2) when it is not a JSON object with a ``status``."""
    path = Path(serve_dir) / "canary" / HISTORY_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RolloutError(f"{path} is not JSON ({exc})", fix=f"Remove {path} once nginx's weights are what you want.") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        raise RolloutError(f"{path} has no status", fix=f"Remove {path} once nginx's weights are what you want.")
    return doc


class _Interrupted(BaseException):
    """SIGTERM arrived while a rollout was in a step (raised in the main thread by the handler)."""


def _why(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {msg}"[:500]


def _in_thread(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` on a daemon thread, waited for at most ``timeout`` seconds (:class:`TimeoutError` past it; the
    thread is left to end on its own timeouts). What ``fn`` raises is raised here. The wait is interruptible, so
    SIGTERM and Ctrl-C reach the caller at once."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="modelyard-rollout-step", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"the step did not finish within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def rollout(canary_model: Path, serve_dir: Path, settings: Settings, *, steps: Sequence[int], canary_url: str,  # noqa: PLR0913, C901
            front_url: str, reload: str = DEFAULT_RELOAD, stable_server: str = STABLE_SERVER,
            canary_server: str = CANARY_SERVER, slo: dict[str, float] | None = None, slo_class: str | None = None,
            bench: BenchSpec | None = None, mode: str = DEFAULT_SERVE, max_model_len: int = 2048,
            bake_seconds: float = 0.0, poll: float = POLL_SECONDS, step_timeout: float = STEP_TIMEOUT,
            resume: bool = False, on_step: Callable[[RolloutStep], None] | None = None) -> RolloutResult:
    """Roll ``canary_model`` (the canary artifact's model/ folder, what its server at ``canary_url``
    serves) out behind the front at ``front_url`` in ``steps`` (percentages, increasing), as this
    module's docstring says. ``serve_dir`` is the canary form of serve/ (``vllm.yaml``,
    ``vllm-canary.yaml``, ``canary/``). ``slo``/``slo_class``/``bench``: the bench level's targets and
    load (default :class:`BenchSpec`); ``slo`` also judges the bake (its 5xx share and latency targets).
    ``bake_seconds``: how long each step bakes (0: a single look), ``poll`` seconds apart; ``step_timeout``:
    seconds a step may take. ``resume``: continue the unfinished rollout of ``rollout.json`` from the step
    after the last that passed. ``MODELYARD_API_KEY`` (``settings.api_key``) is sent to the front.

    Returns a :class:`RolloutResult`; raises :class:`InvalidTargetError` (exit 2) when ``serve_dir`` is
    not a canary form, :class:`RolloutError` (exit 2) when nginx cannot be reloaded (after trying to
    restore 0 %), when an unfinished rollout is on record and ``resume`` is not given, or when ``resume`` is
    given with nothing to resume."""
    check_mode(mode)
    serve_dir = Path(serve_dir)
    canary_dir = serve_dir / "canary"
    cfg_file = serve_dir / "vllm-canary.yaml"
    if not cfg_file.is_file() or not canary_dir.is_dir():
        raise InvalidTargetError(f"{serve_dir} is not the canary form of serve/ (no vllm-canary.yaml and canary/)",
                                 fix="Write it with `modelyard serve-plan STABLE --proxy --canary CANARY -o DIR`.")
    config = yaml.safe_load(cfg_file.read_text())
    name = config["served-model-name"]
    history_path = canary_dir / HISTORY_FILE
    before = read_history(serve_dir)
    earlier: list[dict[str, Any]] = []
    if resume:
        if before is None or before["status"] in FINISHED:
            raise RolloutError(f"{history_path}: no unfinished rollout to resume"
                               + (f" (it says {before['status']!r})" if before else ""),
                               fix="Start the rollout without --resume.")
        if before.get("canary") != str(canary_model):
            raise RolloutError(f"{history_path}: the unfinished rollout is of {before.get('canary')}, not {canary_model}",
                               fix="Resume it with its own canary, or roll it back with --rollback first.")
        earlier = [s for s in before.get("steps") or [] if isinstance(s, dict)]
        reached = max((int(s["percent"]) for s in earlier if s.get("passed")), default=0)
        steps = [p for p in steps if p > reached]
        if not steps:
            raise RolloutError(f"{history_path}: the rollout already passed {reached} %, the last of --steps",
                               fix="Pass --steps with a larger last step, or start a new rollout.")
    elif before is not None and before["status"] not in FINISHED:
        raise RolloutError(f"{history_path}: a rollout of {before.get('canary')} did not finish: it says "
                           f"{before['status']!r} at {before.get('percent')} %; nothing was changed",
                           fix="Pass --resume to continue it from the last step that passed, or --rollback to send "
                               "all traffic to the stable server.")
    prompts, src = load_golden(None, mode)
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    done: list[RolloutStep] = []
    plan = {"canary": str(canary_model), "steps_planned": list(steps), "stable_server": stable_server,
            "canary_server": canary_server, "reload": reload}

    def record(percent: int, status: str, reason: str | None = None) -> None:
        _write_history(history_path, {**plan, "percent": percent, "status": status, "reason": reason,
                                      "steps": [*earlier, *(asdict(s) for s in done)]})

    def weights(percent: int) -> None:
        set_weights(canary_dir, percent, reload=reload, cwd=serve_dir, stable=stable_server, canary=canary_server)
        time.sleep(SETTLE_SECONDS)

    ended = threading.Event()  # set once a step failed: a timed-out step's thread may not write the state after
    main = threading.current_thread() is threading.main_thread()

    def back(reason: str, percent: int) -> RolloutResult:
        ended.set()
        if main:  # a second SIGTERM does not stop the rollback half-way
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        record(percent, "rolling back", reason)
        _restore(weights)
        record(0, "rolled back", reason)
        return RolloutResult(False, 0, True, tuple(done), reason, str(history_path))

    def judge(percent: int, phase: list[str]) -> tuple[int | None, dict[str, Any], list[str], BakeVerdict | None]:
        phase[0] = "the front check"
        front = ask_front(front_url, name, mode, api_key)
        failed = [] if front == 200 else [f"front answered {front}" if front else "front unreachable"]
        phase[0] = "the canary's smoke"
        smoke = serve_smoke.smoke_server(canary_model, settings, config=config, question=default_prompt(mode),
                                         max_tokens=32, golden=prompts, golden_source=src, bench=bench or BenchSpec(),
                                         max_model_len=max_model_len, mode=mode, url=canary_url, slo=slo or {},
                                         slo_class=slo_class)
        if not smoke.passed:
            failed += (smoke.error or "failed").removeprefix("failed: ").split(", ")
        verdict = None
        if not failed:
            phase[0] = "the bake"
            if ended.is_set():
                return front, smoke.to_dict(), ["ended"], None
            record(percent, "baking")
            verdict = bake(canary_url, bake_seconds, slo=slo or {}, poll=poll)
            failed += verdict.failed
        return front, smoke.to_dict(), failed, verdict

    def on_sigterm(signum: int, frame: Any) -> None:  # noqa: ANN401
        raise _Interrupted

    old_handler = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    at = 0  # the weights nginx was last given
    try:
        record(0, "started")
        for percent in steps:
            at = percent
            t0 = time.perf_counter()
            phase = ["the nginx reload"]
            try:
                record(percent, "stepping")
                weights(percent)
                front, smoke, failed, verdict = _in_thread(partial(judge, percent, phase), step_timeout)
            except RolloutError as exc:
                if phase[0] == "the nginx reload":
                    record(0, "rolling back", f"nginx reload failed at {percent} %: {exc.message}")
                    _restore(weights)
                    record(0, "rolled back", f"nginx reload failed at {percent} %: {exc.message}")
                    raise
                front, smoke, failed, verdict = None, None, [f"{phase[0]} raised {_why(exc)}"], None
            except TimeoutError as exc:
                front, smoke, failed, verdict = None, None, [f"{exc} (in {phase[0]})"], None
            except (_Interrupted, KeyboardInterrupt) as exc:
                why = "SIGTERM" if isinstance(exc, _Interrupted) else "Ctrl-C"
                step = RolloutStep(percent, False, (f"interrupted by {why}",), None, None,
                                   round(time.perf_counter() - t0, 2))
                done.append(step)
                return back(f"step {percent} % interrupted by {why} (in {phase[0]})", percent)
            except Exception as exc:  # noqa: BLE001 - any failure of a step rolls back (the reason records it)
                front, smoke, failed, verdict = None, None, [f"{phase[0]} raised {_why(exc)}"], None
            step = RolloutStep(percent, not failed, tuple(failed), front, smoke, round(time.perf_counter() - t0, 2),
                               verdict)
            done.append(step)
            if on_step is not None:
                on_step(step)
            if failed:
                return back(f"step {percent} % failed: {', '.join(failed)}", percent)
            record(percent, "in progress" if percent != steps[-1] else "done")
        return RolloutResult(True, steps[-1], False, tuple(done), None, str(history_path))
    except (_Interrupted, KeyboardInterrupt) as exc:  # between two steps (within one, the step's own handler)
        return back(f"interrupted by {'SIGTERM' if isinstance(exc, _Interrupted) else 'Ctrl-C'} at {at} %", at)
    finally:
        if main:
            signal.signal(signal.SIGTERM, old_handler)


def rollback(serve_dir: Path, *, reload: str | None = None) -> RolloutResult:
    """Send all traffic back to the stable server from ``serve_dir/canary/rollout.json`` alone (the servers and
    the reload command it names; ``reload`` overrides the latter): for a rollout that was killed outright, or
    one an operator stops. Records ``rolled back`` with the state it was in. Raises :class:`RolloutError`
    (exit 2) when there is no rollout on record or nginx cannot be reloaded."""
    serve_dir = Path(serve_dir)
    before = read_history(serve_dir)
    path = serve_dir / "canary" / HISTORY_FILE
    if before is None:
        raise RolloutError(f"{path} does not exist: no rollout is on record there",
                           fix="Pass --serve the canary form of serve/ the rollout ran in.")
    cmd = reload or before.get("reload") or DEFAULT_RELOAD
    stable, canary = before.get("stable_server") or STABLE_SERVER, before.get("canary_server") or CANARY_SERVER
    reason = f"rolled back by the operator from {before['status']!r} at {before.get('percent')} %"
    _write_history(path, {**before, "status": "rolling back", "reason": reason})
    _restore(lambda p: set_weights(serve_dir / "canary", p, reload=cmd, cwd=serve_dir, stable=stable, canary=canary))
    _write_history(path, {**before, "percent": 0, "status": "rolled back", "reason": reason})
    return RolloutResult(False, 0, True, (), reason, str(path))


def _restore(weights: Callable[[int], None]) -> None:
    """Send all traffic back to the stable server. A reload that fails here is raised as a
    :class:`RolloutError` saying so: the file already says 0 %, nginx has not read it, the operator
    must reload it (the history says "rolling back")."""
    try:
        weights(0)
    except RolloutError as exc:
        raise RolloutError(f"rolling back: upstream.conf says 0 % canary but nginx was not reloaded: {exc.message}",
                           fix="Reload nginx by hand (`nginx -s reload`, or `docker compose exec nginx nginx -s "
                               "reload`) to send all traffic to the stable server.") from None

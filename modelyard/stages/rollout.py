"""rollout: shift traffic from the stable server to the canary in steps, behind the nginx front of
serve/'s canary form (:mod:`modelyard.stages.serve.canary`), and roll back when a step fails.

At each step (percent of requests to the canary, e.g. 10, 50, 100):

1. ``canary/upstream.conf`` gets the step's weights (temporary file + rename) and nginx reloads (the
   ``reload`` command, default ``docker compose exec -T nginx nginx -s reload`` run in serve/);
2. the front answers one request (the model name the clients use), so the reload did not break it;
3. the canary is judged directly (its own URL) by the server smoke
   (:func:`~modelyard.stages.smoke.server.smoke_server`): API checks, stop, golden prompts, the
   numerical gate (vLLM's prompt_logprobs against transformers on the canary's model) and the bench load
   judged against the SLO targets. The canary then carries the step's share of the front's traffic plus
   the bench's, so a latency target is judged under more load than the step alone puts on it.

A step that fails any of these sets the weights back to 0 % canary (all traffic to the stable server),
reloads, and ends the rollout as rolled back (exit 1). The history is kept in ``canary/rollout.json``
after every step (temporary file + rename), so a killed rollout leaves the last weights and what was
judged on record.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelyard.errors import InvalidTargetError, RolloutError
from modelyard.model.modes import DEFAULT_SERVE, check_mode, default_prompt
from modelyard.settings import Settings
from modelyard.stages.serve.canary import CANARY_SERVER, STABLE_SERVER, UPSTREAM_FILE, upstream_conf
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke.bench import BenchSpec
from modelyard.stages.smoke.golden import load_golden

DEFAULT_RELOAD = "docker compose exec -T nginx nginx -s reload"
HISTORY_FILE = "rollout.json"
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


def rollout(canary_model: Path, serve_dir: Path, settings: Settings, *, steps: Sequence[int], canary_url: str,  # noqa: PLR0913
            front_url: str, reload: str = DEFAULT_RELOAD, stable_server: str = STABLE_SERVER,
            canary_server: str = CANARY_SERVER, slo: dict[str, float] | None = None, slo_class: str | None = None,
            bench: BenchSpec | None = None, mode: str = DEFAULT_SERVE, max_model_len: int = 2048,
            on_step: Callable[[RolloutStep], None] | None = None) -> RolloutResult:
    """Roll ``canary_model`` (the canary artifact's model/ folder, what its server at ``canary_url``
    serves) out behind the front at ``front_url`` in ``steps`` (percentages, increasing), as this
    module's docstring says. ``serve_dir`` is the canary form of serve/ (``vllm.yaml``,
    ``vllm-canary.yaml``, ``canary/``). ``slo``/``slo_class``/``bench``: the bench level's targets and
    load (default :class:`BenchSpec`). ``MODELYARD_API_KEY`` (``settings.api_key``) is sent to the front.

    Returns a :class:`RolloutResult`; raises :class:`InvalidTargetError` (exit 2) when ``serve_dir`` is
    not a canary form, :class:`RolloutError` (exit 2) when nginx cannot be reloaded (after trying to
    restore 0 %)."""
    check_mode(mode)
    serve_dir = Path(serve_dir)
    canary_dir = serve_dir / "canary"
    cfg_file = serve_dir / "vllm-canary.yaml"
    if not cfg_file.is_file() or not canary_dir.is_dir():
        raise InvalidTargetError(f"{serve_dir} is not the canary form of serve/ (no vllm-canary.yaml and canary/)",
                                 fix="Write it with `modelyard serve-plan STABLE --proxy --canary CANARY -o DIR`.")
    config = yaml.safe_load(cfg_file.read_text())
    name = config["served-model-name"]
    prompts, src = load_golden(None, mode)
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    history_path = canary_dir / HISTORY_FILE
    done: list[RolloutStep] = []

    def record(percent: int, status: str, reason: str | None = None) -> None:
        _write_history(history_path, {"canary": str(canary_model), "percent": percent, "status": status,
                                      "reason": reason, "steps": [asdict(s) for s in done]})

    def weights(percent: int) -> None:
        set_weights(canary_dir, percent, reload=reload, cwd=serve_dir, stable=stable_server, canary=canary_server)
        time.sleep(SETTLE_SECONDS)

    record(0, "started")
    for percent in steps:
        t0 = time.perf_counter()
        try:
            weights(percent)
        except RolloutError as exc:
            record(0, "rolling back", f"nginx reload failed at {percent} %: {exc.message}")
            _restore(weights)
            record(0, "rolled back", f"nginx reload failed at {percent} %: {exc.message}")
            raise
        front = ask_front(front_url, name, mode, api_key)
        failed: list[str] = [] if front == 200 else [f"front answered {front}" if front else "front unreachable"]
        smoke = serve_smoke.smoke_server(canary_model, settings, config=config, question=default_prompt(mode),
                                         max_tokens=32, golden=prompts, golden_source=src, bench=bench or BenchSpec(),
                                         max_model_len=max_model_len, mode=mode, url=canary_url, slo=slo or {},
                                         slo_class=slo_class)
        if not smoke.passed:
            failed += (smoke.error or "failed").removeprefix("failed: ").split(", ")
        step = RolloutStep(percent, not failed, tuple(failed), front, smoke.to_dict(),
                           round(time.perf_counter() - t0, 2))
        done.append(step)
        if on_step is not None:
            on_step(step)
        if failed:
            reason = f"step {percent} % failed: {', '.join(failed)}"
            record(percent, "rolling back", reason)
            _restore(weights)
            record(0, "rolled back", reason)
            return RolloutResult(False, 0, True, tuple(done), reason, str(history_path))
        record(percent, "in progress" if percent != steps[-1] else "done")
    return RolloutResult(True, steps[-1], False, tuple(done), None, str(history_path))


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


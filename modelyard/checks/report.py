"""Report: findings plus the target they were judged against, as JSON and Markdown.

JSON schema (``schema_version`` "1"; the JSON Schema ``modelyard/artifact/report.schema.json`` is generated
from the record that reads it back, ``modelyard.artifact.report_record.ReportRecord``):
``{schema_version, tool, target, summary{errors,warnings,infos, passed},
findings[{code,severity,message,file,field,value,fix,source[,limit]}], smoke|null[, quantization][, source]
[, artifact]}``.
``smoke`` is the vLLM smoke-load result when one ran (see ``modelyard.stages.smoke.SmokeResult``); ``source`` is
where a stored artifact's checkpoint came from (the manifest's ``source`` record, written here too so that the
artifact's signature covers it: ``manifest.json`` itself is not signed), and ``artifact`` its identity claims (name,
revision, kind, content digest, a LoRA's base, tool versions) for the same reason. Additive changes keep the
version; removing or retyping a key bumps it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from modelyard.checks import adapter_numeric
from modelyard.checks.base import Finding, Severity, Target
from modelyard.text import printable
from modelyard.version import __version__

SCHEMA_VERSION = "1"


def replaced_files(source: dict[str, Any] | None) -> list[dict[str, str]]:
    """The files of an artifact that modelyard wrote instead of the source's, read from the manifest's ``source``
    record: ``[{file, by, why, evidence}]``. Today one kind: a GGUF import's ``tokenizer.json`` rebuilt from the
    GGUF's own ``tokenizer.ggml.*`` arrays because the tokenizer transformers converted read text otherwise than
    the GGUF does (its ``tokenizer_check`` record, :mod:`modelyard.stages.fetch.gguf`)."""
    check = (source or {}).get("tokenizer_check") or {}
    if not check.get("repaired"):
        return []
    why = "; ".join(f"{f.get('code')}: {f.get('message')}" for f in check.get("findings") or [])
    left = check.get("after") or []
    evidence = (f"after the rebuild it reads the {check.get('checked')} probe texts as {check.get('reference')} does"
                if not left else f"{len(left)} disagreement(s) remain after the rebuild")
    return [{"file": "tokenizer.json", "by": "rebuilt from the GGUF's tokenizer.ggml.* arrays", "why": why,
             "evidence": evidence}]


def not_judged_line(n: int) -> str:
    """``"1 check not judged here"`` / ``"N checks not judged here"``: the verdict's note of the findings of
    severity ``not_judged`` (:class:`~modelyard.checks.base.Severity`)."""
    return f"{counted(n, 'check')} not judged here"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 error``, ``2 errors``, ``0 warnings`` (every verdict
    line modelyard prints counts this way)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    target: Target = field(default_factory=Target)
    smoke: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None  # pipeline.quantize.QuantizeResult.record() without the recipe text
    source: dict[str, Any] | None = None  # the manifest's source record, for an ingested artifact
    artifact: dict[str, Any] | None = None  # the manifest's identity claims (Manifest.claims()), for a stored artifact

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == Severity.ERROR)

    @property
    def passed(self) -> bool:
        return not self.errors

    def with_smoke(self, smoke: dict[str, Any]) -> Report:
        return replace(self, smoke=smoke)

    def with_quantization(self, record: dict[str, Any]) -> Report:
        return replace(self, quantization=record)

    def with_source(self, source: dict[str, Any]) -> Report:
        """This report naming the checkpoint's origin (the manifest's ``source`` record: uri, kind, repo_id,
        revision, commit, provenance), so that a signature over ``report.json`` covers it."""
        return replace(self, source=source)

    def with_artifact(self, claims: dict[str, Any]) -> Report:
        """This report carrying the stored artifact's identity claims (``name``, ``revision``, ``kind``,
        ``content_digest``, a LoRA's ``base``, ``tools``: :meth:`modelyard.artifact.manifest.Manifest.claims`), so
        that a signature over ``report.json`` covers what ``manifest.json`` says of them."""
        return replace(self, artifact=claims)

    def with_left_out(self, paths: tuple[str, ...] | list[str]) -> Report:
        """This report plus one ``files.left_out`` info finding per path of ``paths``: a file of the source
        that ``model/`` does not hold, because no runtime reads it (a trainer_state.json, eval results, a
        README) or the fetch patterns excluded it (the rule: ``stages.fetch.RUNTIME_FILE_PATTERNS``)."""
        return replace(self, findings=self.findings + tuple(
            Finding("files.left_out", Severity.INFO, "not read by vLLM or transformers: left out of model/", file=p,
                    source="the loaders' file names (modelyard/stages/fetch RUNTIME_FILE_PATTERNS)")
            for p in paths))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "modelyard", "version": __version__},
            "target": self.target.to_dict(),
            "summary": {
                "errors": self.count(Severity.ERROR),
                "warnings": self.count(Severity.WARNING),
                "infos": self.count(Severity.INFO),
                "not_judged": self.count(Severity.NOT_JUDGED),
                "passed": self.passed,
            },
            "findings": [f.to_dict() for f in self.findings],
            "smoke": self.smoke,
            **({"quantization": self.quantization} if self.quantization else {}),
            **({"source": self.source} if self.source is not None else {}),
            **({"artifact": self.artifact} if self.artifact is not None else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str) + "\n"

    def to_markdown(self, title: str = "modelyard verification report") -> str:
        t = self.target
        lines = [f"# {title}", ""]
        unjudged = [f for f in self.findings if f.severity == Severity.NOT_JUDGED]
        lines.append(f"**Verdict:** {'PASS' if self.passed else 'FAIL'} "
                     f"({counted(self.count(Severity.ERROR), 'error')}, {counted(self.count(Severity.WARNING), 'warning')}"
                     + (f"; {not_judged_line(len(unjudged))}" if unjudged else "") + ")")
        lines.append("")
        lines.append(f"Target: tensor_parallel_size={t.tensor_parallel_size}, max_model_len={t.max_model_len or 'derived'}, "
                     f"dtype={t.dtype or 'auto'}, serve={t.serve or 'any'}, vllm={t.vllm_version or 'any'}"
                     + (f", transformers={t.transformers_version}" if t.transformers_version else "")
                     + (f", gpu_cc={t.gpu_cc}" if t.gpu_cc else ""))
        lines.append("")
        judged = [f for f in self.findings if f.severity != Severity.NOT_JUDGED]
        if judged:
            lines += ["| severity | code | where | message | fix | source |", "|---|---|---|---|---|---|"]
            for f in judged:
                where = " ".join(x for x in (f.file, f"`{f.field}`" if f.field else None) if x)
                cells = [f.severity.value, f"`{f.code}`", where, f.message, f.fix or "", f.source or ""]
                lines.append("| " + " | ".join(printable(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        else:
            lines.append("No findings.")
        if unjudged:
            lines += ["", "## Not judged here", "",
                      "What this host's runtime could not decide (neither a pass nor a defect; `--require-judged` makes "
                      "each an error):", ""]
            lines += [f"- `{f.code}`: {printable(f.message)}" + (f" Fix: {printable(f.fix)}" if f.fix else "")
                      for f in unjudged]
        replaced = replaced_files(self.source)
        if replaced:
            lines += ["", "## Files written instead of the source's", ""]
            lines += [f"- `{r['file']}` {r['by']}: {printable(r['evidence'])}. Why: {printable(r['why'])[:600]}"
                      for r in replaced]
        q = self.quantization
        if q:
            lines += ["", "## Quantization", ""]
            lines.append(f"- scheme `{q['scheme']}` with {q['backend']}, recipe sha256 `{q['recipe']['sha256'][:16]}`"
                         + (f" ({'; '.join(q['recipe']['adjustments'])})" if q['recipe'].get('adjustments') else ""))
            c = q["calibration"]
            lines.append(f"- calibration: {c['samples']} samples of at most {c['max_seq_len']} tokens, sha256 "
                         f"`{c['sha256'][:16]}`" + ("" if c.get("used") else " (not used by this scheme)"))
            qual = q.get("quality")
            if qual:
                lines += ["", "| | parent | quantized | ratio | limit |", "|---|---|---|---|---|",
                          f"| perplexity (held-out, {qual['tokens']} tokens) | {qual['ppl_parent']} | "
                          f"{qual['ppl_quantized']} | {qual['ppl_ratio']} | {qual['max_ppl_ratio']} |",
                          f"| mean KL(parent ‖ quantized), nats/token | | {qual['kl_mean']} | | {qual['max_kl']} |",
                          "", f"- quality gate: {'passed' if qual['passed'] else 'FAILED'}"]
        if self.smoke and self.smoke.get("level") in ("server", "bench"):
            lines += _server_smoke_md(self.smoke)
        elif self.smoke:
            s = self.smoke
            lines += ["", "## vLLM smoke load", ""]
            lines.append(f"- vLLM {s.get('vllm_version')}, load {s.get('load_seconds')} s, "
                         f"{s.get('tokens_per_second')} tokens/s, max_model_len {s.get('max_model_len')}")
            lines.append(f"- question: {s.get('question')}")
            lines.append(f"- answer: {s.get('text')!r}")
            lines.append(f"- finish_reason: `{s.get('finish_reason')}` ({s.get('completion_tokens')} tokens)")
            lines.append(f"- passed: {s.get('passed')}")
        if self.smoke and self.smoke.get("numeric"):
            lines += numeric_md(self.smoke["numeric"], self.smoke.get("findings") or ())
        return "\n".join(lines) + "\n"


def numeric_md(n: dict[str, Any], findings: Any = ()) -> list[str]:
    """The Markdown of the numerical gate (``checks.numeric.NumericVerdict.to_dict()``, or a LoRA adapter's
    :func:`modelyard.checks.adapter_numeric.judge_adapter` record) and its findings."""
    if n.get("kind") == "adapter":
        return adapter_numeric.markdown(n) + [f"- `{f['code']}` ({f['severity']}): {f['message']}" for f in findings
                                              if f.get("severity") != "info"]
    lim = n.get("limits") or {}
    ref = f"against {n['reference']}" if n.get("compared") else f"not compared: {n.get('not_compared')}"
    lines = ["", f"### Numerical gate ({ref}): {'passed' if n.get('passed') else 'FAILED'}", "",
             f"- agreement over every text: mean KL {n.get('kl_mean')} nats/token (limit {lim.get('kl_max')}), top-1 "
             f"{n.get('top1')} (limit {lim.get('top1_min')}), worst perplexity ratio {n.get('ppl_ratio_worst')} "
             f"(limit {lim.get('ppl_ratio_max')})",
             f"- English prose perplexity {n.get('prose_ppl')} (bound {n.get('ppl_bound')}); every text's perplexity "
             "against its own bound"
             + ("" if n.get("bound_judged") else f": not judged, {n.get('bound_not_judged')}"), "",
             "| text | tokens | perplexity vLLM | bound | perplexity reference | ratio | KL | top-1 | greedy continuation |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {t['name']} | {t['tokens']} | {t['ppl_vllm']} | {t.get('ppl_bound')} | {t.get('ppl_reference')} | "
              f"{t.get('ppl_ratio')} | "
              f"{t.get('kl_mean')} | {t.get('top1')} | {(t.get('continuation') or '')[:60]!r} |".replace("|'", "\\|'")
              for t in n.get("texts") or []]
    par = n.get("parent")
    if par and par.get("compared"):
        plim = par.get("limits") or {}
        lines += ["", f"Against the parent checkpoint ({par.get('reference')}): mean KL {par.get('kl_mean')} "
                      f"(limit {plim.get('kl_max')}), top-1 {par.get('top1')} (limit {plim.get('top1_min')}), perplexity "
                      f"ratio x{par.get('ppl_ratio_mean')}, worst x{par.get('ppl_ratio_worst')} (limit "
                      f"{plim.get('ppl_ratio_max')})", "", "| text | KL | top-1 | perplexity ratio |", "|---|---|---|---|"]
        lines += [f"| {t['name']} | {t['kl_mean']} | {t['top1']} | {t['ppl_ratio']} |" for t in par.get("texts") or []]
    elif par:
        lines += ["", f"Against the parent checkpoint: not compared, {par.get('not_compared')}"]
    lines += [f"- `{f['code']}` ({f['severity']}): {f['message']}" for f in findings if f.get("severity") != "info"]
    return lines


def _server_smoke_md(s: dict[str, Any]) -> list[str]:
    """The Markdown of a ``server``/``bench`` smoke result (pipeline.serve_smoke.ServerSmokeResult)."""
    lines = ["", f"## vLLM OpenAI server smoke ({s.get('level')})", "",
             f"- vLLM {s.get('vllm_version')}, served as `{s.get('served_model_name')}`, /health after "
             f"{s.get('startup_seconds')} s; passed: {s.get('passed')}",
             f"- question: {s.get('question')}", f"- answer: {s.get('text')!r} (`{s.get('finish_reason')}`, "
             f"{s.get('completion_tokens')} tokens)", "", "| check | passed | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['passed']} | {c['detail']} |" for c in s.get("checks") or []]
    if s.get("golden"):
        lines += ["", f"Golden prompts ({s.get('golden_source')}):", "", "| prompt | passed | missing | answer |",
                  "|---|---|---|---|"]
        lines += [f"| {g['name']} | {g['passed']} | {', '.join(g['missing']) or '-'} | {g['answer'][:80]!r} |"
                  for g in s["golden"]]
    b = s.get("bench")
    if b:
        sp = b.get("spec") or {}
        lines += ["", f"Load ({b.get('client')}): {sp.get('num_prompts')} requests, {sp.get('max_concurrency')} "
                      f"concurrent, {sp.get('input_len')} input / {sp.get('output_len')} output tokens", "",
                  "| completed | failed | TTFT p50 / p95 / p99 (ms) | ITL p50 / p95 / p99 (ms) | output tokens/s |",
                  "|---|---|---|---|---|",
                  f"| {b.get('completed')} | {b.get('failed')} | {b.get('p50_ttft_ms')} / {b.get('p95_ttft_ms')} / "
                  f"{b.get('p99_ttft_ms')} | {b.get('p50_itl_ms')} / {b.get('p95_itl_ms')} / {b.get('p99_itl_ms')} | "
                  f"{b.get('output_throughput')} |"]
        slo = b.get("slo")
        if slo:
            lines += ["", f"Service-level targets (class {slo.get('class')}): "
                          f"{'met' if slo.get('passed') else 'MISSED'}", "",
                      "| target | limit | measured | source | met |", "|---|---|---|---|---|"]
            lines += [f"| {v['target']} | {'≤' if v['bound'] == 'max' else '≥'} {v['limit']} | {v['value']} | "
                      f"{v['source']} | {v['passed']} |" for v in slo.get("verdicts", [])]
        if b.get("error"):
            lines.append(f"- bench error: {b['error']}")
    return lines


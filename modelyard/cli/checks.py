"""verify, patch and quantize: judge a model folder, repair it, quantize it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from modelyard.artifact.draft import write_quantization_records
from modelyard.artifact.layout import model_root
from modelyard.checks import Report, Target
from modelyard.checks.report import counted, not_judged_line
from modelyard.checks.sarif import to_sarif
from modelyard.cli._choices import ReportFormat, Scheme, Serve, VerifyRuntime
from modelyard.cli._common import (
    VERBOSE_HELP,
    alias_option,
    either,
    emit_json,
    err,
    findings_table,
    json_option,
    out,
    output_option,
    quiet_libraries,
    revision_option,
    store_option,
    stored_path,
    verbose_option,
    working,
)
from modelyard.cli._options import STAGE_OPTIONS, stage_flags
from modelyard.errors import InvalidTargetError, ModelyardError, QualityGateError, VerificationFailedError
from modelyard.model.source import parse_source, with_revision
from modelyard.runtime.prefect_server import use_facts_worker
from modelyard.settings import Settings
from modelyard.stages import quantize as q
from modelyard.stages.fetch.options import FetchFlags
from modelyard.stages.patch import patch_folder
from modelyard.stages.quantize.options import QuantizeFlags
from modelyard.stages.serve import DEFAULT_GPU, ServeTarget
from modelyard.stages.serve.options import ServeFlags
from modelyard.stages.verify import verify_folder
from modelyard.stages.verify.command import verify_before_download, verify_local
from modelyard.stages.verify.options import TargetFlags


@stage_flags(TargetFlags, FetchFlags, ServeFlags, exclude=("allow_patterns", "ignore_patterns"))
def verify(  # noqa: PLR0913
    path: str = typer.Argument(..., help="a model folder, an artifact folder (manifest.json + model/), NAME[@REVISION] "
                                          "of an artifact in the store (re-hashed against its manifest), or "
                                          "hf://org/name@revision: judged from its small files and safetensors "
                                          "headers (HTTP range), before any weight byte is downloaded"),
    options: dict[str, Any] = STAGE_OPTIONS,
    revision: Optional[str] = revision_option(),
    runtime: VerifyRuntime = typer.Option("none", "--runtime",
                                          help="none: hand-written rules only; local: also ask the installed vLLM (the "
                                               "runtime venv) what it decides at startup (runtime.* findings, ~10-15 s)"),
    store: Optional[str] = store_option("the store PATH names an artifact of, as NAME[@REVISION] (a folder or "
                                        "s3://BUCKET/PREFIX; default: MODELYARD_STORE, else MODELYARD_HOME or ./artifacts)"),
    as_json: bool = json_option("the verification report (report.schema.json)"),
    markdown: bool = typer.Option(False, "--markdown", help="print the Markdown report on stdout"),
    report_format: Optional[ReportFormat] = typer.Option(
        None, "--format", help="the report on stdout: table (default), json (as --json), markdown (as --markdown) or "
                               "sarif (SARIF 2.1.0, one rule per finding code, for code-scanning dashboards)"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Judge a model folder; exit 0 when it has no errors, 1 when it has, 2 when unreadable.

    Judged for chat serving unless --serve says otherwise, as `modelyard ingest` judges it."""
    quiet_libraries(verbose)
    if as_json and markdown:
        raise InvalidTargetError("--json and --markdown both ask for the report on stdout",
                                 fix="Pass one of them (the JSON report carries everything the Markdown one shows).")
    asked = {f for f, on in (("json", as_json), ("markdown", markdown), (report_format, report_format)) if on}
    if len(asked) > 1:
        raise InvalidTargetError(f"--format {report_format} and --{'json' if as_json else 'markdown'} both ask for "
                                 "the report on stdout", fix="Pass one of --json, --markdown and --format.")
    fmt = asked.pop() if asked else "table"
    as_json, markdown = fmt == "json", fmt == "markdown"
    refused, gpu, gpus = options.pop("refuse_licenses") or (), options.pop("gpu"), options.pop("gpus")
    target = Target.create(**options)
    serving = ServeTarget(gpu=gpu or DEFAULT_GPU, gpus=gpus or 1, max_model_len=target.max_model_len) \
        if gpu or gpus else None
    settings = Settings()
    # the kept server's warm facts worker, when one runs: transformers' answers without importing it here
    use_facts_worker(settings.local_store(store))
    if revision is not None:
        path = with_revision(path, revision)
    src = parse_source(path) if "://" in path else None
    folder = None
    if src is not None and src.kind == "hf":
        report = verify_before_download(src, target, runtime=runtime, refuse_licenses=refused, serving=serving,
                                        settings=settings)
    else:
        folder = stored_path(src.path if src is not None and src.path else Path(path), store)
        report = verify_local(folder, target, runtime=runtime, refuse_licenses=refused, serving=serving,
                              settings=settings)
    unjudged = sum(1 for f in report.findings if f.severity.value == "not_judged")
    counts = (f"{counted(len(report.errors), 'error')}, "
              f"{counted(sum(1 for f in report.findings if f.severity.value == 'warning'), 'warning')}"
              + (f"; {not_judged_line(unjudged)}" if unjudged else ""))
    if as_json:
        emit_json(report.to_dict(), exit_code=0 if report.passed else 1,
                  error=None if report.passed else VerificationFailedError(
                      f"{path} has {counts}", fix="Each finding in result.findings names the file, the field and the fix."))
        return
    if fmt == "sarif":
        sys.stdout.write(json.dumps(to_sarif(report, model_root(folder) if folder else None, subject=str(path)),
                                    indent=2) + "\n")
    elif markdown:
        sys.stdout.write(report.to_markdown(f"verification of {path}"))
    else:  # findings on stdout, errors first, then the verdict on one unwrapped line
        findings_table(report, out, by_severity=True)
        verdict = "[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"
        out.print(f"{verdict} {escape(str(path))}: {counts}", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if report.passed else 1)


def patch_cmd(
    path: Path = typer.Argument(..., help="a model folder (or an artifact / patch output with model/)"),
    output: Optional[Path] = output_option("new folder to write: OUTPUT/model, OUTPUT/patches.json, OUTPUT/patch.diff"),
    out_dir: Optional[Path] = alias_option("--out"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the diff, write nothing"),
    add_special_token: list[str] = typer.Option([], "--add-special-token",
                                                help="mark an existing vocabulary token special (repeatable)"),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help="install this Jinja file as the chat template"),
    serve: Optional[Serve] = typer.Option(None, "--serve", help="how findings are judged"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Repair the fixable findings of PATH into a new folder, printing the unified diff on stdout.
    Verify the result as OUT (it holds OUT/model); patching judges with --serve only.

    Exit 0 when the result verifies without errors (or for --dry-run), 1 when errors remain, 2 for bad input."""
    quiet_libraries(False)
    out_dir = either(output, out_dir, "--output")
    if out_dir is None and not dry_run:
        raise InvalidTargetError("-o/--output is required unless --dry-run", fix="Pass -o NEW_FOLDER or --dry-run.")
    res = patch_folder(path, out_dir, target=Target.create(serve=serve), dry_run=dry_run,
                       add_special_tokens=add_special_token, chat_template=chat_template)
    sys.stdout.write(res.plan.diff)
    for op in res.plan.ops:
        err.print(f"  [{escape(op.code)}] {escape(op.file)} {escape(op.pointer or '(whole file)')}: "
                  f"{escape(json.dumps(op.old))} -> {escape(json.dumps(op.new) if op.pointer else '(new content)')}",
                  highlight=False, soft_wrap=True)
    n = len(res.plan.ops)
    if res.after is None:
        err.print(f"{n} change(s) planned (dry run, nothing written)" if n else "nothing to patch", highlight=False)
        raise typer.Exit(0)
    findings_table(res.after)
    verdict = "[bold green]PASS[/]" if res.after.passed else "[bold red]FAIL[/]"
    err.print(f"{n} change(s) -> {escape(str(res.out))}/model; verification after patch: {verdict} "
              f"({counted(len(res.after.errors), 'error')})", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if res.after.passed else 1)


@stage_flags(QuantizeFlags, exclude=("quantize",))
def quantize_cmd(  # noqa: PLR0913
    path: Path = typer.Argument(..., help="a model folder (or an artifact / patch output with model/)"),
    scheme: Scheme = typer.Option(..., "--scheme", help="the quantization scheme (legacy formats: gptq with gptqmodel, "
                                                         "awq-gemm with autoawq)"),
    output: Optional[Path] = output_option("new folder (required): OUTPUT/model, OUTPUT/quantization.json, OUTPUT/recipe.yaml"),
    out_dir: Optional[Path] = alias_option("--out"),
    options: dict[str, Any] = STAGE_OPTIONS,
    max_ppl_ratio: Optional[float] = typer.Option(None, "--max-ppl-ratio", min=1.0,
                                                  help="quality limit: quantized / parent perplexity (default: per "
                                                       "scheme family)"),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", min=0.0,
                                           help="quality limit, nats/token (default: per family)"),
    as_json: bool = json_option("quantization.json with the verification summary and findings"),
    verbose: bool = verbose_option(),
) -> None:
    """Quantize PATH with llm-compressor into OUTPUT, measure perplexity and KL against it, and judge the
    output against the target vLLM runtime. Exit 0 when every gate passes, 1 when one fails, 2 for bad input."""
    quiet_libraries(verbose)
    out_dir = either(output, out_dir, "--output", required=True)
    opts = QuantizeFlags(**options)
    with working(as_json):
        q.scheme(scheme)
        if out_dir.exists():
            raise q.QuantizeError(f"{out_dir} already exists", fix="Pass -o/--output a folder that does not exist yet.")
        out_dir.mkdir(parents=True)
        settings = Settings()
        try:
            res = q.quantize_model(model_root(path), out_dir / "model", scheme, settings=settings,
                                   recipe_file=Path(opts.recipe) if opts.recipe else None,
                                   calibration=Path(opts.calibration) if opts.calibration else None,
                                   num_samples=opts.num_samples, max_seq_len=opts.max_seq_len,
                                   max_ppl_ratio=max_ppl_ratio, max_kl=max_kl)
            record = res.record()
            write_quantization_records(out_dir, record)
            report = q.judge(out_dir / "model", res, verify_folder(out_dir / "model"), opts.runtime, settings)
        except BaseException:
            if out_dir.exists() and not any(out_dir.iterdir()):  # nothing written: leave no empty OUT behind
                out_dir.rmdir()
            raise

    error = _quantize_verdict(res, report, out_dir, opts.accept_quality_loss)
    if as_json:
        rd = report.to_dict()
        emit_json(record | {"verification": rd["summary"] | {
            "findings": [f for f in rd["findings"] if f["severity"] != "info"]}}, exit_code=1 if error else 0, error=error)
        return
    findings_table(report)
    qual = res.quality
    for note in res.recipe.adjustments:
        err.print(f"recipe: {escape(note)}", highlight=False)
    out.print(f"{scheme}: {out_dir}/model in {res.seconds:.1f} s", highlight=False)
    if qual:
        out.print(f"perplexity {qual.ppl_parent} -> {qual.ppl_quantized} (x{qual.ppl_ratio}, limit x{qual.max_ppl_ratio}); "
                  f"KL {qual.kl_mean} nats/token (limit {qual.max_kl}): {'passed' if qual.passed else 'FAILED'}",
                  highlight=False)
    out.print(f"verification: {'passed' if report.passed else 'FAILED'} ({counted(len(report.errors), 'error')})")
    raise typer.Exit(1 if error else 0)


def _quantize_verdict(res: q.QuantizeResult, report: Report, out_dir: Path, accept_quality_loss: bool) -> ModelyardError | None:
    """The gate ``quantize`` failed, as the error ``ingest --quantize`` would raise for it (the envelope's
    ``error``), or None when every gate passed: verification errors first, then the quality gate."""
    if not report.passed:
        return VerificationFailedError(f"{out_dir}/model has {counted(len(report.errors), 'error')} for the target runtime",
                                       fix="Each finding in result.verification.findings names the file, the field and the fix.")
    try:
        q.quality_gate(res, accept=accept_quality_loss)
    except QualityGateError as exc:
        return exc
    return None

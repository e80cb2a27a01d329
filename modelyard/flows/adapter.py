"""The adapter ingest: a PEFT LoRA adapter folder stored as an artifact of its own kind on a base artifact.

``modelyard ingest file:///path/adapter --base NAME@REVISION`` (or ``--base /path/to/artifact``) reaches
:func:`ingest_adapter` through :func:`modelyard.flows.ingest.ingest_flow`, which only dispatches here. The
stages: fetch (a local folder) → hash → verify the adapter against the base
(:func:`modelyard.stages.adapter.verify_adapter`, gated) → package model/ (the adapter's files) → serve plan
(the base's, with ``--enable-lora``) → smoke (the base loaded with the adapter, answering through it) →
manifest (``kind: "lora"``, ``base: {name, revision, digest}``) → commit into the store.

serve/vllm.yaml serves the base by a path relative to the adapter artifact
(``../../<base>/<revision>/model``: both live in one store) and the adapter as ``lora-modules``
``<name>=model``; vLLM runs from the artifact folder, as for a model artifact. serve/compose.yaml mounts
the adapter at ``/store/<name>/<revision>/model`` and the base at ``/store/<base>/<revision>/model`` and
runs from ``/store/<name>/<revision>``, so the same relative paths hold in the container.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelyard.artifact.draft import Draft
from modelyard.artifact.layout import MODEL_DIR
from modelyard.artifact.manifest import Manifest, build_manifest, sign_claims
from modelyard.artifact.store import Artifact
from modelyard.checks import Report
from modelyard.checks.adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, read_adapter, serve_rank
from modelyard.errors import InvalidSourceError, ServePlanError
from modelyard.model import digest as hashing
from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source, sanitize_name
from modelyard.settings import Settings
from modelyard.stages import adapter as adapter_stage
from modelyard.stages import serve, smoke
from modelyard.stages.serve.files import BaseMount, vllm_config, write_serve_files
from modelyard.stages.smoke import bench
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke.golden import load_golden
from modelyard.transport.objectstore import open_store

if TYPE_CHECKING:
    from modelyard.flows.options import IngestOptions


@dataclass(frozen=True)
class AdapterResult:
    """The stored LoRA artifact, its report, the smoke result (None with --no-smoke) and the source URI;
    :func:`modelyard.flows.ingest.ingest_flow` returns it as an ``IngestResult``."""

    artifact: Artifact
    report: Report
    smoke: dict[str, Any] | None
    source: str


def ingest_adapter(src: Source, options: IngestOptions, home: str | None = None) -> AdapterResult:
    """Store the adapter folder ``src`` (a parsed ``file://`` source) as a LoRA artifact on ``options.base`` in the
    store ``home`` (default MODELYARD_STORE, else MODELYARD_HOME). Its revision is the first 16 hex of
    sha256(adapter tree digest, base digest); the same adapter on the same base is reused. Raises
    :class:`InvalidSourceError` (exit 2) for a source that is no local adapter folder,
    :class:`~modelyard.errors.VerificationFailedError` (exit 1) when the adapter does not fit the base (``adapter.*`` findings) and
    :class:`~modelyard.errors.SmokeFailedError` (exit 1) when vLLM cannot serve it."""
    if src.kind != "file" or not (Path(src.path or "") / ADAPTER_CONFIG).is_file():
        raise InvalidSourceError(f"--base is for a PEFT adapter folder (file:///path with {ADAPTER_CONFIG}); got {src.uri}",
                                 fix="Pass the adapter folder as file:///path, or drop --base to ingest a model.")
    settings = Settings.for_store(home)
    store = open_store(settings=settings)
    snap = hashing.hash_snapshot(_snapshot(Path(src.path or ""), src.uri), cache=hashing.DigestCache.under(settings))
    report, base = adapter_stage.verify_adapter(snap.root, options.base or "", store, target=options.target(),
                                                max_lora_rank=options.max_lora_rank)
    adapter_stage.gate(report, f"the adapter {src.uri} on {options.base}")
    assert base is not None  # the gate refused a missing base
    name = sanitize_name(options.name) if options.name else f"{src.default_name}"
    digest = "sha256:" + tree_digest(snap.files)
    # the same adapter on another base is another artifact: the revision covers both digests
    revision = hashlib.sha256(f"{digest}\0{base.digest}".encode()).hexdigest()[:16]
    found = store.load(name, revision)
    if found is not None and found[1].base and found[1].base.digest == base.digest:
        return AdapterResult(found[0], report, found[1].smoke.to_dict() if found[1].smoke else None, src.uri)
    rank = serve_rank(read_adapter(snap.root), options.max_lora_rank)
    with store.lock(name, revision), Draft(store) as draft:
        model_dir = draft.add_model(snap)
        smoke_dict = None
        plan = _plan(base.model, options, base.name)  # served-model-name: the base; the adapter: its LoRA name
        if options.smoke:
            smoke_dict = _smoke(base.model, settings, options, plan, (name, model_dir, rank), base.name)
            report = report.with_smoke(smoke_dict)
        if plan is not None:
            # the container mirrors the store's two levels, so vllm.yaml's relative base path holds in it too
            mount = BaseMount(model=f"../../{base.name}/{base.revision}/model",
                              host=f"../../../{base.name}/{base.revision}/model", root=f"/store/{name}/{revision}")
            write_serve_files(draft.path, plan, model_mount="../model", base=mount,
                              overrides=adapter_stage.lora_overrides([(name, snap.root, "model")], max_lora_rank=rank))
        report = report.with_source({"uri": snap.source, "kind": snap.kind})

        def build(rep: Report, raw: bytes) -> Manifest:
            m = build_manifest(name=name, revision=revision, snapshot=snap, report=rep, report_json=raw,
                               smoke=smoke_dict, serve=plan.to_dict() if plan else None)
            return Manifest.from_dict({**m.to_dict(), "kind": "lora", "base": base.record()})

        manifest, report, report_json = sign_claims(build, report)
        draft.add_metadata(manifest, report, report_json, title=f"{name}@{revision} (LoRA on {base.name}@{base.revision})")
        artifact = draft.commit(name, revision, digest)
    return AdapterResult(artifact, report, smoke_dict, src.uri)


def _smoke(base_model: Path, settings: Settings, options: IngestOptions, plan: serve.ServePlan | None,
           lora: tuple[str, Path, int], base_name: str) -> dict[str, Any]:
    """The adapter's smoke at ``options.smoke_level``: ``load`` (the offline engine with ``enable_lora``), or
    ``server``/``bench`` (vLLM's OpenAI server on the base with ``--enable-lora --lora-modules NAME=FOLDER``,
    every request naming the adapter); each with the adapter's numerical gate against its base. Returns the
    stored record; raises :class:`~modelyard.errors.SmokeFailedError` (exit 1) when it fails."""
    name, folder, rank = lora
    o = options.smoking
    res: smoke.SmokeResult | serve_smoke.ServerSmokeResult
    if o.level in ("server", "bench"):
        config = vllm_config(plan, model=str(base_model)) if plan else {"served-model-name": base_name}
        config.update(adapter_stage.lora_overrides([(name, folder, str(folder))], max_lora_rank=rank))
        golden, src = load_golden(Path(o.golden) if o.golden else None, o.serve)
        res = serve_smoke.smoke_server(
            base_model, settings, config=config, question=o.prompt, max_tokens=o.smoke_max_tokens, golden=golden,
            golden_source=src, bench=serve_smoke.BenchSpec() if o.level == "bench" else None,
            max_model_len=min(o.max_model_len or smoke.SMOKE_LEN_CAP, smoke.SMOKE_LEN_CAP), mode=o.serve,
            slo=bench.parse_slo(o.slo), slo_class=bench.slo_class(o.slo_class) if o.slo_class else None, adapter=name)
    else:
        res = smoke.smoke_load(base_model, settings, question=o.prompt, max_tokens=o.smoke_max_tokens,
                               max_model_len=o.max_model_len, mode=o.serve, lora=lora)
    if (error := smoke.gate_error(res)) is not None:
        raise error
    out = res.to_dict()
    # vLLM loaded the adapter from the staging folder, gone once stored: the record names the artifact's own
    if "lora" in out:
        out["lora"] = {**out["lora"], "path": MODEL_DIR}
    if isinstance(out.get("config"), dict) and "lora-modules" in out["config"]:
        out["config"]["lora-modules"] = [f"{name}={MODEL_DIR}"]
    return out


def _snapshot(root: Path, uri: str) -> Snapshot:
    """The adapter folder's files vLLM reads (``adapter_config.json``, ``adapter_model.safetensors``; sizes
    in bytes, digests still to compute): model/ of the LoRA artifact holds these and nothing else."""
    files = tuple(FileEntry(n, (root / n).stat().st_size) for n in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
                  if (root / n).is_file())
    return Snapshot(root=root, source=uri, kind="file", files=files)


def _plan(base_model: Path, options: IngestOptions, name: str) -> serve.ServePlan | None:
    """The base's serve plan (the adapter's bytes are small beside it): ``--gpu``/``--gpus`` when given,
    else H100-80GB on the fewest of 1, 2, 4, 8 GPUs that fit; None when none fits."""
    gpus = (options.gpus,) if options.gpus else (1, 2, 4, 8)
    for n in gpus:
        try:
            return serve.plan_serve(base_model, serve.ServeTarget(gpu=options.gpu or serve.DEFAULT_GPU, gpus=n,
                                                                  max_model_len=options.max_model_len), name=name)
        except ServePlanError:
            if options.gpu or options.gpus:
                raise
    return None

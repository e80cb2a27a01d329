"""The ``ingest`` Prefect flow: fetch → hash → verify → patch → package → verify → quantize → verify →
smoke → publish.

Orchestration only: every task calls one stage function. Prefect's ephemeral API is used unless
``PREFECT_API_URL`` points at a server. Fetch retries (twice, with backoff) only on network
errors: a missing repo or a bad folder fails at once. The Markdown report and a findings table are
attached to the run as Prefect artifacts (keys ``ingest-report``, ``ingest-findings``); the run is
named ``repo@shortsha`` once the commit is known.

The store is a folder (``MODELYARD_HOME``) or an object store (``MODELYARD_STORE=s3://bucket/prefix``,
:mod:`modelyard.transport.objectstore`) that many workers share; the flow only calls the store's methods.
With ``gpu_pool``, the build (packaging, quantization, smoke) holds one slot of Prefect's global
concurrency limit ``gpu-<pool>``, leased (``MODELYARD_GPU_SLOT_LEASE_SECONDS``) so that a worker that
dies frees it; the store commit (an upload, for an object store) runs after the slot is released.

Caching and resume: ``fetch`` of a hub repo pinned to a full commit and every ``verify`` are
Prefect-cached by input digest (:mod:`modelyard.stages.cache`): re-running an ingest of the
same content with the same options reuses them, and a run killed or failed after verify (during
quantize, smoke or packaging) resumes after verify. Hashing reuses the digest cache; the stored
artifact is the cache of everything after.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from modelyard.artifact import identity
from modelyard.artifact.draft import Draft, patched_files
from modelyard.artifact.identity import find_reusable, source_revision, variant_revision
from modelyard.artifact.layout import MODEL_DIR, REPORT_JSON, REPORT_MD
from modelyard.artifact.manifest import Manifest, build_manifest, sign_claims, source_record
from modelyard.artifact.records import SmokeRecord
from modelyard.artifact.report_record import ReportRecord
from modelyard.artifact.store import Artifact, StoreProtocol
from modelyard.checks import Report, Target
from modelyard.errors import (
    ArtifactConflictError,
    AttemptsExhaustedError,
    EndpointUnreachableError,
    HashMismatchError,
    ServePlanError,
)
from modelyard.flows.adapter import ingest_adapter
from modelyard.flows.options import FetchOptions, IngestOptions, PatchOptions, QuantizeOptions, ServeOptions, SmokeOptions
from modelyard.flows.preflight import GateBeforeWeights, plan_patches
from modelyard.flows.result import IngestResult, smoke_record
from modelyard.model import digest as hashing
from modelyard.model.digest import tree_digest
from modelyard.model.patchplan import PatchPlan
from modelyard.model.snapshot import FileEntry, Snapshot, changed_since, fingerprints
from modelyard.model.source import Source, parse_source, sanitize_name
from modelyard.settings import Settings
from modelyard.stages import cache as stage_cache
from modelyard.stages import fetch as fetch_stage
from modelyard.stages import patch, quantize, serve, smoke, verify
from modelyard.stages.serve.files import vllm_config, write_serve_files
from modelyard.stages.smoke import bench, warmup
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke.golden import load_golden
from modelyard.transport.objectstore import open_store
from modelyard.transport.publish import PublishResult, publish


def smoke_covers(prev: SmokeRecord | None, options: IngestOptions) -> bool:
    """Whether a stored smoke result ``prev`` stands for the smoke ``options`` ask for
    (:func:`modelyard.artifact.identity.smoke_covers` at ``smoke_level`` in mode ``serve``), and, when
    they set bench targets (``slo``, ``slo_class``), whether its stored bench figures meet them."""
    return identity.smoke_covers(prev, level=options.smoke_level, mode=options.serve) and slo_covers(prev, options)


def slo_covers(prev: SmokeRecord | None, options: IngestOptions) -> bool:
    """Whether the stored bench figures of ``prev`` meet the targets ``options`` set (always, when
    they set none): the stored run re-judged (:func:`modelyard.stages.smoke.bench.judge`) with
    ``slo_class`` or else the class it was judged in."""
    if not (options.smoke and options.smoke_level == "bench" and (options.slo or options.slo_class)):
        return True
    b = (prev.to_dict() if prev else {}).get("bench") or {}
    cls = bench.slo_class(options.slo_class) if options.slo_class else (b.get("slo") or {}).get("class")
    return bench.judge(b, {**bench.default_targets(cls), **bench.parse_slo(options.slo)}, cls=cls).passed


def retry_on_network(task, task_run, state) -> bool:  # noqa: ANN001 - Prefect's retry_condition_fn signature
    """Retry a network stage only when the endpoint was unreachable (not on a 404 or a bad input)."""
    try:
        state.result()
    except EndpointUnreachableError:
        return True
    except Exception:
        return False
    return False


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _fetch_key(context: Any, params: dict[str, Any]) -> str | None:
    """Only a hub repo pinned to a full commit sha is cached (a branch must be resolved on every run);
    keyed by endpoint, repo, commit, patterns and the local hub cache it lives in (never the token)."""
    src: Source = params["source"]
    settings: Settings = params["settings"]
    options: FetchOptions = params["options"]
    if src.kind != "hf" or not _COMMIT.fullmatch(src.revision or ""):
        return None
    return stage_cache.stage_key("fetch", endpoint=settings.endpoint(), repo=src.repo_id, revision=src.revision,
                                 allow=options.allow_patterns, ignore=options.ignore_patterns,
                                 cache=str(settings.cache_dir().resolve()))


@task(name="fetch", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=retry_on_network,
      cache_key_fn=_fetch_key, persist_result=True, result_serializer="pickle")
def fetch_task(source: Source, settings: Settings, options: FetchOptions,
               before_weights: GateBeforeWeights | None = None) -> Snapshot:
    if source.kind == "gguf":
        warmup.wait()  # the GGUF conversion imports transformers
    return fetch_stage.fetch(source, settings, allow_patterns=options.allow_patterns, ignore_patterns=options.ignore_patterns,
                             before_weights=before_weights)


@task(name="hash", cache_policy=NO_CACHE)
def hash_task(snapshot: Snapshot, settings: Settings, copy_to: Path | None = None) -> tuple[Snapshot, int]:
    """Hash every file once; unchanged files (same device, inode, size, mtime, ctime) hashed by an
    earlier run come from the digest cache under MODELYARD_HOME (hash each byte once).
    With ``copy_to``, a user's file that must be read is copied there while it is hashed, so that
    packaging does not read it again. Returns the hashed snapshot and the bytes read."""
    return hashing.hash_snapshot_counted(snapshot, cache=hashing.DigestCache.under(settings), copy_to=copy_to,
                                         link_from=(settings.cache_dir(),))


def _verify_key(context: Any, params: dict[str, Any]) -> str:
    runtime = Settings().ingest_runtime()
    return stage_cache.stage_key("verify", tree=params["tree"], listing=verify.listing_digest(params["root"]),
                                 target=params["target"].to_dict(),
                                 runtime=str(Settings().vllm_interpreter().resolve()) if runtime else None)


@task(name="verify", cache_key_fn=_verify_key, persist_result=True, result_serializer="pickle")
def verify_task(root: Path, target: Target, tree: str) -> Report:
    """Verify ``root`` against ``target``. ``tree`` is the tree digest of the files there (sizes and
    sha256): with the folder's listing, the target, modelyard's code and the library versions it is
    the cache key, so an identical re-run (or one resumed after a kill) reuses the report."""
    warmup.wait()
    settings = Settings()
    return verify.verify_folder(root, target, runtime=settings.ingest_runtime(), settings=settings)


@task(name="plan-patches", cache_policy=NO_CACHE)
def plan_task(snapshot: Snapshot, report: Report, options: PatchOptions) -> PatchPlan:
    plan = plan_patches(snapshot.root, report, options)
    if plan.empty:
        return plan
    # Errors the plan does not repair block the ingest before anything is staged.
    verify.gate(report, snapshot.source, ignore=patch.repaired_codes(plan))
    return plan


@task(name="package", cache_policy=NO_CACHE)
def package_task(snapshot: Snapshot, draft: Draft, plan: PatchPlan, settings: Settings,
                 precopied: Path | None = None) -> Path:
    model = draft.add_model(snapshot, link_from=(settings.cache_dir(),), precopied=precopied)
    if not plan.empty:
        draft.add_patches(plan)
    return model


@task(name="smoke", cache_policy=NO_CACHE)
def smoke_task(model_dir: Path, settings: Settings, options: SmokeOptions, parent: Path | None = None) -> smoke.SmokeResult:
    """The ``load`` smoke in the target's serving mode (``options.serve``: chat or completion); ``parent``:
    the checkpoint a quantized or patched ``model_dir`` came from, compared by the numerical gate."""
    res = smoke.smoke_load(model_dir, settings, question=options.prompt, max_tokens=options.smoke_max_tokens,
                           max_model_len=options.max_model_len, mode=options.serve, parent=parent)
    if (error := smoke.gate_error(res)) is not None:
        raise error
    return res


@task(name="serve-plan", cache_policy=NO_CACHE)
def serve_plan_task(model_dir: Path, options: ServeOptions, name: str) -> serve.ServePlan | None:
    """The serve plan behind serve/. With ``--gpu``/``--gpus`` a plan that cannot fit fails the run
    (exit 2); without, H100-80GB on the fewest of 1, 2, 4, 8 GPUs that fit, or no serve/ at all."""
    mml = options.max_model_len
    if options.gpu or options.gpus:
        return serve.plan_serve(model_dir, serve.ServeTarget(gpu=options.gpu or serve.DEFAULT_GPU, gpus=options.gpus or 1,
                                                             max_model_len=mml), name=name)
    for n in (1, 2, 4, 8):
        try:
            return serve.plan_serve(model_dir, serve.ServeTarget(gpu=serve.DEFAULT_GPU, gpus=n, max_model_len=mml), name=name)
        except ServePlanError:
            continue
    return None


@task(name="smoke-server", cache_policy=NO_CACHE)
def smoke_server_task(model_dir: Path, settings: Settings, options: SmokeOptions,
                      plan: serve.ServePlan | None, name: str, parent: Path | None = None) -> serve_smoke.ServerSmokeResult:
    """The ``server``/``bench`` smoke, from the vllm.yaml that serve/ will hold (CPU overrides), through
    the target's serving mode (``options.serve``: the chat or the completions API)."""
    cfg = vllm_config(plan, model=str(model_dir)) if plan else {"served-model-name": name}
    golden, src = load_golden(_path(options.golden), options.serve)
    res = serve_smoke.smoke_server(
        model_dir, settings, config=cfg, question=options.prompt, max_tokens=options.smoke_max_tokens,
        golden=golden, golden_source=src, bench=serve_smoke.BenchSpec() if options.level == "bench" else None,
        max_model_len=min(options.max_model_len or smoke.SMOKE_LEN_CAP, smoke.SMOKE_LEN_CAP), mode=options.serve,
        slo=bench.parse_slo(options.slo), slo_class=bench.slo_class(options.slo_class) if options.slo_class else None,
        parent=parent)
    if (error := smoke.gate_error(res)) is not None:
        raise error
    return res


@task(name="quantize", cache_policy=NO_CACHE)
def quantize_task(model_dir: Path, out_model: Path, options: QuantizeOptions, settings: Settings) -> quantize.QuantizeResult:
    return quantize.quantize_model(model_dir, out_model, options.quantize or "", settings=settings,
                                   num_samples=options.num_samples, max_seq_len=options.max_seq_len,
                                   recipe_file=_path(options.recipe), calibration=_path(options.calibration))


def _path(p: str | None) -> Path | None:
    return Path(p) if p else None


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(draft: Draft, name: str, revision: str, digest: str) -> Artifact:
    return draft.commit(name, revision, digest)


@task(name="publish-remote", retries=2, retry_delay_seconds=[5, 30], cache_policy=NO_CACHE)
def publish_remote_task(artifact_dir: Path, to: str, settings: Settings) -> PublishResult:
    """Push the stored artifact to ``to`` (OCI registry or S3); retried: both are idempotent
    (blobs by digest, S3 manifest written last)."""
    return publish(artifact_dir, to, settings=settings)


def _run_name() -> str:
    """The run's name before the commit is known: ``repo@revision`` (hub) or the folder's name."""
    from prefect.runtime import flow_run  # noqa: PLC0415 - heavy: prefect, imported on first use

    try:
        src = parse_source(flow_run.parameters["source"])
    except Exception:  # a bad source fails in the flow, with its own message
        return "ingest"
    if src.kind == "hf":
        return f"{src.repo_id}@{(src.revision or 'main')[:7] if _COMMIT.fullmatch(src.revision or '') else src.revision or 'main'}"
    return src.default_name


def _rename_run(name: str) -> None:
    """Rename the current flow run (``repo@shortsha`` once fetch resolved the commit); best effort."""
    try:
        from prefect.client.orchestration import get_client  # noqa: PLC0415 - heavy: prefect, imported on first use
        from prefect.runtime import flow_run  # noqa: PLC0415 - heavy: prefect, imported on first use

        if flow_run.id and flow_run.name != name:
            with get_client(sync_client=True) as client:
                client.update_flow_run(flow_run_id=flow_run.id, name=name)
    except Exception:  # a name is cosmetic: an API hiccup must not fail the ingest
        pass


class _Stages:
    """Runs cached tasks with results kept under ``<home>/.cache/stages`` and records which ones
    Prefect answered from its cache (state ``Cached``)."""

    def __init__(self, settings: Settings) -> None:
        self.storage = stage_cache.folder(settings)
        self.cached: list[str] = []

    def __call__(self, task_: Any, *args: Any, **kwargs: Any) -> Any:
        state = task_.with_options(result_storage=self.storage)(*args, return_state=True, **kwargs)
        value = state.result()  # re-raises the task's own exception
        if state.name == "Cached":
            self.cached.append(task_.name)
        return value

    def fetch(self, src: Source, settings: Settings, options: FetchOptions,
              before_weights: GateBeforeWeights | None = None) -> Snapshot:
        snap = self(fetch_task, src, settings, options, before_weights)
        if "fetch" in self.cached and not fetch_stage.snapshot_present(snap):  # the hub cache was emptied since
            self.cached.remove("fetch")
            snap = fetch_task.with_options(refresh_cache=True, result_storage=self.storage)(src, settings, options,
                                                                                           before_weights)
        elif "fetch" in self.cached:  # an earlier run's download: its files may have changed since, hash them
            snap = snap.without_received()
        return snap

    def verify(self, root: Path, target: Target, files: tuple[FileEntry, ...]) -> Report:
        return self(verify_task, root, target, tree_digest(files))


@dataclass(frozen=True)
class _Run:
    """What every step of one ingest reads: the options, settings, target, the artifact's name, the
    stage runner and the GPU pool whose slot the build holds (None: no slot)."""

    options: IngestOptions
    settings: Settings
    target: Target
    name: str
    stages: _Stages
    gpu_pool: str | None = None


@contextlib.contextmanager
def gpu_slot(pool: str | None, settings: Settings) -> Iterator[None]:
    """Hold one slot of Prefect's global concurrency limit ``gpu-<pool>`` (create it with ``prefect gcl
    create gpu-<pool> --limit N``) for the block: at most N holders at once across every worker that
    shares the Prefect server. The slot is a lease of ``settings.gpu_slot_lease_seconds``, renewed while
    the run lives, so a killed worker's slot frees itself. A no-op without a pool, or when the limit
    does not exist. Logs ``holds a slot of gpu-<pool>`` / ``released its slot of gpu-<pool>`` to the run."""
    if not pool:
        yield
        return
    from prefect.concurrency.sync import concurrency  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.logging import get_run_logger  # noqa: PLC0415 - heavy: prefect, imported on first use

    with concurrency(f"gpu-{pool}", occupy=1, strict=False, lease_duration=settings.gpu_slot_lease_seconds):
        log = get_run_logger()
        log.info("holds a slot of gpu-%s", pool)
        try:
            yield
        finally:
            log.info("released its slot of gpu-%s", pool)


@flow(name="ingest", log_prints=False, validate_parameters=False, flow_run_name=_run_name)
def ingest_flow(source: str, options: IngestOptions | dict[str, Any] | None = None, home: str | None = None,
                gpu_pool: str | None = None) -> IngestResult:
    """Ingest ``source`` (a SOURCE URI) into the store ``home`` (``--store``: a folder or
    ``s3://bucket/prefix``; default MODELYARD_STORE, else MODELYARD_HOME): fetch → hash → verify → patch →
    package → (verify) → (quantize → verify) → serve plan → smoke → commit into the store → publish. Each
    arrow is one stage; the policies (revision names, reuse, the artifact's writes) live in
    :mod:`modelyard.artifact`. ``options`` may be a dict of :class:`IngestOptions` fields (a deployment's
    JSON parameters); ``gpu_pool``: the build holds a slot of ``gpu-<pool>`` (:func:`gpu_slot`). With
    ``options.base`` the source is a LoRA adapter (:func:`modelyard.flows.adapter.ingest_adapter`)."""
    src = parse_source(source)
    settings = Settings.for_store(home)
    warmup.start(settings, src.path if src.kind == "file" else None)  # transformers' imports beside fetch and hash
    options = IngestOptions(**options) if isinstance(options, dict) else options or IngestOptions()
    options.check()
    if options.base:  # a PEFT adapter on a base artifact: its own kind of artifact
        a = ingest_adapter(src, options, home)
        return IngestResult(a.artifact, a.report, smoke_record(a.smoke) if a.smoke else None, a.source, None)
    store = open_store(settings=settings)
    _start_attempt(source, store, settings)
    stages = _Stages(settings)
    snap = stages.fetch(src, settings, options.fetching, gate := GateBeforeWeights.of(options, settings))
    gate.after_fetch(snap, local=src.kind == "file")  # license (a cached or local fetch too), a local copy's disk
    r = _Run(options, settings, options.target(), _artifact_name(options, src, snap), stages, gpu_pool)
    precopy = store.new_staging() if src.kind == "file" else None  # a user's folder is copied while hashed
    before = fingerprints(snap) if src.kind == "file" else None  # a user's folder may change under the run
    try:
        snap, hashed_bytes = hash_task(snap, settings, precopy / MODEL_DIR if precopy else None)
        revision = source_revision(snap.commit, snap.files, fetch_stage.own_selection(snap))
        _rename_run(f"{src.repo_id if src.kind == 'hf' else r.name}@{revision[:7] if snap.commit else revision[:14]}")
        report = verify.with_source_findings(r.stages.verify(snap.root, r.target, snap.files), snap)
        plan = plan_task(snap, report, options.patching)
        if before is not None and (moved := changed_since(snap, before)):
            raise HashMismatchError(
                f"{', '.join(moved[:5])} changed while {src.uri} was being ingested (between hashing and verification): "
                "the verdict would be about other bytes than the ones stored; nothing was stored",
                fix="Do not edit the folder during an ingest (copy it somewhere first if it is being written), then "
                    "run the ingest again.")
        if plan.empty:
            verify.gate(report, snap.source)
        revision = variant_revision(revision, patch_digest=None if plan.empty else plan.digest, scheme=options.quantize,
                                    variant_digest=quantize.variant_digest(snap.root, options.quantizing)
                                    if options.quantize else None)
        artifact, report, smoke_rec = _store(r, store, revision, snap, plan, report, precopy)
    finally:
        if precopy is not None:
            shutil.rmtree(precopy, ignore_errors=True)
    published = tuple(publish_remote_task(store.local(artifact), to, settings) for to in options.publish)
    return IngestResult(artifact, report, smoke_rec, src.uri, snap.commit, len(plan.ops), published,
                        tuple(r.stages.cached), hashed_bytes, snap.left_out)


def _start_attempt(source: str, store: StoreProtocol, settings: Settings) -> None:
    """Log which worker runs this attempt (host, local cache, store) to the flow run, and refuse an
    attempt past ``settings.ingest_max_attempts`` (:class:`AttemptsExhaustedError`): a run is started
    again only when its worker was lost (:mod:`modelyard.flows.deployments`)."""
    from prefect.logging import get_run_logger  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.logging.handlers import APILogWorker  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.runtime import flow_run  # noqa: PLC0415 - heavy: prefect, imported on first use

    attempt = max(int(flow_run.run_count or 1), 1)
    get_run_logger().info("attempt %d of ingest %s on host %s: local cache %s, store %s", attempt, source,
                          socket.gethostname(), settings.store_dir(), store.where)
    # sent now, not in the next 2 s batch (the evidence of which worker took the run). Only the log worker is
    # drained: APILogHandler.flush() stops the events worker too, and a run without heartbeats stays Running
    drain = threading.Thread(target=lambda: APILogWorker.instance().drain(), daemon=True)
    drain.start()
    drain.join(5)
    if attempt > settings.ingest_max_attempts:
        raise AttemptsExhaustedError(
            f"flow run {flow_run.id} of ingest {source} was started {attempt} times; its worker was lost each time "
            f"(MODELYARD_INGEST_MAX_ATTEMPTS is {settings.ingest_max_attempts})",
            fix="Look at why the workers died (memory, disk, a kill) in their logs, then submit the run again.")


def _artifact_name(options: IngestOptions, src: Source, snap: Snapshot) -> str:
    """``--name``, else the name a bundle's manifest gives (``tar://``), else the source's default."""
    if options.name:
        return sanitize_name(options.name)
    bundle_of = str(snap.provenance.get("bundle_of") or "")
    if src.kind == "tar" and "@" in bundle_of:
        return sanitize_name(bundle_of.rsplit("@", 1)[0])
    return src.default_name


def _store(r: _Run, store: StoreProtocol, revision: str, snap: Snapshot, plan: PatchPlan, report: Report,
           precopy: Path | None) -> tuple[Artifact, Report, SmokeRecord | None]:
    """Reuse the stored ``name@revision`` when it stands for this run, else build it in a draft and
    commit it; under the store's lock, so concurrent identical ingests on this host build once (on
    other hosts too, when one commits before the other's slot of the GPU pool comes free; else the
    object store's conditional put lets one commit win and the others reuse it)."""
    files = patched_files(snap, plan)
    digest = "sha256:" + tree_digest(files)
    try:
        store.sweep_staging()  # what killed runs left behind goes, even when this run reuses the artifact
    except OSError:
        pass

    def reusable() -> tuple[Artifact, Manifest] | None:
        found = find_reusable(store, r.name, revision, digest, variant=bool(r.options.quantize),
                              smoke_level=r.options.smoking.level, mode=r.options.serve)
        return found if found is not None and slo_covers(found[1].smoke, r.options) else None

    with store.lock(r.name, revision):
        found = reusable()
        if found is not None:
            return _reuse(r, store, *found, plan, report)
        with Draft(store) as draft:
            with gpu_slot(r.gpu_pool, r.settings):
                found = reusable() if r.gpu_pool else None  # committed elsewhere while this run waited for the slot
                if found is not None:
                    return _reuse(r, store, *found, plan, report)
                report, smoke_rec, digest = _build(r, draft, revision, snap, plan, files, digest, report, precopy)
            artifact = publish_task(draft, r.name, revision, digest)
    _attach(store, artifact, report)
    return artifact, report, smoke_rec


def _reuse(r: _Run, store: StoreProtocol, existing: Artifact, prev: Manifest, plan: PatchPlan,
           report: Report) -> tuple[Artifact, Report, SmokeRecord | None]:
    """The stored artifact, with the report re-judged on its model/ when it is a variant (the stored
    smoke stands: it is reported as the stored one). An object store's artifact is downloaded to the
    local cache only when its model/ must be read (a variant's re-judging, explicit serve options)."""
    _check_serve_plan(r, store, existing, prev)
    prev_record = ReportRecord.from_bytes(store.read(existing, REPORT_JSON))
    if not plan.empty or r.options.quantize:
        report = r.stages(verify_task, store.local(existing) / MODEL_DIR, r.target,
                          existing.content_digest.removeprefix("sha256:"))
        if prev.quantization:
            report = report.with_quantization(prev.quantization.to_dict())
    # the stored origin and identity claims, as signed (a cached verify's report has neither)
    report = report.with_source(prev_record.source.to_dict()) if prev_record.source else report
    report = report.with_artifact(prev_record.artifact.to_dict()) if prev_record.artifact else report
    _attach(store, existing, report)
    return (existing, report.with_smoke(prev_record.smoke.to_dict()) if prev_record.smoke else report, prev.smoke)


def _check_serve_plan(r: _Run, store: StoreProtocol, existing: Artifact, prev: Manifest) -> None:
    """Serve options given explicitly (``--gpu``, ``--gpus``, ``--max-model-len``) must plan what the
    stored artifact's serve/ holds: reusing it would silently keep a plan for another host. Raises
    :class:`ArtifactConflictError` (exit 2) naming both plans."""
    o = r.options.serving
    if not (o.gpu or o.gpus or o.max_model_len):
        return
    wanted = serve_plan_task(store.local(existing) / MODEL_DIR, o, r.name)
    w = wanted.to_dict() if wanted else None
    stored = prev.serve.to_dict() if prev.serve else None
    if w is not None and stored is not None:
        # a manifest written before the multi-node keys (nodes, pipeline stages) existed: a one-node plan,
        # compared on the keys it has
        w = {k: v for k, v in w.items() if k in stored}
    if w == stored:
        return

    def says(p: dict[str, Any] | None) -> str:
        return "no serve plan" if not p else f"{p['gpus']} x {p['gpu']}, max_model_len {p['max_model_len']}"
    raise ArtifactConflictError(
        f"{existing.name}@{existing.revision} is already in the store with serve/ for {says(stored)}; "
        f"the options ask for {says(wanted.to_dict() if wanted else None)}",
        fix=f"Write serve files for that host with `modelyard serve-plan {existing.location} --gpu ... --gpus ... --write DIR`, "
            "or ingest under another --name.")


def _build(r: _Run, draft: Draft, revision: str, snap: Snapshot, plan: PatchPlan, files: tuple[FileEntry, ...],  # noqa: PLR0913
           digest: str, report: Report, precopy: Path | None) -> tuple[Report, SmokeRecord | None, str]:
    """package → (verify the patched copy) → (quantize → verify → gates) → serve plan → smoke →
    report and manifest, in ``draft``. Returns the report, the smoke result and the content digest
    (a quantized model's) to commit the draft under."""
    model_dir = package_task(snap, draft, plan, r.settings, precopy / MODEL_DIR if precopy else None)
    if not plan.empty:
        report = r.stages.verify(model_dir, r.target, files)
        verify.gate(report, f"{snap.source} after patching")
    qrec = None
    if r.options.quantize:
        qres = quantize_task(model_dir, draft.path / "model.quantized", r.options.quantizing, r.settings)
        files = draft.replace_model(draft.path / "model.quantized")
        digest = "sha256:" + tree_digest(files)
        qrec = qres.record()
        draft.add_quantization(qrec)
        report = quantize.judge(model_dir, qres, r.stages.verify(model_dir, r.target, files), r.options.runtime, r.settings)
        verify.gate(report, f"{snap.source} quantized with {r.options.quantize}")
        quantize.quality_gate(qres, accept=r.options.accept_quality_loss)
    serve_plan = serve_plan_task(model_dir, r.options.serving, r.name)
    smoke_rec = None
    parent = snap.root if (r.options.quantize or not plan.empty) else None  # the derived artifact's parent
    if r.options.smoking.level in ("server", "bench"):
        smoke_rec = smoke_record(smoke_server_task(model_dir, r.settings, r.options.smoking, serve_plan, r.name, parent))
    elif r.options.smoking.level == "load":
        smoke_rec = smoke_record(smoke_task(model_dir, r.settings, r.options.smoking, parent))
    smoke_dict = smoke_rec.to_dict() if smoke_rec is not None else None
    if serve_plan is not None:
        write_serve_files(draft.path, serve_plan)
    if smoke_dict is not None:
        report = report.with_smoke(smoke_dict)
    report = report.with_left_out(snap.left_out).with_source(source_record(snap))
    manifest, report, report_json = sign_claims(
        lambda rep, raw: build_manifest(name=r.name, revision=revision, snapshot=snap, report=rep, report_json=raw,
                                        smoke=smoke_dict, files=files, plan=plan, quantization=qrec,
                                        serve=serve_plan.to_dict() if serve_plan else None), report)
    draft.add_metadata(manifest, report, report_json, title=f"{r.name}@{revision}")
    return report, smoke_rec, digest


def findings_rows(report: Report) -> list[dict[str, str]]:
    """The report's findings as table rows (severity, code, file, field, value, message, fix): the
    ``ingest-findings`` Prefect table artifact. An empty report gives one ``info`` row saying so."""
    rows = [{"severity": f.severity.value, "code": f.code, "file": f.file or "", "field": f.field or "",
             "value": "" if f.value is None else str(f.value), "message": f.message, "fix": f.fix or ""}
            for f in report.findings]
    return rows or [{"severity": "info", "code": "report.clean", "file": "", "field": "", "value": "",
                     "message": "no findings", "fix": ""}]


def _attach(store: StoreProtocol, artifact: Artifact, report: Report) -> None:
    """Attach the stored artifact's Markdown report and the findings table to the flow run as Prefect artifacts."""
    try:
        from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: PLC0415 - heavy: prefect, imported on first use

        create_markdown_artifact(markdown=store.read(artifact, REPORT_MD).decode(), key="ingest-report",
                                 description="modelyard verification and smoke report")
        create_table_artifact(table=findings_rows(report), key="ingest-findings",
                              description="modelyard findings: severity, code, file, field, value, message, fix")
    except Exception:  # the report is on disk; a Prefect API hiccup must not fail the ingest
        pass

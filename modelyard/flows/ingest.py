"""The ``ingest`` Prefect flow: fetch → hash → verify → patch → package → verify → quantize → verify →
smoke → publish.

Orchestration only: every task calls one stage function. Prefect's ephemeral API is used unless
``PREFECT_API_URL`` points at a server. Fetch retries (twice, with backoff) only on network
errors: a missing repo or a bad folder fails at once. The Markdown report and a findings table are
attached to the run as Prefect artifacts (keys ``ingest-report``, ``ingest-findings``); the run is
named ``repo@shortsha`` once the commit is known.

Caching and resume: ``fetch`` of a hub repo pinned to a full commit and every ``verify`` are
Prefect-cached by input digest (:mod:`modelyard.stages.cache`): re-running an ingest of the
same content with the same options reuses them, and a run killed or failed after verify (during
quantize, smoke or packaging) resumes after verify. Hashing reuses the digest cache; the stored
artifact is the cache of everything after.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from modelyard.artifact import identity
from modelyard.artifact.draft import Draft, patched_files
from modelyard.artifact.identity import find_reusable, source_revision, variant_revision
from modelyard.artifact.layout import MODEL_DIR, REPORT_JSON, REPORT_MD
from modelyard.artifact.manifest import Manifest, build_manifest
from modelyard.artifact.store import Artifact, Store
from modelyard.checks import Report, Target
from modelyard.errors import ArtifactConflictError, EndpointUnreachableError, ServePlanError, SmokeFailedError
from modelyard.flows.options import FetchOptions, IngestOptions, PatchOptions, QuantizeOptions, ServeOptions, SmokeOptions
from modelyard.model import digest as hashing
from modelyard.model.digest import tree_digest
from modelyard.model.patchplan import PatchPlan
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source, parse_source, sanitize_name
from modelyard.settings import Settings
from modelyard.stages import cache as stage_cache
from modelyard.stages import fetch as fetch_stage
from modelyard.stages import patch, quantize, serve, smoke, verify
from modelyard.stages.serve.files import vllm_config, write_serve_files
from modelyard.stages.smoke import server as serve_smoke
from modelyard.stages.smoke import warmup
from modelyard.transport.publish import publish


@dataclass(frozen=True)
class IngestResult:
    artifact: Artifact
    report: Report
    smoke: dict[str, Any] | None
    source: str
    commit: str | None
    patches: int = 0  # repairs applied (patches.json beside model/)
    published: tuple[dict[str, Any], ...] = ()  # --publish results: uri, files, bytes, digest
    cached: tuple[str, ...] = ()  # stages whose result came from the stage cache (e.g. "fetch", "verify")
    hashed_bytes: int = 0  # bytes read to hash the source (0: every digest came from the digest cache)

    def to_dict(self) -> dict[str, Any]:
        a = self.artifact
        return {"artifact": str(a.path), "name": a.name, "revision": a.revision, "content_digest": a.content_digest,
                "reused": a.reused, "source": self.source, "commit": self.commit,
                "verification": self.report.to_dict()["summary"], "patches": self.patches, "smoke": self.smoke,
                "published": list(self.published), "cached_stages": list(self.cached),
                "hashed_bytes": self.hashed_bytes}


def smoke_covers(prev: dict[str, Any], options: IngestOptions) -> bool:
    """Whether a stored smoke result ``prev`` stands for the smoke ``options`` ask for
    (:func:`modelyard.artifact.identity.smoke_covers` at ``smoke_level`` in mode ``serve``)."""
    return identity.smoke_covers(prev, level=options.smoke_level, mode=options.serve)


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
def fetch_task(source: Source, settings: Settings, options: FetchOptions) -> Snapshot:
    if source.kind == "gguf":
        warmup.wait()  # the GGUF conversion imports transformers
    return fetch_stage.fetch(source, settings, allow_patterns=options.allow_patterns, ignore_patterns=options.ignore_patterns)


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
    if not options.enabled:
        return PatchPlan()
    plan = patch.plan_patches(snapshot.root, report, add_special_tokens=options.add_special_tokens,
                              chat_template=Path(options.chat_template) if options.chat_template else None)
    # Errors the plan does not repair block the ingest before anything is staged.
    verify.gate(report, snapshot.source, ignore=plan.fixes)
    return plan


@task(name="package", cache_policy=NO_CACHE)
def package_task(snapshot: Snapshot, draft: Draft, plan: PatchPlan, settings: Settings,
                 precopied: Path | None = None) -> Path:
    model = draft.add_model(snapshot, link_from=(settings.cache_dir(),), precopied=precopied)
    if not plan.empty:
        draft.add_patches(plan)
    return model


@task(name="smoke", cache_policy=NO_CACHE)
def smoke_task(model_dir: Path, settings: Settings, options: SmokeOptions) -> smoke.SmokeResult:
    """The ``load`` smoke in the target's serving mode (``options.mode``: chat or completion)."""
    res = smoke.smoke_load(model_dir, settings, question=options.prompt, max_tokens=options.max_tokens,
                           max_model_len=options.max_model_len, mode=options.mode)
    if not res.passed:
        fix = ("Check generation_config.json eos_token_id against the chat template's turn terminator."
               if res.mode == "chat" else
               "Check that the model continues plain text (an instruct model may end a bare prompt at once: "
               "serve it as chat with its template, --serve chat).")
        raise SmokeFailedError(f"vLLM smoke {res.mode} failed: {res.error}; answer was {res.text!r}", result=res,
                               fix=fix)
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
                      plan: serve.ServePlan | None, name: str) -> serve_smoke.ServerSmokeResult:
    """The ``server``/``bench`` smoke, from the vllm.yaml that serve/ will hold (CPU overrides), through
    the target's serving mode (``options.mode``: the chat or the completions API)."""

    cfg = vllm_config(plan, model=str(model_dir)) if plan else {"served-model-name": name}
    golden, src = serve_smoke.load_golden(_path(options.golden), options.mode)
    res = serve_smoke.smoke_server(
        model_dir, settings, config=cfg, question=options.prompt, max_tokens=options.max_tokens,
        golden=golden, golden_source=src, bench=serve_smoke.BenchSpec() if options.level == "bench" else None,
        max_model_len=min(options.max_model_len or smoke.SMOKE_LEN_CAP, smoke.SMOKE_LEN_CAP), mode=options.mode)
    if not res.passed:
        raise SmokeFailedError(f"vLLM server smoke failed ({res.error}); answer was {res.text!r}", result=res,
                               fix="See the failed checks in the message; golden misses name the prompt.")
    return res


@task(name="quantize", cache_policy=NO_CACHE)
def quantize_task(model_dir: Path, out_model: Path, options: QuantizeOptions) -> quantize.QuantizeResult:
    return quantize.quantize_model(model_dir, out_model, options.scheme or "", num_samples=options.num_samples,
                                   max_seq_len=options.max_seq_len, recipe_file=_path(options.recipe),
                                   calibration=_path(options.calibration))


def _path(p: str | None) -> Path | None:
    return Path(p) if p else None


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(draft: Draft, name: str, revision: str, digest: str) -> Artifact:
    return draft.commit(name, revision, digest)


@task(name="publish-remote", retries=2, retry_delay_seconds=[5, 30], cache_policy=NO_CACHE)
def publish_remote_task(artifact_dir: Path, to: str, settings: Settings) -> dict[str, Any]:
    """Push the stored artifact to ``to`` (OCI registry or S3); retried: both are idempotent
    (blobs by digest, S3 manifest written last)."""

    r = publish(artifact_dir, to, settings=settings)
    return {"uri": r.uri, "files": r.files, "bytes": r.bytes, "digest": r.digest, "skipped": r.skipped}


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

    def fetch(self, src: Source, settings: Settings, options: FetchOptions) -> Snapshot:
        snap = self(fetch_task, src, settings, options)
        if "fetch" in self.cached and not fetch_stage.snapshot_present(snap):  # the hub cache was emptied since
            self.cached.remove("fetch")
            snap = fetch_task.with_options(refresh_cache=True, result_storage=self.storage)(src, settings, options)
        return snap

    def verify(self, root: Path, target: Target, files: tuple[FileEntry, ...]) -> Report:
        return self(verify_task, root, target, tree_digest(files))


@dataclass(frozen=True)
class _Run:
    """What every step of one ingest reads: the options, settings, target, the artifact's name and
    the stage runner."""

    options: IngestOptions
    settings: Settings
    target: Target
    name: str
    stages: _Stages


@flow(name="ingest", log_prints=False, validate_parameters=False, flow_run_name=_run_name)
def ingest_flow(source: str, options: IngestOptions | None = None, home: str | None = None) -> IngestResult:
    """Ingest ``source`` (a SOURCE URI) into the store at ``home`` (default MODELYARD_HOME):
    fetch → hash → verify → patch → package → (verify) → (quantize → verify) → serve plan → smoke →
    commit into the store → publish. Each arrow is one stage; the policies (revision names, reuse, the
    artifact's writes) live in :mod:`modelyard.artifact`."""
    warmup.start()  # verify's transformers imports run beside fetch and hash (the CLI starts it earlier)
    options = options or IngestOptions()
    settings = Settings(home=Path(home)) if home else Settings()
    src = parse_source(source)
    options.check()
    stages = _Stages(settings)
    snap = stages.fetch(src, settings, options.fetching)
    r = _Run(options, settings, options.target(), _artifact_name(options, src, snap), stages)
    store = Store(settings.store_dir())
    precopy = store.new_staging() if src.kind == "file" else None  # a user's folder is copied while hashed
    try:
        snap, hashed_bytes = hash_task(snap, settings, precopy / MODEL_DIR if precopy else None)
        revision = source_revision(snap.commit, snap.files)
        _rename_run(f"{src.repo_id if src.kind == 'hf' else r.name}@{revision[:7] if snap.commit else revision[:14]}")
        report = r.stages.verify(snap.root, r.target, snap.files)
        plan = plan_task(snap, report, options.patching)
        if plan.empty:
            verify.gate(report, snap.source)
        revision = variant_revision(revision, patch_digest=None if plan.empty else plan.digest, scheme=options.quantize,
                                    variant_digest=quantize.variant_digest(snap.root, options.quantizing)
                                    if options.quantize else None)
        artifact, report, smoke_dict = _store(r, store, revision, snap, plan, report, precopy)
    finally:
        if precopy is not None:
            shutil.rmtree(precopy, ignore_errors=True)
    published = tuple(publish_remote_task(artifact.path, to, settings) for to in options.publish)
    return IngestResult(artifact, report, smoke_dict, src.uri, snap.commit, len(plan.ops), published,
                        tuple(r.stages.cached), hashed_bytes)


def _artifact_name(options: IngestOptions, src: Source, snap: Snapshot) -> str:
    """``--name``, else the name a bundle's manifest gives (``tar://``), else the source's default."""
    if options.name:
        return sanitize_name(options.name)
    bundle_of = str(snap.provenance.get("bundle_of") or "")
    if src.kind == "tar" and "@" in bundle_of:
        return sanitize_name(bundle_of.rsplit("@", 1)[0])
    return src.default_name


def _store(r: _Run, store: Store, revision: str, snap: Snapshot, plan: PatchPlan, report: Report,
           precopy: Path | None) -> tuple[Artifact, Report, dict[str, Any] | None]:
    """Reuse the stored ``name@revision`` when it stands for this run, else build it in a draft and
    commit it; under the store's lock, so concurrent identical ingests build once."""
    files = patched_files(snap, plan)
    digest = "sha256:" + tree_digest(files)
    try:
        store.sweep_staging()  # what killed runs left behind goes, even when this run reuses the artifact
    except OSError:
        pass
    with store.lock(r.name, revision):
        found = find_reusable(store, r.name, revision, digest, variant=bool(r.options.quantize),
                              smoke_level=r.options.smoking.level, mode=r.options.serve)
        if found is not None:
            return _reuse(r, *found, plan, report)
        with Draft(store) as draft:
            return _build(r, draft, revision, snap, plan, files, digest, report, precopy)


def _reuse(r: _Run, existing: Artifact, prev: Manifest, plan: PatchPlan,
           report: Report) -> tuple[Artifact, Report, dict[str, Any] | None]:
    """The stored artifact, with the report re-judged on its model/ when it is a variant (the stored
    smoke stands: it is reported as the stored one)."""
    _check_serve_plan(r, existing, prev)
    prev_report = json.loads((existing.path / REPORT_JSON).read_text())
    if not plan.empty or r.options.quantize:
        report = r.stages(verify_task, existing.path / MODEL_DIR, r.target, existing.content_digest.removeprefix("sha256:"))
        if prev.quantization:
            report = report.with_quantization(prev.quantization)
    _attach(existing.path / REPORT_MD, report)
    return existing, report.with_smoke(prev_report["smoke"]) if prev_report.get("smoke") else report, prev.smoke


def _check_serve_plan(r: _Run, existing: Artifact, prev: Manifest) -> None:
    """Serve options given explicitly (``--gpu``, ``--gpus``, ``--max-model-len``) must plan what the
    stored artifact's serve/ holds: reusing it would silently keep a plan for another host. Raises
    :class:`ArtifactConflictError` (exit 2) naming both plans."""
    o = r.options.serving
    if not (o.gpu or o.gpus or o.max_model_len):
        return
    wanted = serve_plan_task(existing.path / MODEL_DIR, o, r.name)
    if (wanted.to_dict() if wanted else None) == prev.serve:
        return

    def says(p: dict[str, Any] | None) -> str:
        return "no serve plan" if not p else f"{p['gpus']} x {p['gpu']}, max_model_len {p['max_model_len']}"

    raise ArtifactConflictError(
        f"{existing.name}@{existing.revision} is already in the store with serve/ for {says(prev.serve)}; "
        f"the options ask for {says(wanted.to_dict() if wanted else None)}",
        fix=f"Write serve files for that host with `modelyard serve-plan {existing.path} --gpu ... --gpus ... --write DIR`, "
            "or ingest under another --name.")


def _build(r: _Run, draft: Draft, revision: str, snap: Snapshot, plan: PatchPlan, files: tuple[FileEntry, ...],
           digest: str, report: Report, precopy: Path | None) -> tuple[Artifact, Report, dict[str, Any] | None]:
    """package → (verify the patched copy) → (quantize → verify → gates) → serve plan → smoke →
    report and manifest → commit."""
    model_dir = package_task(snap, draft, plan, r.settings, precopy / MODEL_DIR if precopy else None)
    if not plan.empty:
        report = r.stages.verify(model_dir, r.target, files)
        verify.gate(report, f"{snap.source} after patching")
    qrec = None
    if r.options.quantize:
        qres = quantize_task(model_dir, draft.path / "model.quantized", r.options.quantizing)
        files = draft.replace_model(draft.path / "model.quantized")
        digest = "sha256:" + tree_digest(files)
        qrec = qres.record()
        draft.add_quantization(qrec)
        report = quantize.judge(model_dir, qres, r.stages.verify(model_dir, r.target, files), r.options.runtime)
        verify.gate(report, f"{snap.source} quantized with {r.options.quantize}")
        quantize.quality_gate(qres, accept=r.options.accept_quality_loss)
    serve_plan = serve_plan_task(model_dir, r.options.serving, r.name)
    smoke_dict = None
    if r.options.smoking.level in ("server", "bench"):
        smoke_dict = smoke_server_task(model_dir, r.settings, r.options.smoking, serve_plan, r.name).to_dict()
    elif r.options.smoking.level == "load":
        smoke_dict = smoke_task(model_dir, r.settings, r.options.smoking).to_dict()
    if serve_plan is not None:
        write_serve_files(draft.path, serve_plan)
    if smoke_dict is not None:
        report = report.with_smoke(smoke_dict)
    report_json = report.to_json().encode()
    manifest = build_manifest(name=r.name, revision=revision, snapshot=snap, report=report, report_json=report_json,
                              smoke=smoke_dict, files=files, plan=plan, quantization=qrec,
                              serve=serve_plan.to_dict() if serve_plan else None)
    draft.add_metadata(manifest, report, report_json, title=f"{r.name}@{revision}")
    artifact = publish_task(draft, r.name, revision, digest)
    _attach(artifact.path / REPORT_MD, report)
    return artifact, report, smoke_dict


def findings_rows(report: Report) -> list[dict[str, str]]:
    """The report's findings as table rows (severity, code, file, field, value, message, fix): the
    ``ingest-findings`` Prefect table artifact. An empty report gives one ``info`` row saying so."""
    rows = [{"severity": f.severity.value, "code": f.code, "file": f.file or "", "field": f.field or "",
             "value": "" if f.value is None else str(f.value), "message": f.message, "fix": f.fix or ""}
            for f in report.findings]
    return rows or [{"severity": "info", "code": "report.clean", "file": "", "field": "", "value": "",
                     "message": "no findings", "fix": ""}]


def _attach(report_md: Path, report: Report) -> None:
    """Attach the Markdown report and the findings table to the flow run as Prefect artifacts."""
    try:
        from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: PLC0415 - heavy: prefect, imported on first use

        create_markdown_artifact(markdown=report_md.read_text(), key="ingest-report",
                                 description="modelyard verification and smoke report")
        create_table_artifact(table=findings_rows(report), key="ingest-findings",
                              description="modelyard findings: severity, code, file, field, value, message, fix")
    except Exception:  # the report is on disk; a Prefect API hiccup must not fail the ingest
        pass

"""The ``watch`` Prefect flow: ingest new revisions of hub repos, only when the model changed.

For each repo of a watch config (YAML)::

    repos:
      - repo: org/name            # on MODELYARD_HF_ENDPOINT / HF_ENDPOINT
        branch: main              # or revision: a tag or sha
        name: my-model            # artifact name (default: from the repo)
        options: {smoke: false, quantize: w4a16, publish: [oci://...]}   # IngestOptions fields
        no_smoke: true            # shorthand for options.smoke = false
        gpu_pool: a100            # the build holds a slot of the global concurrency limit `gpu-a100`

the branch head is resolved to a commit, and the file list (``list_repo_tree``, recursive: size, LFS
sha256 or git blob id) at the last *ingested* commit is compared with the one at the head. ``ingest_flow``
runs (as a subflow named ``repo@shortsha``) only when a model file changed: weights (``*.safetensors``
and their index), ``config.json``/``generation_config.json``, tokenizer files or the chat template.
Any other change (README, docs, images) is recorded and skipped.

State lives in the store, not in memory: ``<MODELYARD_HOME>/.watch/<org>--<name>.json`` (written
atomically: temp file + rename) holds the last ingested commit with its file list, the last seen
commit, and a bounded history of decisions.
"""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from modelyard.artifact.records import Record
from modelyard.errors import (
    EndpointUnreachableError,
    InvalidTargetError,
    SourceNotFoundError,
)
from modelyard.flows.ingest import ingest_flow, retry_on_network
from modelyard.flows.options import IngestOptions
from modelyard.settings import Settings
from modelyard.stages.fetch import RUNTIME_FILE_PATTERNS

#: files whose change means a new artifact (matched against the file's name, or its full path): the files a
#: runtime reads, which are all that model/ holds (:data:`modelyard.stages.fetch.RUNTIME_FILE_PATTERNS`)
MODEL_PATTERNS: tuple[str, ...] = RUNTIME_FILE_PATTERNS
_HISTORY = 50


def is_model_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in MODEL_PATTERNS)


@dataclass(frozen=True)
class WatchEntry:
    repo: str
    revision: str = "main"
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    gpu_pool: str | None = None  # the ingest holds one slot of Prefect's global concurrency limit gpu-<pool>

    def ingest_options(self) -> IngestOptions:
        return IngestOptions(**({"name": self.name} if self.name else {}), **self.options)


@dataclass(frozen=True)
class Decision:
    repo: str
    revision: str
    commit: str | None
    action: str  # ingested | skipped | unchanged | failed
    reason: str
    changed: tuple[str, ...] = ()
    artifact: str | None = None
    previous: str | None = None  # the last ingested commit compared against

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"changed": list(self.changed)}


def load_config(path: Path) -> list[WatchEntry]:
    """Parse a watch YAML; raises :class:`InvalidTargetError` (exit 2) naming the bad entry."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise SourceNotFoundError(f"cannot read watch config {path}: {exc.strerror}", fix="Check the --config path.") from exc
    except yaml.YAMLError as exc:
        raise InvalidTargetError(f"watch config {path} is not valid YAML: {exc}") from exc
    repos = data.get("repos") if isinstance(data, dict) else None
    if not isinstance(repos, list) or not repos:
        raise InvalidTargetError(f"watch config {path} has no `repos:` list", fix="See README, section Orchestration.")
    entries = []
    for i, r in enumerate(repos):
        if not isinstance(r, dict) or not isinstance(r.get("repo"), str) or r["repo"].count("/") != 1:
            raise InvalidTargetError(f"watch config {path}: repos[{i}] needs `repo: org/name`")
        opts = dict(r.get("options") or {})
        for k, v in r.items():
            if k in ("repo", "branch", "revision", "name", "options", "gpu_pool"):
                continue
            if k == "no_smoke":
                opts["smoke"] = not v
            elif k in IngestOptions.model_fields:
                opts[k] = v
            else:
                raise InvalidTargetError(f"watch config {path}: repos[{i}] has unknown key {k!r}",
                                         fix="Use repo, branch, name, no_smoke, gpu_pool, options, or an ingest option.")
        e = WatchEntry(repo=r["repo"], revision=str(r.get("branch") or r.get("revision") or "main"), name=r.get("name"),
                       options=opts, gpu_pool=str(r["gpu_pool"]) if r.get("gpu_pool") else None)
        try:
            e.ingest_options()
        except ValueError as exc:
            raise InvalidTargetError(f"watch config {path}: repos[{i}] ({e.repo}) has bad ingest options: {exc}") from exc
        entries.append(e)
    return entries


# --------------------------------------------------------------------------- state (in the store)


def state_path(home: Path, repo: str) -> Path:
    return Path(home) / ".watch" / (repo.replace("/", "--") + ".json")


class LastIngested(Record):
    """The last commit ingested (UTC ISO-8601 ``at``), its artifact's location and its file list
    (``path -> {size, sha256 | oid}``, :func:`list_files`), compared with when the history was rewritten."""

    commit: str
    at: str
    artifact: str | None = None
    files: dict[str, dict[str, Any]] = {}


class LastSeen(Record):
    """The last head commit judged (ingested, skipped or unchanged), when, and what was done."""

    commit: str
    at: str
    action: str


class WatchState(Record):
    """One repo's watch state file (``<home>/.watch/<org>--<name>.json``): the repo and branch watched, the last
    ingested and last seen commits, and the last decisions (:meth:`Decision.to_dict` plus ``at``, oldest first,
    at most 50)."""

    repo: str | None = None
    revision: str | None = None
    last_ingested: LastIngested | None = None
    last_seen: LastSeen | None = None
    history: tuple[dict[str, Any], ...] = ()


def read_state(home: Path, repo: str) -> WatchState:
    """The repo's state; an empty one when the file is missing, unreadable or not a state (the next ingest
    rewrites it)."""
    try:
        return WatchState.model_validate_json(state_path(home, repo).read_bytes())
    except (OSError, ValueError):
        return WatchState()


def write_state(home: Path, repo: str, state: WatchState) -> Path:
    """Atomically replace the repo's state file (temp file in the same folder + fsync + rename); keys whose
    value is None are left out."""
    doc = {k: v for k, v in state.to_dict().items() if v is not None}
    p = state_path(home, repo)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


# --------------------------------------------------------------------------- hub


def _api(settings: Settings):  # noqa: ANN202
    from huggingface_hub import HfApi  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    return HfApi(endpoint=settings.endpoint(), token=settings.token() or False)


def _hub_call(settings: Settings, repo: str, rev: str, fn):  # noqa: ANN001, ANN202
    import httpx  # noqa: PLC0415 - heavy: httpx, imported on first use
    from huggingface_hub.errors import (  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = settings.endpoint() or "https://huggingface.co"
    try:
        return fn(_api(settings))
    except (RevisionNotFoundError, RepositoryNotFoundError) as exc:
        raise SourceNotFoundError(f"repository {repo} at revision {rev!r} was not found on {where}",
                                  fix="Check the repo and branch in the watch config (and the token).") from exc
    except (httpx.TransportError, ConnectionError) as exc:
        raise EndpointUnreachableError(f"cannot reach the hub endpoint {where} ({type(exc).__name__})",
                                       fix="Check HF_ENDPOINT / MODELYARD_HF_ENDPOINT and the network.") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise EndpointUnreachableError(f"hub endpoint {where} answered HTTP {status} for {repo}@{rev}") from exc


@task(name="resolve-head", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=retry_on_network,
      cache_policy=NO_CACHE)
def resolve_head(repo: str, revision: str, settings: Settings) -> str:
    sha = _hub_call(settings, repo, revision, lambda api: api.model_info(repo, revision=revision).sha)
    if not sha:
        raise SourceNotFoundError(f"{repo}@{revision} did not resolve to a commit")
    return sha


@task(name="list-files", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=retry_on_network,
      cache_policy=NO_CACHE)
def list_files(repo: str, commit: str, settings: Settings) -> dict[str, dict[str, Any]]:
    """``path -> {size, sha256 | oid}`` at ``commit`` (LFS sha256 for LFS files, git blob id otherwise)."""
    tree = _hub_call(settings, repo, commit, lambda api: list(api.list_repo_tree(repo, revision=commit, recursive=True)))
    out: dict[str, dict[str, Any]] = {}
    for e in tree:
        if not hasattr(e, "blob_id"):
            continue  # a folder
        lfs = getattr(e, "lfs", None)
        out[e.path] = {"size": lfs.size if lfs else e.size, **({"sha256": lfs.sha256} if lfs else {"oid": e.blob_id})}
    return out


def diff_files(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """Paths added, removed or changed (size or digest) between two file lists."""
    return sorted(p for p in set(old) | set(new) if old.get(p) != new.get(p))


# --------------------------------------------------------------------------- flow


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _record(home: Path, entry: WatchEntry, state: WatchState, d: Decision,
            files: dict[str, dict[str, Any]] | None = None) -> None:
    at = _now()
    rec = {"at": at, **d.to_dict()}
    rec.pop("repo")
    last_ingested, last_seen, history = state.last_ingested, state.last_seen, state.history
    if d.action == "ingested" and d.commit is not None:
        last_ingested = LastIngested(commit=d.commit, at=at, artifact=d.artifact, files=files or {})
    if d.action in ("ingested", "skipped", "unchanged") and d.commit is not None:
        last_seen = LastSeen(commit=d.commit, at=at, action=d.action)
    if d.action != "unchanged":
        history = (*history, rec)[-_HISTORY:]
    write_state(home, entry.repo, WatchState(repo=entry.repo, revision=entry.revision, last_ingested=last_ingested,
                                             last_seen=last_seen, history=history))


def check_repo(entry: WatchEntry, settings: Settings, home: Path) -> Decision:
    """Decide for one repo, run the ingest if needed, and record the outcome in its state file. A repo the
    hub does not have (or cannot answer for), like one whose ingest fails, is a ``failed`` decision of its
    own: the other repos of the round are still checked."""

    state = read_state(home, entry.repo)
    last = state.last_ingested.commit if state.last_ingested else None
    try:
        head = resolve_head(entry.repo, entry.revision, settings)
    except (SourceNotFoundError, EndpointUnreachableError) as exc:  # this repo fails alone; the round goes on
        d = Decision(repo=entry.repo, revision=entry.revision, commit=None, previous=last, action="failed",
                     reason=f"hub: {exc.message}")
        _record(home, entry, state, d)
        return d
    decide = partial(Decision, repo=entry.repo, revision=entry.revision, commit=head, previous=last)
    if head == last or (state.last_seen is not None and state.last_seen.commit == head):
        d = decide(action="unchanged", reason=f"{entry.revision} is still at {head[:12]}")
        _record(home, entry, state, d)
        return d
    new_files = list_files(entry.repo, head, settings)
    if last is None:
        changed, reason = sorted(new_files), "first ingest of this repo"
    else:
        try:
            old_files = list_files(entry.repo, last, settings)
        except SourceNotFoundError:  # history rewritten: compare with the list recorded at ingest
            old_files = state.last_ingested.files if state.last_ingested else {}
        changed = diff_files(old_files, new_files)
        model = [p for p in changed if is_model_file(p)]
        if not model:
            d = decide(action="skipped", changed=tuple(changed),
                         reason=("no model file changed (" + ", ".join(changed[:5]) + ("" if len(changed) <= 5 else ", ...")
                                 + ")") if changed else "no file changed")
            _record(home, entry, state, d)
            return d
        reason = "model files changed: " + ", ".join(model[:5]) + ("" if len(model) <= 5 else f" and {len(model) - 5} more")
    ingest = ingest_flow.with_options(flow_run_name=f"{entry.repo}@{head[:7]}")
    try:
        result = ingest(f"hf://{entry.repo}@{head}", entry.ingest_options(), settings.store_spec(), entry.gpu_pool)
    except Exception as exc:  # noqa: BLE001 - one repo's failure must not stop the others
        msg = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        d = decide(action="failed", changed=tuple(changed), reason=f"ingest failed: {msg}")
        _record(home, entry, state, d)
        return d
    d = decide(action="ingested", changed=tuple(changed), reason=reason, artifact=result.artifact.location)
    _record(home, entry, state, d, files=new_files)
    return d


@flow(name="watch", log_prints=False, validate_parameters=False)
def watch_flow(config: str, home: str | None = None) -> list[Decision]:
    """Check every repo of the watch YAML at ``config`` once; ingest the changed ones into the store
    ``home`` (a folder or ``s3://bucket/prefix``; default MODELYARD_STORE, else MODELYARD_HOME). The
    watch state lives in the local store folder (``MODELYARD_HOME``, or ``home`` when it is a folder)."""
    settings = Settings.for_store(home)
    return [check_repo(e, settings, settings.store_dir()) for e in load_config(Path(config))]

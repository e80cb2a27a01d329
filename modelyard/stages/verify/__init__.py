"""verify: judge a model folder (or an artifact folder) and gate on the result.

``verify_folder`` runs the check registry over a :class:`~modelyard.model.checkpoint.Checkpoint`. Given an
artifact folder (``manifest.json`` + ``model/``) it judges ``model/`` and also re-hashes every file
against the manifest (``artifact.file_*`` findings): the custody chain (docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import MANIFEST, PATCHES, REPORT_JSON, is_artifact
from modelyard.artifact.manifest import Manifest, base_beside
from modelyard.artifact.report_record import ReportRecord
from modelyard.checks import CheckContext, Finding, Report, Severity, Target, run_checks
from modelyard.checks.adapter import check_adapter, read_adapter
from modelyard.checks.base import require_judged
from modelyard.errors import (
    InvalidSourceError,
    InvalidTargetError,
    SourceNotFoundError,
    VerificationFailedError,
)
from modelyard.model.checkpoint import Checkpoint
from modelyard.model.digest import file_digest
from modelyard.model.snapshot import Snapshot
from modelyard.model.source import Source
from modelyard.settings import Settings
from modelyard.stages.verify.runtime import OracleRun, defer_to_loader, reconcile, runtime_findings


def listing_digest(path: Path | str) -> str:
    """SHA256 (hex) over every entry under ``path``: relative path, kind and size in bytes (files
    through symlinks, as the checks see them). With the tree digest of the files the checks read (their
    content), this is what a cached verify result depends on: a stray file outside the snapshot's list
    (a ``.bin`` beside the shards, a new sub-folder) changes the key. Times are left out on purpose, so
    the same files staged again give the same key. A missing folder hashes as empty."""
    h = hashlib.sha256()
    root = Path(path)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(filenames) + [d + "/" for d in dirnames]:
            p = os.path.join(dirpath, n.rstrip("/"))
            try:
                st = os.stat(p)
                size = 0 if n.endswith("/") else st.st_size  # a folder's own size varies by filesystem
                h.update(f"{os.path.relpath(p, root)}\0{st.st_mode >> 12}\0{size}\n".encode())
            except OSError:
                h.update(f"{os.path.relpath(p, root)}\0broken\n".encode())
    return h.hexdigest()


#: values of ``verify --runtime``: ``none`` (hand rules only) or ``local`` (also ask the runtime venv's vLLM).
RUNTIME_CHOICES = ("none", "local")


def verify_folder(path: Path | str, target: Target | None = None, *, runtime: str | None = None,
                  settings: Settings | None = None, runtime_answer: Any = None) -> Report:
    """Judge the model folder ``path`` against ``target``; returns a Report (never raises for
    findings). ``runtime="local"`` also asks the runtime venv's vLLM (``runtime.*`` findings and the
    ``runtime.disagrees.*`` comparison, see :mod:`modelyard.stages.verify.runtime`). Raises
    :class:`SourceNotFoundError` / :class:`InvalidSourceError` (exit 2) when ``path`` is missing or not a
    folder, :class:`InvalidTargetError` (exit 2) for an unknown ``runtime``, :class:`RuntimeNotFoundError`
    (exit 2) when ``runtime="local"`` and the runtime interpreter is missing. ``settings`` (the run's: the runtime
    interpreter) is required with ``runtime="local"`` unless ``runtime_answer`` is given (``TypeError`` else).
    ``runtime_answer`` (a :class:`~modelyard.stages.verify.runtime.RuntimeAnswer` already asked, e.g. by
    ``ask_runtime_many`` for many folders) is used instead of asking again."""
    if runtime not in (None, *RUNTIME_CHOICES):
        raise InvalidTargetError(f"--runtime {runtime!r} is not one of {', '.join(RUNTIME_CHOICES)}",
                                 fix="Use --runtime local (ask the installed vLLM) or --runtime none.")
    root = Path(path)
    target = target or Target()
    if not root.exists():
        raise SourceNotFoundError(f"{root} does not exist", fix="Pass the model folder (the one with config.json).")
    if not root.is_dir():
        raise InvalidSourceError(f"{root} is not a folder", fix="Pass the model folder (the one with config.json).")
    extra: list[Finding] = []
    if is_artifact(root):
        extra = _check_against_manifest(root)
        root = root / "model"
    elif (root / PATCHES).is_file() and (root / "model").is_dir():  # a `modelyard patch` output
        root = root / "model"
    ckpt = Checkpoint(root)
    if ckpt.special_files:  # reading any of them could block or read a device: judge nothing else
        special = [Finding("files.not_regular", Severity.ERROR,
                           f"{rel} is a {kind}, not a regular file; modelyard does not read it (it could block or "
                           "read a device)", file=rel, value=kind,
                           fix="Replace it with the real file, or remove it from the model folder.",
                           source="modelyard: a model folder holds regular files only")
                   for rel, kind in ckpt.special_files]
        return Report(findings=tuple(extra + special), target=target)
    oracle = None
    if runtime == "local" and runtime_answer is None:  # vLLM imports while the hand rules run
        if settings is None:
            raise TypeError("verify_folder(runtime='local') needs settings: the run's Settings")
        oracle = OracleRun([(root, target)], settings)
    try:
        findings = extra + run_checks(ckpt, CheckContext(target=target))
    except BaseException:
        if oracle is not None:
            oracle.answers(timeout=0.01)  # stop and clean up
        raise
    answer = runtime_answer if runtime_answer is not None else oracle.answers()[0] if oracle is not None else None
    if answer is not None:
        found = runtime_findings(answer, target)
        findings = defer_to_loader(findings, answer) + found + reconcile(findings, found, answer.vllm_version)
    return Report(findings=tuple(require_judged(findings, target)), target=target)


def _check_against_manifest(artifact: Path) -> list[Finding]:

    try:
        manifest = Manifest.load(artifact)
        if "files" not in manifest.present:
            raise KeyError("files")
        entries = manifest.files
    except (ValueError, KeyError) as exc:
        return [Finding("artifact.manifest_invalid", Severity.ERROR, f"manifest.json is unreadable: {exc}",
                        file=MANIFEST, fix="Re-publish the artifact.", source="modelyard artifact format")]
    out = []
    listed = set()
    for e in entries:
        rel = e.path
        listed.add(rel)
        p = artifact / rel
        if not p.is_file():
            out.append(Finding("artifact.file_missing", Severity.ERROR, f"{rel} is listed in manifest.json but missing",
                               file=rel, fix="Restore the artifact from its bundle or re-publish it.", source="modelyard manifest"))
            continue
        d = file_digest(p)  # no cache: verifying an artifact means reading its bytes again
        sha, size = d.sha256, d.size
        if sha != e.sha256 or size != e.size:
            out.append(Finding("artifact.file_modified", Severity.ERROR,
                               f"{rel}: expected sha256 {e.sha256} ({e.size} bytes), got {sha} ({size} bytes)",
                               file=rel, value=sha, fix="The artifact was modified or corrupted; restore or re-publish it.",
                               source="modelyard manifest (per-file sha256)"))
    for p in sorted((artifact / "model").rglob("*")):
        rel = p.relative_to(artifact).as_posix()
        if p.is_file() and rel not in listed:
            out.append(Finding("artifact.file_unlisted", Severity.ERROR, f"{rel} is not listed in manifest.json",
                               file=rel, fix="Remove the stray file or re-publish the artifact.", source="modelyard manifest"))
    return out


def source_findings(snapshot: Snapshot) -> list[Finding]:
    """What the source itself says about its files: one ``source.hash_unverifiable`` warning per file
    the source listed without a digest it vouches for (a gated repo's redacted or missing LFS sha256 /
    git oid: :attr:`FileEntry.unverifiable`). Such a file is hashed and recorded with origin
    ``unverified``; it is neither a mismatch nor verified."""
    return [Finding("source.hash_unverifiable", Severity.WARNING,
                    f"{path}: {snapshot.source} lists it without a hash it vouches for (redacted or missing, as gated "
                    "repos may answer), so its bytes cannot be checked against the hub; its sha256 is the one computed here",
                    file=path, fix="Use a token with access to the repo so that the hub lists the file's LFS sha256, or "
                    "compare the sha256 in manifest.json with one the publisher gives.",
                    source="hub tree API (lfs.oid / oid), huggingface_hub list_repo_tree")
            for path in snapshot.unverifiable]


def with_source_findings(report: Report, snapshot: Snapshot) -> Report:
    """``report`` with :func:`source_findings` of ``snapshot`` appended."""
    extra = source_findings(snapshot)
    return replace(report, findings=report.findings + tuple(extra)) if extra else report


def verify_source(source: Source, target: Target | None = None, *, runtime: str | None = None,
                  settings: Settings) -> Report:
    """Judge an ``hf://`` source before downloading its weights: :func:`verify_folder` on its small
    files and its shards' headers read by HTTP range (:func:`modelyard.stages.fetch.preview`), plus
    :func:`source_findings`. The checks read nothing else of a shard, so the findings are those a
    verify of the downloaded folder gives. Raises as :func:`modelyard.stages.fetch.fetch` does
    (exit 2 for a missing repo or an unreachable endpoint). ``settings``: the run's (the hub endpoint and token, the
    cache, the runtime interpreter)."""
    from modelyard.stages.fetch import preview  # noqa: PLC0415 - the fetch stage (and huggingface_hub) only for hub sources

    return preview(source, settings,
                   lambda snap: with_source_findings(verify_folder(snap.root, target, runtime=runtime, settings=settings), snap))


def carried_verdict_holds(artifact: Path) -> None:
    """Refuse an artifact folder (a pull's or an unbundle's, before it is renamed into place) whose carried verdict
    says "passed" while its ``model/`` fails today's static checks against its report's target: a bundle or
    remote copy edited (a config changed, the digests recomputed, the old claims kept) would otherwise be shown as
    "verification: passed". The files' digests are the transfer's to check (every file was hashed on its way in), so
    only ``model/`` is judged here (no runtime), and an error the carried report lists under the same code and file
    (at any severity: the ingest's runtime may have weighed it, as vLLM's dry load makes some errors warnings) is
    not counted. A carried "failed" verdict needs no check.

    Raises :class:`VerificationFailedError` (exit 1) naming the first errors; :class:`ManifestError` (exit 2) for a
    manifest that cannot be read."""
    from modelyard.errors import ManifestError  # noqa: PLC0415

    try:
        m = Manifest.load(artifact)
    except OSError as exc:
        raise ManifestError(f"{artifact}: manifest.json cannot be read ({exc})",
                            fix="Publish or bundle the artifact again from its store.") from exc
    if not m.verification.passed or not (artifact / "model").is_dir():
        return
    try:  # the carried report: its target, and what it already weighed (an error vLLM's dry load made a warning)
        carried = ReportRecord.from_bytes((artifact / REPORT_JSON).read_bytes()).to_report()
    except (OSError, ValueError):
        carried = Report(findings=())
    target = replace(carried.target, require_judged=False)  # no runtime runs here: nothing to judge
    if m.is_lora:  # model/ is an adapter: judged against its base, when the base is beside it as in a store
        report = _adapter_now(artifact, m, target)
        if report is None:
            return
    else:
        report = verify_folder(artifact / "model", target, runtime=None)
    seen = {(f.code, f.file) for f in carried.findings}
    errs = tuple(f for f in report.errors if (f.code, f.file) not in seen)
    if not errs:
        return
    first = "; ".join(f"[{f.code}] {f.message}" for f in errs[:3])
    raise VerificationFailedError(
        f"{m.name}@{m.revision}: its manifest says verification passed, but its model/ fails {len(errs)} check(s) "
        f"now: {first}; the carried verdict does not belong to these files, so nothing was kept", report=report,
        fix="Someone edited the artifact after it was verified: get it from a trusted store, or sign artifacts and "
            "pull/unbundle with --key.")


def _adapter_now(artifact: Path, m: Manifest, target: Target) -> Report | None:
    """A LoRA artifact's adapter judged now (:func:`~modelyard.checks.adapter.check_adapter`) against the base its
    manifest names, found beside it as the store and a publish with its base keep it
    (``../../<base>/<revision>``, the same content digest); None when that base is not there (an adapter's shapes
    mean nothing without it: ``pull --key`` is then what vouches for the files)."""
    assert m.base is not None
    base_dir, digest = base_beside(artifact, m)
    if digest != m.base.digest:
        return None
    found = check_adapter(read_adapter(artifact / "model"), Checkpoint(base_dir / "model"))
    return Report(findings=tuple(found), target=target)


def gate(report: Report, what: str, ignore: frozenset[str] = frozenset()) -> None:
    """Raise :class:`VerificationFailedError` (exit 1) when ``report`` has errors whose code is not
    in ``ignore`` (the codes a patch plan is about to repair)."""
    errs = tuple(f for f in report.errors if f.code not in ignore)
    if not errs:
        return
    first = "; ".join(f"[{f.code}] {f.message}" for f in errs[:3])
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    raise VerificationFailedError(f"verification of {what} found {len(errs)} error(s): {first}{more}", report=report,
                                  fix="Fix the findings listed in the report (each names its fix) and run again.")

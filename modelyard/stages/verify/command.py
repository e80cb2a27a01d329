"""``verify`` as a stage, for the two kinds of source it reads: a hub source judged from its small files and shard
headers before any weight byte (:func:`verify_before_download`), and a local model or artifact folder
(:func:`verify_local`). The ingest's own gate before the weights is the flow's (``flows/preflight.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelyard.artifact.manifest import source_record
from modelyard.checks import Report, Target
from modelyard.model.snapshot import Snapshot
from modelyard.model.source import Source
from modelyard.settings import Settings
from modelyard.stages import fetch, serve, verify
from modelyard.stages.fetch.preflight import CARD_FILE, card_license, refuse_license


def verify_before_download(source: Source, target: Target, *, runtime: str | None = None,
                           refuse_licenses: Sequence[str] = (), serving: serve.ServeTarget | None = None,
                           settings: Settings) -> Report:
    """``verify hf://...``: the judgement the ingest makes before its first weight byte, on the source's small files
    and shard headers (:func:`modelyard.stages.fetch.preview`, HTTP ranges): the card's license, refused when
    ``refuse_licenses`` names it (:func:`~modelyard.stages.fetch.preflight.refuse_license`, exit 1) and recorded in the
    report's ``source`` record; with ``serving`` (``--gpu``/``--gpus``), the serve plan of weights + KV cache at
    ``--max-model-len`` (:func:`modelyard.stages.serve.plan_serve`, :class:`ServePlanError` exit 2 when it does not
    fit); then :func:`modelyard.stages.verify.verify_folder` and the source's findings. ``settings``: the run's (the
    hub endpoint and token, the cache, the runtime interpreter)."""

    def judge(snap: Snapshot) -> Report:
        refuse_license(snap.provenance, refuse_licenses, snap.source)
        if serving is not None:
            serve.plan_serve(snap.root, serving, name=snap.source)
        report = verify.verify_folder(snap.root, target, runtime=runtime, settings=settings)
        return verify.with_source_findings(report, snap).with_source(source_record(snap))

    return fetch.preview(source, settings, judge)


def verify_local(folder: Path, target: Target, *, runtime: str | None = None, refuse_licenses: Sequence[str] = (),
                 serving: serve.ServeTarget | None = None, settings: Settings) -> Report:
    """``verify FOLDER``: as :func:`verify_before_download` for a model or artifact folder, the license read from its
    own model card (``README.md``, when it has one)."""
    if refuse_licenses:
        card = folder / CARD_FILE
        try:
            prov = card_license(card.read_text("utf-8", "replace")) if card.is_file() else {}
        except OSError:
            prov = {}
        refuse_license(prov, refuse_licenses, str(folder))
    if serving is not None:
        serve.plan_serve(folder, serving, name=str(folder))
    return verify.verify_folder(folder, target, runtime=runtime, settings=settings)

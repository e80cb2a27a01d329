"""The ingest's first gate for a hub source (:class:`GateBeforeWeights`), run by the fetch before any weight
byte is downloaded: what the checkpoint's small files and shard headers already answer is answered there."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelyard.checks import Report, Target
from modelyard.errors import ModelyardError
from modelyard.flows.options import IngestOptions, PatchOptions, ServeOptions
from modelyard.model.patchplan import PatchPlan
from modelyard.model.snapshot import Snapshot
from modelyard.settings import Settings
from modelyard.stages import patch, quantize, serve, verify
from modelyard.stages.fetch.preflight import nearest_existing, refuse_license, require_space
from modelyard.stages.smoke import warmup


def plan_patches(root: Path, report: Report, options: PatchOptions) -> PatchPlan:
    """The repairs of ``root`` judged by ``report`` (empty when patching is off)."""
    if not options.patch:
        return PatchPlan()
    return patch.plan_patches(root, report, add_special_tokens=options.add_special_tokens,
                              chat_template=Path(options.chat_template) if options.chat_template else None)


@dataclass(frozen=True)
class GateBeforeWeights:
    """The ingest's first gate for a hub source, called by the fetch with a Snapshot of the small files and
    each shard's header, before any weight byte is downloaded. In order, each refusal ending the run:

    1. the card's license, when ``refuse_licenses`` names it (:func:`~modelyard.stages.fetch.preflight.refuse_license`,
       exit 1);
    2. with ``--gpu``/``--gpus`` and no ``--quantize``: the serve plan (weights + KV cache at ``--max-model-len``
       on those GPUs, :func:`modelyard.stages.serve.plan_serve`, which reads config.json and the shard headers
       only) must fit, else :class:`ServePlanError` (exit 2). A quantized variant is planned after quantizing;
    3. verify the folder against ``target`` and plan the repairs (as the ``plan-patches`` task); errors the plan
       does not repair raise :class:`VerificationFailedError` (exit 1). Hand rules only (the runtime oracle, when
       on, runs in the full verify);
    4. with ``--quantize``: the quantize stage's own RAM and disk preflight
       (:func:`modelyard.stages.quantize.preflight`, exit 2).

    Returns what else the run will write beside the download, ``(folder, bytes, what)``: the quantized variant
    under the staging folder, and ``model/`` itself when the staging folder is on another filesystem than the hub
    cache (else it is hard-linked from there). The fetch adds its download and refuses what does not fit
    (:func:`~modelyard.stages.fetch.preflight.require_space`)."""

    target: Target
    patching: PatchOptions
    serving: ServeOptions = ServeOptions()
    quantize: str | None = None
    refuse_licenses: tuple[str, ...] = ()
    staging: Path | None = None
    cache: Path | None = None

    @classmethod
    def of(cls, options: IngestOptions, settings: Settings) -> GateBeforeWeights:
        return cls(options.target(), options.patching, options.serving, options.quantize,
                   tuple(options.refuse_licenses or ()), settings.staging_dir(), settings.cache_dir())

    def __call__(self, snapshot: Snapshot) -> Sequence[tuple[Path, int, str]]:
        refuse_license(snapshot.provenance, self.refuse_licenses, snapshot.source)
        if (self.serving.gpu or self.serving.gpus) and not self.quantize:
            serve.plan_serve(snapshot.root, serve.ServeTarget(gpu=self.serving.gpu or serve.DEFAULT_GPU,
                                                              gpus=self.serving.gpus or 1,
                                                              max_model_len=self.serving.max_model_len),
                            name=snapshot.source)  # the refusal names what was asked for
        warmup.wait()
        report = verify.verify_folder(snapshot.root, self.target)
        plan = plan_patches(snapshot.root, report, self.patching)
        verify.gate(report, f"{snapshot.source} before its weights were downloaded (config, tokenizer, safetensors "
                    "headers)", ignore=patch.repaired_codes(plan))
        needs: list[tuple[Path, int, str]] = []
        if self.staging is None:
            return needs
        if self.quantize:
            pf = quantize.preflight(snapshot.root, quantize.scheme(self.quantize), self.staging)
            needs.append((self.staging, pf.disk_needed, f"the {self.quantize} variant"))
        if self.cache is not None and os.stat(nearest_existing(self.staging)).st_dev != os.stat(nearest_existing(self.cache)).st_dev:
            needs.append((self.staging, snapshot.total_bytes, "the artifact's model/"))
        return needs

    def after_fetch(self, snapshot: Snapshot, *, local: bool) -> None:
        """What is judged once the snapshot is there, however it came (a cached or a local fetch too): the
        license refusal, and for a ``local`` folder (``file://``, copied while it is hashed) the free disk
        for that copy (``snapshot.total_bytes``) and the quantized variant, on the staging filesystem
        (:func:`~modelyard.stages.fetch.preflight.require_space`, :class:`InsufficientResourcesError`, exit 2),
        before the first byte is copied. A variant this model cannot have is refused later, by the quantize
        stage, as before."""
        refuse_license(snapshot.provenance, self.refuse_licenses, snapshot.source)
        if not local or self.staging is None:
            return
        needs = [(self.staging, snapshot.total_bytes, "the copy of model/")]
        if self.quantize:
            try:
                pf = quantize.preflight(snapshot.root, quantize.scheme(self.quantize), self.staging)
                needs.append((self.staging, pf.disk_needed, f"the {self.quantize} variant"))
            except ModelyardError:
                pass
        require_space(needs)

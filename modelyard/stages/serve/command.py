"""``serve-plan`` as a stage: from a model or artifact folder and a :class:`ServeTarget`, the plan and, with an
output folder, the serve/ files that carry it (compose, nginx, canary, Ray scripts, Kubernetes manifests). The CLI
resolves store references and prints; the rules of what may be written where live here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from modelyard.artifact.layout import is_artifact, model_root
from modelyard.errors import InvalidTargetError
from modelyard.stages.adapter import ADAPTERS_DIR, LoraServing, lora_serving
from modelyard.stages.serve.canary import write_canary_files
from modelyard.stages.serve.files import (
    ADAPTERS_DIR_MOUNT,
    MODEL_DIR_MOUNT,
    ServeFiles,
    vllm_config,
    write_serve_files,
)
from modelyard.stages.serve.k8s import K8sFiles, VerifyOnLoad, verify_on_load, write_k8s_files
from modelyard.stages.serve.k8s import manifests as k8s_manifests
from modelyard.stages.serve.options import VerifyOnLoadFlags
from modelyard.stages.serve.plan import ServePlan, ServeTarget, plan_serve


@dataclass(frozen=True)
class ServePlanRequest:
    """What ``serve-plan`` was asked. ``path``: a model or artifact folder (store references already resolved);
    ``dest``: the folder whose serve/ is written (None, or ``write=False``: the plan is only printed);
    ``dest_in_store``: ``dest`` lies in a local store (never rewritten); ``adapters``, ``canary``: folders or
    store references, resolved by ``resolve`` only when they are used; ``canary_percent``: 0-100 of a KServe
    InferenceService's traffic for this revision."""

    path: Path
    target: ServeTarget
    resolve: Callable[[Path], Path]
    name: str | None = None
    dest: Path | None = None
    write: bool = True
    dest_in_store: bool = False
    proxy: bool = False
    k8s: bool = False
    storage_uri: str | None = None
    adapters: tuple[Path, ...] = ()
    canary: Path | None = None
    canary_percent: int | None = None
    verify_on_load: VerifyOnLoadFlags | None = None


@dataclass(frozen=True)
class ServePlanOutcome:
    """The plan (its notes say what was not written and why), the serve/ files written (or None), the
    Kubernetes files (or None) and the canary's plan (or None)."""

    plan: ServePlan
    written: ServeFiles | None = None
    kube: K8sFiles | None = None
    canary: ServePlan | None = None
    verify: VerifyOnLoad | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON with ``serve_dir``, ``k8s_dir`` and ``storage_uri`` (docs/reference/json.md)."""
        return self.plan.to_dict() | {"serve_dir": str(self.written.dir) if self.written else None,
                                      "k8s_dir": str(self.kube.dir) if self.kube else None,
                                      "storage_uri": self.kube.storage_uri if self.kube else None}


def _note(plan: ServePlan, text: str) -> ServePlan:
    return replace(plan, notes=(*plan.notes, text))


def _check(req: ServePlanRequest, plan: ServePlan, lora: LoraServing | None, verify: VerifyOnLoad | None,
           k8s: bool) -> None:
    """Refuse, before anything is written, what cannot be served as asked (each an :class:`InvalidTargetError`)."""
    if k8s and lora:
        raise InvalidTargetError("serve/k8s does not carry LoRA adapters yet (the pod would not find them)",
                                 fix="Drop --k8s/--storage-uri/--verify-from; serve/compose.yaml serves the adapters.")
    if k8s:  # refuse a bad location or a multi-node plan before anything is written
        k8s_manifests(plan, vllm_config(plan), model_bytes=0, storage=req.storage_uri, verify=verify,
                      canary_percent=req.canary_percent)
    elif req.canary_percent is not None:
        raise InvalidTargetError("--canary-percent splits the traffic of a KServe InferenceService, which needs "
                                 "--storage-uri", fix="Add --storage-uri (where the artifact was published).")
    if req.canary_percent is not None and not req.name:
        # KServe splits traffic between revisions of ONE InferenceService; named after the candidate, the plan would
        # be a second InferenceService at 100 % (and a model name the stable one's clients do not send)
        raise InvalidTargetError("--canary-percent makes a new revision of the stable InferenceService, so it needs "
                                 "that service's name", fix="Add --served-model-name <the stable InferenceService's "
                                 "name> (also the model name its clients send).")


def serve_plan(req: ServePlanRequest) -> ServePlanOutcome:
    """Plan ``req.path`` for ``req.target`` (:func:`plan_serve`; a LoRA artifact or ``req.adapters``: the base's
    plan with the adapters' serve keys) and, when ``req.dest`` is given and ``req.write``, write
    ``dest/serve/`` (and ``dest/serve/k8s/`` with ``k8s``, ``storage_uri`` or ``verify_on_load``).

    serve/ names the model relative to ``dest`` (``../model`` when ``dest/model`` exists, else a mount variable),
    never this host's path, because serve/ is copied to other hosts. An artifact is never rewritten: without
    ``dest`` the plan says so in a note. Raises :class:`InvalidTargetError` (exit 2) for ``--canary`` without an
    output folder, an output inside the store, Kubernetes with LoRA adapters, a traffic split without a KServe
    service or its name; what :func:`plan_serve`, :func:`lora_serving` and the Kubernetes manifests raise."""
    lora = lora_serving(req.path, [req.resolve(a) for a in req.adapters])
    plan = plan_serve(lora.base_model if lora else req.path, req.target,
                      name=req.name or (lora.base_name if lora else None))
    vol = req.verify_on_load
    verify = None if vol is None or vol.verify_from is None else verify_on_load(
        vol.verify_from, name=plan.served_model_name, require_signature=vol.require_signature,
        key_secret=vol.signing_key_secret, image=vol.verifier_image, registry_secret=vol.registry_secret)
    dest = req.dest if req.write else None
    canary_path, proxy = None, req.proxy
    if req.canary is not None:
        if dest is None:
            raise InvalidTargetError("--canary writes the canary form of serve/, which needs --output DIR",
                                     fix="Add --output DIR.")
        canary_path, proxy = req.resolve(req.canary), True
    if dest is not None and req.dest_in_store:
        raise InvalidTargetError(f"--output {dest} is inside the store, whose artifacts are never rewritten",
                                 fix="Pass --output a folder outside the store (its serve/ then points at the "
                                     "stored model/).")
    if req.dest is None and is_artifact(req.path) and req.write:
        plan = _note(plan, f"serve/ not written: {req.path} is an artifact, never rewritten (its serve/ is the one "
                     "it was ingested with); pass --output DIR to write this plan")
    k8s = req.k8s or req.storage_uri is not None or verify is not None
    _check(req, plan, lora, verify, k8s)
    cplan = None if canary_path is None else plan_serve(canary_path, req.target, name=plan.served_model_name)
    if dest is None:
        return ServePlanOutcome(plan, canary=cplan, verify=verify)
    mount = "../model" if (dest / "model").is_dir() else MODEL_DIR_MOUNT
    if lora:  # adapters: serve/ runs DIR/model (the base) with DIR/adapters/NAME
        adapters = f"../{ADAPTERS_DIR}" if (dest / ADAPTERS_DIR).is_dir() else ADAPTERS_DIR_MOUNT
        written = write_serve_files(dest, plan, model_mount=mount, proxy=proxy, overrides=lora.overrides,
                                    adapters_mount=adapters)
        links = [("model", lora.base_model), *((f"{ADAPTERS_DIR}/{n}", p) for n, p in lora.adapters)]
        missing = [f"ln -s {p} {dest}/{d}" for d, p in links if not (dest / d).is_dir()]
        if missing:
            plan = _note(plan, f"serve/ runs the base at DIR/model with the adapters at DIR/{ADAPTERS_DIR}/NAME; "
                         f"link them there ({'; '.join(missing)}), or set MODEL_DIR and ADAPTERS_DIR for compose")
    else:
        written = write_serve_files(dest, plan, model="model", model_mount=mount, proxy=proxy)
    if cplan is not None:
        write_canary_files(written.dir, vllm_config(cplan, model="model"))
    if mount != "../model" and not lora:  # said here, not in serve/README.md (which travels)
        plan = _note(plan, f"{dest}/model is missing: serve/ runs the model at DIR/model (vllm.yaml: model: model). "
                     f"Link or copy it there (ln -s {model_root(req.path).resolve()} {dest}/model), or set MODEL_DIR "
                     "for compose")
    kube = None
    if k8s:
        mdir = model_root(req.path)
        kube = write_k8s_files(dest, plan, yaml.safe_load(written.vllm_yaml.read_text()), storage=req.storage_uri,
                               model_bytes=sum(p.stat().st_size for p in mdir.rglob("*") if p.is_file()),
                               verify=verify, canary_percent=req.canary_percent)
    return ServePlanOutcome(plan, written, kube, cplan, verify)

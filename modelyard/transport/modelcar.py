"""modelcar: push an artifact's model as a KServe ModelCar image (``publish --flavour modelcar``).

KServe's ``oci://`` storage does not read a ModelPack artifact (:mod:`.oci`): it runs the image as a
sidecar and links its ``/models`` folder to ``/mnt/models`` in the serving container. A ModelCar is a
runnable image, so it needs a base: the minimal one shipped in the PyPI package ``modelcar-base-image``
(an OCI layout for linux/amd64 and linux/arm64 whose entrypoint makes that link and waits). ``olot``
("OCI layers on top") adds **one uncompressed tar layer per file of** ``model/`` at ``/models/<path>``,
with no Docker engine.

Custody: olot hashes each file while it writes its tar and records the digest on the layer
(``olot.layer.content.digest``); every one must equal ``manifest.json``'s sha256 for that file, or
nothing is pushed. The layer digest itself is the sha256 of the tar (the registry checks it on upload).
The push sends the blobs, then each platform's image manifest by digest, then the image index under the
tag, so the tag appears only when everything it names is there. The same stored artifact always gives the
same image digest (:func:`_pin_history`). Registries, credentials and plain HTTP
on loopback are as for :mod:`.oci`.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.errors import HashMismatchError, PublishError
from modelyard.settings import Settings
from modelyard.transport._transfer import LocalArtifact, PublishResult
from modelyard.transport.modelpack import annotations_of
from modelyard.transport.oci import DEFAULT_CHUNK, OciRef, check_response, push_target, upload_layer

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
IMAGE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
#: olot's layer annotations: the sha256 of the file that went into the tar, and its path in the image
CONTENT_DIGEST = "olot.layer.content.digest"
IN_LAYER_PATH = "olot.layer.content.inlayerpath"
MODELS_DIR = "/models"  # where KServe's ModelCar support expects the model inside the image
FLAVOURS = ("modelpack", "modelcar")


def build_layout(art: LocalArtifact, layout: Path) -> dict[str, str]:
    """Write the ModelCar OCI image layout of ``art`` into the new folder ``layout``: the base image, plus
    one tar layer per ``model/`` file. Returns ``{path in the image: file sha256}`` as olot hashed it.

    Raises :class:`HashMismatchError` naming the file when a file's bytes no longer match
    ``manifest.json`` (it changed after ingest), :class:`PublishError` when the artifact has no model files."""
    from modelcar_base_image.embedded_oci_layout import embedded_oci_layout  # noqa: PLC0415 - heavy: olot and its base image, imported on first use
    from olot.basics import oci_layers_on_top  # noqa: PLC0415 - heavy: olot's pydantic models, imported on first use

    model = [f for f in art.files if f.rel.startswith("model/")]
    if not model:
        raise PublishError(f"{art.root} has no files under model/", fix="Publish an artifact made by `modelyard ingest`.")
    embedded_oci_layout(layout)
    m = art.manifest
    annotations = {k: v for k, v in annotations_of(art).items() if k != "org.opencontainers.image.title"}
    annotations["org.opencontainers.image.title"] = f"{m.name} (ModelCar)"
    with progress.task(f"ModelCar layers ({len(model)} files)", total=sum(f.size for f in model)) as adv:
        oci_layers_on_top(layout, [f.path for f in model], root_dir=art.root / "model", annotations=annotations,
                          labels={"dev.modelyard.content-digest": m.content_digest})
        adv(sum(f.size for f in model))
    _pin_history(layout, (m.created_at or "1970-01-01T00:00:00Z").replace("+00:00", "Z"))
    hashed: dict[str, str] = {}
    for man in _image_manifests(layout):
        for lay in man["layers"]:
            ann = lay.get("annotations") or {}
            if IN_LAYER_PATH in ann:
                hashed[ann[IN_LAYER_PATH]] = str(ann.get(CONTENT_DIGEST, "")).removeprefix("sha256:")
    for f in model:
        where = f"{MODELS_DIR}/{f.rel.removeprefix('model/')}"
        if hashed.get(where) != f.sha256:
            raise HashMismatchError(f"{f.rel}: the bytes read into the ModelCar layer have sha256 {hashed.get(where)}, "
                                    f"manifest.json records {f.sha256}",
                                    fix="The artifact changed after it was made: run `modelyard verify` on it and "
                                        "re-ingest the model.")
    if set(hashed) != {f"{MODELS_DIR}/{f.rel.removeprefix('model/')}" for f in model}:
        raise PublishError(f"the ModelCar layers hold {sorted(hashed)}, not the files of model/",
                           fix="Report this: the image builder wrote unexpected layers.")
    return hashed


def _pin_history(layout: Path, created: str) -> None:
    """Make the image a function of the stored files: olot stamps the history entry of each layer it adds
    with the time it wrote the tar, so a republish would make new configs (and a new index digest). Set those
    to ``created`` (the artifact's creation time) and rewrite the configs, manifests and index that name them."""
    entry = _root_index(layout)
    index = _json(layout, entry["digest"])
    for desc in index["manifests"]:
        man = _json(layout, desc["digest"])
        cfg = _json(layout, man["config"]["digest"])
        for h in cfg.get("history") or []:
            if str(h.get("created_by", "")).startswith("olot "):
                h["created"] = created
        man["config"]["digest"], man["config"]["size"] = _put_blob(layout, cfg)
        desc["digest"], desc["size"] = _put_blob(layout, man)
    entry["digest"], entry["size"] = _put_blob(layout, index)
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))


def _put_blob(layout: Path, doc: dict[str, Any]) -> tuple[str, int]:
    data = json.dumps(doc, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(layout, digest).write_bytes(data)
    return digest, len(data)


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _json(layout: Path, digest: str) -> dict[str, Any]:
    return json.loads(_blob(layout, digest).read_bytes())


def _root_index(layout: Path) -> dict[str, Any]:
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    return entry


def _image_manifests(layout: Path) -> list[dict[str, Any]]:
    entry = _root_index(layout)
    refs = _json(layout, entry["digest"])["manifests"] if entry["mediaType"] == INDEX_MEDIA_TYPE else [entry]
    return [_json(layout, r["digest"]) for r in refs]


def _put_manifest(client, target: OciRef, reference: str, data: bytes, media_type: str, what: str):  # noqa: ANN001, ANN202
    """PUT the exact bytes (their sha256 is the digest the index names) as ``media_type``."""
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use

    container = client.get_container(f"{target.repo}{'@' if reference.startswith('sha256:') else ':'}{reference}")
    try:
        r = client.do_request(f"{client.prefix}://{container.manifest_url()}", "PUT", data=data,
                              headers={"Content-Type": media_type})
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise PublishError(f"{target}: uploading {what} failed ({type(exc).__name__})",
                           fix="Check the registry (running, free space), then publish again.") from exc
    check_response(r, what, target)
    return r


def publish_modelcar(artifact_dir: str | Path, ref: str, *, settings: Settings, insecure: bool | None = None,
                     chunk_size: int = DEFAULT_CHUNK, home: Path | None = None) -> PublishResult:
    """Build the ModelCar image of the artifact (folder or store reference ``NAME[@REV]``) and push it to
    ``ref`` (``oci://host[:port]/repo[:tag]``; the tag defaults to the artifact's revision).

    ``PublishResult.digest`` is the image index's digest: ``oci://host/repo@<digest>`` is the exact
    ``storageUri`` for KServe. Raises :class:`PublishError` (exit 2) for a malformed reference, an
    unreachable or refusing registry; :class:`HashMismatchError` (exit 1) naming a file whose bytes differ
    from ``manifest.json``."""
    # the registry is reached (or refused) before the layers are written
    target, art, client, container, _ = push_target(artifact_dir, ref, settings=settings, insecure=insecure, home=home)
    skipped = 0
    with tempfile.TemporaryDirectory(prefix="modelyard-modelcar-") as td:
        layout = Path(td) / "layout"
        build_layout(art, layout)
        entry = _root_index(layout)
        mans = _json(layout, entry["digest"])["manifests"] if entry["mediaType"] == INDEX_MEDIA_TYPE else [entry]
        blobs: dict[str, dict[str, Any]] = {}
        for desc in mans:
            man = _json(layout, desc["digest"])
            for b in (man["config"], *man["layers"]):
                blobs.setdefault(b["digest"], b)
        total = sum(b["size"] for b in blobs.values())
        with progress.task(f"pushing ModelCar to {target}", total=total) as adv:
            for digest, b in blobs.items():
                what = (b.get("annotations") or {}).get(IN_LAYER_PATH) or f"blob {digest}"
                skipped += upload_layer(client, container, _blob(layout, digest), b, what, target, chunk_size) is None
                adv(b["size"])
        for desc in mans if entry["mediaType"] == INDEX_MEDIA_TYPE else []:
            _put_manifest(client, target, desc["digest"], _blob(layout, desc["digest"]).read_bytes(), desc["mediaType"],
                          f"the {desc.get('platform', {}).get('architecture', '')} image manifest")
        top = _blob(layout, entry["digest"]).read_bytes()
        r = _put_manifest(client, target, target.tag or "latest", top, entry["mediaType"], "the image index")
    digest = r.headers.get("Docker-Content-Digest") or entry["digest"]
    if digest != entry["digest"]:
        raise PublishError(f"{target}: the registry stored the index as {digest}, not {entry['digest']}",
                           fix="Use a registry that keeps manifests byte for byte (OCI distribution).")
    model_files = [f for f in art.files if f.rel.startswith("model/")]
    return PublishResult(uri=f"oci://{target.host}/{target.repo}:{target.tag}", files=len(model_files),
                         bytes=sum(f.size for f in model_files), content_digest=art.manifest.content_digest,
                         digest=digest, skipped=skipped)


__all__ = ["publish_modelcar", "build_layout", "FLAVOURS", "MODELS_DIR", "CONTENT_DIGEST", "IN_LAYER_PATH"]

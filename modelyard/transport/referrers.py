"""OCI 1.1 referrers: the signature and the attestations of a pushed artifact, as manifests whose
``subject`` is the artifact's manifest, so that registries, ``oras discover``, cosign/notation tooling
and admission controllers find them by the artifact's digest.

Pushed by ``publish --to oci://`` after the artifact's manifest:

- the model-signing bundle (``model.sig``), ``artifactType`` :data:`SIGSTORE_BUNDLE`;
- the verification report (``report.json``) and the smoke evidence (the manifest's ``smoke`` record) as
  in-toto Statements v1 (``artifactType`` :data:`IN_TOTO`, predicate types :data:`VERIFICATION_PREDICATE`
  and :data:`SMOKE_PREDICATE`) whose subject is the artifact manifest's digest.

Each referrer is an image manifest with the empty config (``application/vnd.oci.empty.v1+json``), one
layer and ``subject``. A registry that implements the referrers API answers ``GET
/v2/<name>/referrers/<digest>`` and says so with the ``OCI-Subject`` header when a referrer is pushed;
for one that does not (the distribution registry 2.x), the referrers tag schema is kept as the spec
says: an image index tagged ``sha256-<hex of the subject digest>`` lists the referrers' descriptors.
:func:`discover` reads either, as ``oras discover`` does.

Source: OCI distribution spec v1.1 ("Listing Referrers", "Referrers Tag Schema", "Pushing Manifests
with Subject"); OCI image spec v1.1 (``artifactType``, ``subject``, the empty descriptor); in-toto
Statement v1; Sigstore bundle media type ``application/vnd.dev.sigstore.bundle.v0.3+json``."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from modelyard.artifact.layout import REPORT_JSON, SIGNATURE
from modelyard.artifact.report_record import ReportRecord
from modelyard.errors import PublishError
from modelyard.transport._transfer import LocalArtifact

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
EMPTY_DESCRIPTOR = {"mediaType": EMPTY_MEDIA_TYPE, "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(), "size": 2}
SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
IN_TOTO = "application/vnd.in-toto+json"
IN_TOTO_STATEMENT = "https://in-toto.io/Statement/v1"
VERIFICATION_PREDICATE = "https://modelyard.dev/attestations/verification/v1"
SMOKE_PREDICATE = "https://modelyard.dev/attestations/smoke/v1"
#: the annotation naming what a referrer holds (``signature``, ``verification``, ``smoke``)
KIND = "dev.modelyard.referrer"
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class Referrer:
    """One referrer's descriptor: its manifest ``digest`` and ``size`` (bytes), ``artifact_type`` and
    ``annotations`` (``kind`` is :data:`KIND`'s value)."""

    digest: str
    size: int
    artifact_type: str | None
    annotations: dict[str, str]

    @property
    def kind(self) -> str | None:
        return self.annotations.get(KIND)


def statement(subject_name: str, subject_digest: str, predicate_type: str, predicate: Any) -> bytes:
    """An in-toto Statement v1 (canonical JSON bytes) about ``subject_digest`` (``sha256:<hex>``)."""
    doc = {"_type": IN_TOTO_STATEMENT, "subject": [{"name": subject_name, "digest": {"sha256": subject_digest[7:]}}],
           "predicateType": predicate_type, "predicate": predicate}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


#: attempts of one registry request that fails to connect, times out or answers 5xx, and the seconds slept before
#: the second and third: with each attempt bounded by the session's timeout (``MODELYARD_REGISTRY_TIMEOUT``), a
#: request gives up after 3 timeouts + 3 s (oras' own retry, 5 attempts with 2+3^n s of sleep, waited over 2 min)
REQUEST_ATTEMPTS = 3
REQUEST_BACKOFF_S = (1.0, 2.0)


def registry_request(client: Any, url: str, method: str = "GET", **kw: Any) -> Any:
    """``client.do_request(url, method, **kw)`` (oras: the registry's auth handled) within this module's retry budget
    (:data:`REQUEST_ATTEMPTS`) instead of oras' own. Returns the response (a 5xx after the last attempt too);
    raises what requests raises after the last attempt."""
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use

    once = getattr(type(client).do_request, "__wrapped__", None)  # oras.provider's undecorated method
    for attempt in range(REQUEST_ATTEMPTS):
        last = attempt == REQUEST_ATTEMPTS - 1
        try:
            r = once(client, url, method, **kw) if once is not None else client.do_request(url, method, **kw)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout):
            if last:
                raise
        else:
            if r.status_code < 500 or last:
                return r
            r.close()
        time.sleep(REQUEST_BACKOFF_S[min(attempt, len(REQUEST_BACKOFF_S) - 1)])
    raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises


def _request(client: Any, url: str, method: str, what: str, **kw: Any) -> Any:
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use

    try:
        return registry_request(client, url, method, **kw)
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise PublishError(f"{url}: {what} failed ({type(exc).__name__})",
                           fix="Check that the registry is running, then publish again.") from exc


def _base(client: Any, container: Any) -> str:
    return f"{client.prefix}://{container.registry}/v2/{container.api_prefix}"


def put_blob(client: Any, container: Any, data: bytes, what: str) -> dict[str, Any]:
    """Upload ``data`` as a blob (unless the registry has it); returns ``{digest, size}``."""
    desc = {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}
    head = _request(client, f"{_base(client, container)}/blobs/{desc['digest']}", "HEAD", f"checking {what}")
    if head.status_code == 200:
        return desc
    start = _request(client, f"{_base(client, container)}/blobs/uploads/", "POST", f"starting the upload of {what}")
    if start.status_code not in (201, 202) or "Location" not in start.headers:
        raise PublishError(f"the registry refused the upload of {what}: HTTP {start.status_code}",
                           fix="Check the registry's logs, then publish again.")
    loc = start.headers["Location"]
    if loc.startswith("/"):
        loc = f"{client.prefix}://{container.registry}{loc}"
    sep = "&" if "?" in loc else "?"
    done = _request(client, f"{loc}{sep}digest={desc['digest']}", "PUT", f"uploading {what}", data=data,
                    headers={"Content-Type": "application/octet-stream"})
    if done.status_code != 201:
        raise PublishError(f"the registry refused {what}: HTTP {done.status_code}",
                           fix="Check the registry's logs, then publish again.")
    return desc


def put_manifest(client: Any, container: Any, reference: str, body: bytes, media_type: str, what: str) -> Any:
    """PUT ``body`` (exact bytes: the digest is theirs) as the manifest ``reference`` (a tag or digest)."""
    r = _request(client, f"{_base(client, container)}/manifests/{reference}", "PUT", f"pushing {what}", data=body,
                 headers={"Content-Type": media_type})
    if r.status_code != 201:
        raise PublishError(f"the registry refused {what}: HTTP {r.status_code} {r.text[:200]}",
                           fix="Check the registry's logs, then publish again.")
    return r


def subject_of(client: Any, container: Any, digest: str) -> dict[str, Any]:
    """The descriptor (``mediaType``, ``digest``, ``size``) of the manifest ``digest`` as the registry serves it."""
    r = _request(client, f"{_base(client, container)}/manifests/{digest}", "GET", "reading the artifact manifest",
                 headers={"Accept": MANIFEST_MEDIA_TYPE})
    if r.status_code != 200 or "sha256:" + hashlib.sha256(r.content).hexdigest() != digest:
        raise PublishError(f"the registry does not serve the manifest {digest} it just stored",
                           fix="Check the registry, then publish again.")
    return {"mediaType": MANIFEST_MEDIA_TYPE, "digest": digest, "size": len(r.content)}


def push_referrer(client: Any, container: Any, subject: dict[str, Any], *, artifact_type: str, blob: bytes,
                  title: str, kind: str, created: str | None = None) -> Referrer:
    """Push ``blob`` as a referrer of ``subject`` (the artifact manifest's descriptor) and, when the registry
    has no referrers API, add it to the referrers tag index. Returns its descriptor."""
    put_blob(client, container, EMPTY, "the empty config")
    layer = {"mediaType": artifact_type, **put_blob(client, container, blob, title), "annotations": {TITLE: title}}
    annotations = {KIND: kind, **({"org.opencontainers.image.created": created} if created else {})}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "artifactType": artifact_type,
                "config": EMPTY_DESCRIPTOR, "layers": [layer], "subject": subject, "annotations": annotations}
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    r = put_manifest(client, container, digest, body, MANIFEST_MEDIA_TYPE, f"the {kind} referrer")
    ref = Referrer(digest, len(body), artifact_type, annotations)
    if r.headers.get("OCI-Subject") != subject["digest"]:  # no referrers API: keep the tag schema's index
        _add_to_tag_index(client, container, subject["digest"], ref)
    return ref


def tag_of(subject_digest: str) -> str:
    """The referrers tag schema's tag for ``subject_digest``: ``sha256-<hex>``."""
    alg, _, hexd = subject_digest.partition(":")
    return f"{alg}-{hexd}"


def _descriptor(ref: Referrer) -> dict[str, Any]:
    return {"mediaType": MANIFEST_MEDIA_TYPE, "digest": ref.digest, "size": ref.size,
            "artifactType": ref.artifact_type, "annotations": ref.annotations}


def _add_to_tag_index(client: Any, container: Any, subject_digest: str, ref: Referrer) -> None:
    current = _tag_index(client, container, subject_digest)
    manifests = [m for m in current if m.get("digest") != ref.digest] + [_descriptor(ref)]
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}
    put_manifest(client, container, tag_of(subject_digest), json.dumps(index, separators=(",", ":")).encode(),
                 INDEX_MEDIA_TYPE, "the referrers index")


def _tag_index(client: Any, container: Any, subject_digest: str) -> list[dict[str, Any]]:
    r = _request(client, f"{_base(client, container)}/manifests/{tag_of(subject_digest)}", "GET",
                 "reading the referrers index", headers={"Accept": INDEX_MEDIA_TYPE})
    if r.status_code != 200:
        return []
    try:
        doc = r.json()
    except ValueError:
        return []
    return [m for m in doc.get("manifests") or [] if isinstance(m, dict)] if isinstance(doc, dict) else []


def discover(client: Any, container: Any, subject_digest: str) -> list[Referrer]:
    """The referrers of ``subject_digest``: the referrers API's answer, else the tag schema's index
    (``sha256-<hex>``), as ``oras discover`` reads them. Descriptors without a sha256 digest are skipped."""
    r = _request(client, f"{_base(client, container)}/referrers/{subject_digest}", "GET", "listing the referrers",
                 headers={"Accept": INDEX_MEDIA_TYPE})
    manifests: list[dict[str, Any]]
    if r.status_code == 200:
        try:
            doc = r.json()
            manifests = [m for m in doc.get("manifests") or [] if isinstance(m, dict)]
        except (ValueError, AttributeError):
            manifests = []
    else:
        manifests = _tag_index(client, container, subject_digest)
    return [Referrer(str(m["digest"]), int(m.get("size") or 0), m.get("artifactType"),
                     {str(k): str(v) for k, v in (m.get("annotations") or {}).items()})
            for m in manifests if str(m.get("digest", "")).startswith("sha256:")]


def fetch_layer(client: Any, container: Any, ref: Referrer, limit: int = 16 << 20) -> bytes:
    """The single layer of the referrer ``ref``, checked against the manifest's and the layer's digests.
    Raises :class:`PublishError` for a referrer that is not one small layer or whose bytes differ."""
    r = _request(client, f"{_base(client, container)}/manifests/{ref.digest}", "GET", "reading a referrer",
                 headers={"Accept": MANIFEST_MEDIA_TYPE})
    if r.status_code != 200 or "sha256:" + hashlib.sha256(r.content).hexdigest() != ref.digest:
        raise PublishError(f"the referrer {ref.digest} is missing or does not match its digest",
                           fix="Publish the artifact again.")
    layers = r.json().get("layers") or []
    if len(layers) != 1 or int(layers[0].get("size") or 0) > limit:
        raise PublishError(f"the referrer {ref.digest} is not one layer of at most {limit} bytes",
                           fix="Publish the artifact again with `modelyard publish`.")
    b = _request(client, f"{_base(client, container)}/blobs/{layers[0]['digest']}", "GET", "reading a referrer's layer")
    if b.status_code != 200 or "sha256:" + hashlib.sha256(b.content).hexdigest() != layers[0]["digest"]:
        raise PublishError(f"the layer of the referrer {ref.digest} does not match its digest",
                           fix="Do not trust this registry's copy; publish the artifact again.")
    return b.content


def push_evidence(client, container, art: LocalArtifact, digest: str) -> tuple[str, ...]:  # noqa: ANN001
    """Push the artifact's signature (``model.sig``), its verification report and its smoke evidence as OCI 1.1
    referrers of the manifest ``digest`` (:mod:`modelyard.transport.referrers`); returns their kinds."""
    subject = subject_of(client, container, digest)
    name = art.manifest.name or art.root.name
    out = []
    sig = art.root / SIGNATURE
    if sig.is_file():
        push_referrer(client, container, subject, artifact_type=SIGSTORE_BUNDLE,
                                blob=sig.read_bytes(), title=SIGNATURE, kind="signature", created=art.manifest.created_at)
        out.append("signature")
    report = art.root / REPORT_JSON
    record = ReportRecord.from_bytes(report.read_bytes()) if report.is_file() else None
    if record is not None:
        body = statement(name, digest, VERIFICATION_PREDICATE, record.to_dict())
        push_referrer(client, container, subject, artifact_type=IN_TOTO, blob=body,
                                title="verification.intoto.json", kind="verification", created=art.manifest.created_at)
        out.append("verification")
    smoke = record.smoke if record is not None and record.smoke is not None else art.manifest.smoke
    if smoke is not None:  # from the report (which the signature covers) where it has one
        body = statement(name, digest, SMOKE_PREDICATE, smoke.to_dict())
        push_referrer(client, container, subject, artifact_type=IN_TOTO, blob=body,
                                title="smoke.intoto.json", kind="smoke", created=art.manifest.created_at)
        out.append("smoke")
    return tuple(out)

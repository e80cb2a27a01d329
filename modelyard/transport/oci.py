"""oci: push an artifact to an OCI registry as a CNCF ModelPack artifact, and pull it back.

One **raw layer per file** (no tar, no compression), so each layer's digest is the file's SHA256:
``manifest.json``'s sha256 for ``model/x`` = the layer digest of ``model/x`` (the custody chain of
docs/architecture.md). The registry checks every blob's digest on upload, so a file that changed since it was
hashed is refused there, and each byte is read once (never hashed again here).

- ``artifactType`` ``application/vnd.cncf.model.manifest.v1+json``; config blob
  ``application/vnd.cncf.model.config.v1+json`` (ModelPack config schema: descriptor, config with
  architecture/format/paramSize/precision/quantization, modelfs.diffIds = the layer digests);
- layers: ``application/vnd.cncf.model.weight.v1.raw`` (weights: ``*.safetensors``, ...),
  ``application/vnd.cncf.model.weight.config.v1.raw`` (the rest of ``model/``: config, tokenizer,
  chat template, safetensors index), ``application/vnd.cncf.model.doc.v1.raw`` (``manifest.json``,
  reports, ``serve/``, ``model.sig``, patches, ...); each annotated with
  ``org.opencontainers.image.title`` (and ModelPack's ``org.cncf.model.filepath``) = the relative path;
- manifest annotations: ``org.opencontainers.image.{title,version,revision,source,created}`` and
  ``dev.modelyard.{content-digest,source.commit,quantization}``.

Files over ``chunk_size`` (16 MiB) go up in chunks (POST, PATCH per chunk, PUT) that a killed publish continues
(:mod:`.oci_upload`), the rest in one PUT; :data:`LAYER_CONCURRENCY` layers at once.
Pull fetches the manifest, checks every layer title (no ``..``,
no absolute path) and that the layers are exactly manifest.json's files (same sha256) plus the others, streams
each blob to a temp folder while hashing it (a big blob as ranged GETs, several in flight, when the registry
answers ``Range``) and renames the folder into place when everything matched.

Registries on 127.0.0.1/localhost are spoken to in plain HTTP (``insecure``); others over HTTPS.
Credentials come from ``MODELYARD_REGISTRY_USER``/``MODELYARD_REGISTRY_PASSWORD`` and never appear
in messages.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.artifact.layout import MANIFEST, SIGNATURE
from modelyard.errors import HashMismatchError, PublishError, SignatureError
from modelyard.settings import Settings
from modelyard.transport import referrers
from modelyard.transport._streams import RANGE_PART, ordered_parts, skip_bytes
from modelyard.transport._transfer import PublishResult, PullResult, Staging, check_rel, parse_listing
from modelyard.transport.modelpack import TITLE, annotations_of, model_config
from modelyard.transport.oci_upload import Upload, upload_blob
from modelyard.transport.refs import load_artifact
from modelyard.transport.signing import verify_signature

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
FILEPATH = "org.cncf.model.filepath"
DEFAULT_CHUNK = 16 * 1024 * 1024
#: layers (files) pushed at once; each layer's chunks go up in order, as the OCI distribution spec asks
LAYER_CONCURRENCY = 4
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_FIX_REF = "Write it as oci://HOST[:PORT]/REPO[:TAG] (or @sha256:DIGEST to pull), e.g. oci://127.0.0.1:5000/models/tiny:v1."


@dataclass(frozen=True)
class OciRef:
    host: str  # host[:port]
    repo: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str | None:
        return self.digest or self.tag

    def __str__(self) -> str:
        ref = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        return f"oci://{self.host}/{self.repo}{ref}"


def parse_oci_ref(uri: str) -> OciRef:
    """``oci://host[:port]/repo[:tag|@sha256:...]`` → :class:`OciRef`; raises :class:`PublishError`."""
    if not uri.startswith("oci://"):
        raise PublishError(f"{uri!r} is not an oci:// reference", fix=_FIX_REF)
    rest = uri[len("oci://"):]
    host, _, path = rest.partition("/")
    if not host or not path or "@" in host:
        raise PublishError(f"{uri!r} has no registry host or repository (credentials do not belong in the URI)",
                           fix=_FIX_REF)
    digest = tag = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST_RE.match(digest):
            raise PublishError(f"{uri!r}: {digest!r} is not a sha256 digest", fix=_FIX_REF)
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG_RE.match(tag):
            raise PublishError(f"{uri!r}: {tag!r} is not a valid tag (letters, digits, . _ -; up to 128)", fix=_FIX_REF)
    if not _REPO_RE.match(path):
        raise PublishError(f"{uri!r}: {path!r} is not a valid repository name (lowercase letters, digits, "
                           "separators . _ - and /)", fix=_FIX_REF)
    return OciRef(host, path, tag, digest)


def media_type(rel: str) -> str:
    """The ModelPack layer media type of the artifact file ``rel``."""
    if rel.startswith("model/"):
        return WEIGHT_RAW if rel.endswith(WEIGHT_SUFFIXES) else WEIGHT_CONFIG_RAW
    return DOC_RAW


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return name in ("localhost", "[::1]") or name.startswith("127.")


def _client(ref: OciRef, insecure: bool | None, settings: Settings):  # noqa: ANN202
    import oras.client  # noqa: PLC0415 - heavy: oras, imported on first use
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use

    insecure = _is_loopback(ref.host) if insecure is None else insecure
    client = oras.client.OrasClient(hostname=ref.host, insecure=insecure)
    silence = float(getattr(settings, "registry_timeout", None) or DEFAULT_SILENCE_S)
    _bounded(client.session, silence)
    creds = settings.registry_credentials() if settings is not None else None
    if creds is not None:
        client.auth.set_basic_auth(*creds)
    scheme = "http" if insecure else "https"
    try:  # fail fast: oras retries a refused connection for about two minutes
        r = client.session.get(f"{scheme}://{ref.host}/v2/", timeout=10)
    except requests.exceptions.SSLError as exc:
        raise PublishError(f"oci://{ref.host}: TLS handshake failed",
                           fix="Use a registry with a valid certificate (plain HTTP is used for 127.0.0.1 and localhost "
                               "only).") from exc
    except requests.exceptions.RequestException as exc:
        raise PublishError(f"oci://{ref.host}: the registry cannot be reached ({type(exc).__name__})",
                           fix="Check the host and port, and that the registry is running.") from exc
    if r.status_code not in (200, 401):
        raise PublishError(f"oci://{ref.host}/v2/ answered HTTP {r.status_code}; it does not look like an OCI registry",
                           fix="Point at the registry's host:port (the one that serves /v2/).")
    if r.status_code == 401 and r.headers.get("WWW-Authenticate", "").lower().startswith("basic"):
        # A registry with HTTP basic auth (distribution's htpasswd): oras' default token backend would take the
        # challenge's realm for a token service URL; its basic backend sends the credentials with each request.
        if creds is None:
            raise PublishError(f"oci://{ref.host} requires a login (HTTP basic auth) and no credentials are set",
                               fix="Set MODELYARD_REGISTRY_USER and MODELYARD_REGISTRY_PASSWORD for this registry.")
        client = oras.client.OrasClient(hostname=ref.host, insecure=insecure, auth_backend="basic")
        _bounded(client.session, silence)
        client.auth.set_basic_auth(*creds)
    return client


#: seconds a registry may stay silent when no settings say otherwise (``MODELYARD_REGISTRY_TIMEOUT``)
DEFAULT_SILENCE_S = 60.0


def _bounded(session, seconds: float) -> None:  # noqa: ANN001 - a requests.Session
    """Give every request of ``session`` (oras sends none itself) a connect and read timeout of ``seconds``: the
    read timeout bounds each wait for the next bytes of an answer, so a stalled registry fails the transfer
    (requests' ``timeout``; a streamed body raises urllib3's ``ReadTimeoutError`` from ``raw.read``)."""
    request = session.request

    def timed(method, url, **kwargs):  # noqa: ANN001, ANN202
        kwargs.setdefault("timeout", (seconds, seconds))
        return request(method, url, **kwargs)

    session.request = timed
    session.modelyard_silence_s = seconds


def check_response(r, what: str, ref: OciRef, *, fix: str | None = None) -> None:  # noqa: ANN001
    if r.status_code in (200, 201, 202):
        return
    codes = ""
    try:
        errs = r.json().get("errors") or []
        codes = ", ".join(f"{e.get('code')}: {e.get('message')}" for e in errs if isinstance(e, dict))
    except ValueError:
        pass
    if r.status_code in (401, 403):
        fix = fix or "Set MODELYARD_REGISTRY_USER and MODELYARD_REGISTRY_PASSWORD for this registry."
    raise PublishError(f"{ref}: the registry refused {what}: HTTP {r.status_code}" + (f" ({codes})" if codes else ""),
                       fix=fix or "Check the registry's logs and free space, then publish again.")


def push_target(artifact_dir: str | Path, ref: str, *, settings: Settings, insecure: bool | None = None,
                home: Path | None = None):  # noqa: ANN201
    """What a push needs: ``(target OciRef with its tag, LocalArtifact, oras client, container, the settings)``. The tag
    defaults to the artifact's revision. Raises :class:`PublishError` for a digest reference, an artifact
    that does not match its manifest, or an unreachable registry (checked before any work)."""
    target = parse_oci_ref(ref)
    if target.digest:
        raise PublishError(f"{ref}: a push needs a tag, not a digest", fix=_FIX_REF)
    art = load_artifact(artifact_dir, home, settings=settings)
    if target.tag is None:
        rev = art.manifest.revision or "latest"
        target = OciRef(target.host, target.repo, rev if _TAG_RE.match(rev) else "latest", None)
    client = _client(target, insecure, settings)
    return target, art, client, client.get_container(f"{target.repo}:{target.tag}"), settings


def publish_oci(artifact_dir: str | Path, ref: str, *, settings: Settings, insecure: bool | None = None,
                chunk_size: int = DEFAULT_CHUNK, home: Path | None = None) -> PublishResult:
    """Push the artifact (folder or store reference ``NAME[@REV]``) to ``ref``
    (``oci://host[:port]/repo[:tag]``; the tag defaults to the artifact's revision).

    Raises :class:`PublishError` (exit 2) when the reference is malformed, the registry is unreachable
    or refuses a blob (a file whose bytes no longer match its sha256 is refused by the registry's
    digest check and named in the message)."""
    target, art, client, container, settings = push_target(artifact_dir, ref, settings=settings, insecure=insecure,
                                                           home=home)
    entries = [(MANIFEST, len(art.manifest_bytes), _sha(art.manifest_bytes), None)]
    entries += [(f.rel, f.size, f.sha256, f.path) for f in art.files]
    layers: list[dict[str, Any]] = [{"mediaType": media_type(rel), "digest": f"sha256:{sha}", "size": size,
               "annotations": {TITLE: rel, FILEPATH: rel}} for rel, size, sha, _ in entries]
    config_bytes = json.dumps(model_config(art, [lay["digest"] for lay in layers]), sort_keys=True,
                              separators=(",", ":")).encode()
    journal = settings.cache_dir() / "oci-uploads"
    with tempfile.TemporaryDirectory(prefix="modelyard-oci-") as td:
        small = Path(td)
        (small / MANIFEST).write_bytes(art.manifest_bytes)
        (small / "config.json").write_bytes(config_bytes)
        with progress.task(f"pushing to {target}", total=art.total_bytes + len(config_bytes)) as adv:
            config_layer = {"mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{_sha(config_bytes)}",
                            "size": len(config_bytes)}
            ups = [upload_layer(client, container, small / "config.json", config_layer, "the ModelPack config blob",
                                target, chunk_size, journal)]
            adv(len(config_bytes))
            pool = ThreadPoolExecutor(max_workers=LAYER_CONCURRENCY, thread_name_prefix="modelyard-oci-layer")
            try:  # layers go up side by side (each one's chunks in order, as the protocol asks)
                futures = [pool.submit(upload_layer, client, container, path or small / MANIFEST, layer, rel, target,
                                       chunk_size, journal) for (rel, _size, _sha256, path), layer in zip(entries, layers)]
                for fut, (_rel, size, _sha256, _path) in zip(futures, entries):
                    ups.append(fut.result())
                    adv(size)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "artifactType": ARTIFACT_TYPE,
                    "config": config_layer, "layers": layers, "annotations": annotations_of(art)}
        r = client.upload_manifest(manifest, container)
        check_response(r, "the image manifest", target)
    digest = r.headers.get("Docker-Content-Digest") or ""
    pushed = referrers.push_evidence(client, container, art, digest) if digest else ()
    restarted = tuple(str(e[0]) for e, up in zip([("the ModelPack config blob",), *entries], ups) if up and up.forgotten)
    return PublishResult(uri=f"oci://{target.host}/{target.repo}:{target.tag}", files=len(entries),
                         bytes=art.total_bytes, content_digest=art.manifest.content_digest, digest=digest or None,
                         skipped=sum(u is None for u in ups), sent=sum(u.sent for u in ups if u), referrers=pushed,
                         restarted=restarted)


def attach_oci(artifact_dir: str | Path, ref: str, *, settings: Settings, home: Path | None = None) -> PublishResult:
    """Push the artifact's signature and attestations (:func:`~modelyard.transport.referrers.push_evidence`) as OCI 1.1 referrers of the
    manifest already at ``ref`` (a tag or ``@sha256:`` digest), pushing no layer: for an artifact signed after
    it was published. That manifest must be this artifact's (its ``dev.modelyard.content-digest`` annotation and
    its manifest.json layer, the same bytes), else :class:`PublishError` (exit 2) names both; an artifact
    without ``model.sig`` is refused the same way, before any request."""
    src = parse_oci_ref(ref)
    if src.reference is None:
        raise PublishError(f"{ref}: say which pushed manifest to attach to (a tag or @sha256:...)", fix=_FIX_REF)
    art = load_artifact(artifact_dir, home, settings=settings)
    if not (art.root / SIGNATURE).is_file():  # its attestations were pushed with it: only a signature is new
        raise PublishError(f"{art.root} has no signature ({SIGNATURE}): --referrers-only attaches a signature made "
                           "after publishing, and there is none; nothing was attached",
                           fix=f"Sign it first (`modelyard sign {art.root}`), then publish --referrers-only again.")
    client = _client(src, None, settings)
    container = client.get_container(f"{src.repo}@{src.digest}" if src.digest else f"{src.repo}:{src.tag}")
    manifest, digest = _get_manifest(client, container, src)
    theirs = (manifest.get("annotations") or {}).get("dev.modelyard.content-digest")
    layer: dict[str, Any] = next((lay for lay in manifest.get("layers", []) if (lay.get("annotations") or {}).get(TITLE) == MANIFEST), {})
    ours = art.manifest.content_digest
    if theirs != ours or layer.get("digest") != f"sha256:{_sha(art.manifest_bytes)}":
        said = (f"holds content {theirs or 'not from modelyard'}, not this artifact's {ours}" if theirs != ours else
                f"holds the same content ({ours}) under another manifest.json (another revision or origin)")
        raise PublishError(f"{src} {said}; nothing was attached",
                           fix="Attach to the manifest this artifact was published as (`modelyard publish` prints it).")
    pushed = referrers.push_evidence(client, container, art, digest)
    return PublishResult(uri=f"oci://{src.host}/{src.repo}@{digest}", files=0, bytes=0,
                         content_digest=art.manifest.content_digest, digest=digest, referrers=pushed)


def upload_layer(client, container, path: Path, layer: dict, what: str, ref: OciRef, chunk_size: int,  # noqa: ANN001
                 journal: Path | None = None) -> Upload | None:
    """Upload one blob unless the registry has it (None then); a big one in chunks that a killed publish continues
    (:func:`~modelyard.transport.oci_upload.upload_blob`, its session kept under ``journal``). The registry checks
    the digest."""
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use

    try:
        if client.blob_exists(layer, container):
            return None
        up = upload_blob(client, container, path, layer, chunk_size=chunk_size, journal=journal) \
            if layer["size"] > chunk_size else Upload(client.put_upload(str(path), container, layer), layer["size"])
    except OSError as exc:
        raise PublishError(f"{ref}: cannot read {what} ({exc.strerror or exc})",
                           fix="Check that the artifact folder is readable.") from exc
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise PublishError(f"{ref}: uploading {what} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                           fix="Check the registry (running, free space), then publish again.") from exc
    if up.response.status_code == 400 and "DIGEST_INVALID" in up.response.text:
        raise HashMismatchError(f"{ref}: the registry refused {what}: its bytes do not match sha256 "
                                f"{layer['digest'][7:]} recorded in manifest.json",
                                fix="The artifact changed after it was made: run `modelyard verify` on it and "
                                    "re-ingest the model.")
    check_response(up.response, what, ref)
    return up


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pull_oci(ref: str, into: Path, *, public_key: Path | str | None = None, settings: Settings,  # noqa: C901
             insecure: bool | None = None, allow_partial: bool = False,
             check: Callable[[Path], None] | None = None) -> PullResult:
    """Pull ``ref`` (``oci://host/repo:tag`` or ``@sha256:...``) into the new folder ``into``, checking
    every blob's digest while streaming it; the folder appears only when everything matched. A killed pull of
    the same manifest into the same ``into`` continues where it stopped (:class:`~._transfer.Staging`).

    With ``public_key`` the artifact's ``model.sig`` is verified after the download (and required): a layer of
    the artifact, else the newest signature pushed as an OCI 1.1 referrer of its manifest
    (:mod:`modelyard.transport.referrers`); an unsigned artifact is refused.
    Raises :class:`PublishError` (exit 2) for an unreachable registry, a missing tag, a manifest that is
    not a modelyard ModelPack artifact or an unsafe layer title; :class:`HashMismatchError` (exit 1)
    naming the file whose blob differs; :class:`~modelyard.errors.SignatureError` (exit 1). ``settings``: the run's
    (the registry's credentials and timeout)."""
    src = parse_oci_ref(ref)
    if src.reference is None:
        raise PublishError(f"{ref}: say which version to pull", fix=_FIX_REF)
    client = _client(src, insecure, settings)
    container = client.get_container(f"{src.repo}@{src.digest}" if src.digest else f"{src.repo}:{src.tag}")
    manifest, manifest_digest = _get_manifest(client, container, src)
    layers = _check_layers(manifest, src)
    by_rel = {lay[TITLE]: lay for lay in layers}
    if MANIFEST not in by_rel:
        raise PublishError(f"{src}: no layer titled manifest.json; not a modelyard artifact",
                           fix="Pull an artifact pushed by `modelyard publish`.")
    total = sum(lay["size"] for lay in layers)
    with Staging(into, resume=manifest_digest, total=total) as st, progress.task(f"pulling {src}", total=total) as adv:
        st.advance = adv
        mlay = by_rel[MANIFEST]
        manifest_bytes = b"".join(_blob_chunks(client, container, mlay, MANIFEST, src))
        if _sha(manifest_bytes) != mlay["digest"][7:] or len(manifest_bytes) != mlay["size"]:
            raise HashMismatchError(f"{src}: manifest.json's blob differs from its layer digest {mlay['digest']}",
                                    fix="The registry's copy is corrupt: publish the artifact again.")
        adv(len(manifest_bytes))
        others = [(rel, lay["size"], lay["digest"][7:]) for rel, lay in by_rel.items()
                  if rel != MANIFEST and not rel.startswith("model/")]
        contents = parse_listing(str(src), manifest_bytes, others)
        expected = contents.files
        layered = {rel for rel in by_rel if rel != MANIFEST}
        for rel in sorted(layered | set(expected)):
            if rel not in expected:
                raise PublishError(f"{src}: layer {rel!r} is not listed in manifest.json",
                                   fix="Do not use this copy; publish the artifact again with `modelyard publish`.")
            if rel not in layered:
                raise PublishError(f"{src}: {rel} is listed in manifest.json but has no layer",
                                   fix="The push was incomplete: publish the artifact again.")
            exp, lay = expected[rel], by_rel[rel]
            if lay["digest"] != f"sha256:{exp.sha256}" or lay["size"] != exp.size:
                raise HashMismatchError(f"{src}: the layer of {rel} has digest {lay['digest']} ({lay['size']} bytes), "
                                        f"manifest.json records sha256:{exp.sha256} ({exp.size} bytes)",
                                        fix="The registry's copy does not match the artifact's manifest: publish again.")
        # with --key, the signature is found before any weight byte: an unsigned artifact is refused at once
        sig_from = None if public_key is None else "layer" if SIGNATURE in expected else "referrer"
        sigs = _signature_referrers(client, container, manifest_digest) if sig_from == "referrer" else [None]
        if not sigs:
            raise SignatureError(f"{src} is unsigned: no model.sig layer and no signature referrer of its manifest "
                                 f"{manifest_digest}; --key asks for a signed artifact, nothing was written",
                                 fix="Sign the artifact (`modelyard sign`) and publish it again, or pull without --key.")
        st.expect(expected)  # what a resumed folder holds beyond the artifact's files is removed, links too
        st.put(MANIFEST, manifest_bytes)
        for rel in sorted(expected):
            exp = expected[rel]

            def chunks(start: int, rel: str = rel):  # noqa: ANN202 - from ``start`` on: a killed pull's file continues
                for c in _blob_chunks(client, container, by_rel[rel], rel, src, start):
                    adv(len(c))
                    yield c

            st.write(rel, chunks, exp.size, exp.sha256, str(src))
        for i, sig in enumerate(sigs):  # newest referrer first: any one the key verifies (several may be attached)
            if sig is not None:
                (st.tmp / SIGNATURE).unlink(missing_ok=True)  # the one before did not verify
                st.put(SIGNATURE, sig)
            try:
                if public_key is not None:
                    verify_signature(st.tmp, public_key=public_key, allow_partial=allow_partial)
                verified = None if public_key is None else True
                break
            except SignatureError:
                if i == len(sigs) - 1:
                    raise
        path = st.commit(check)
    return PullResult(path, len(expected) + 1, total, contents.manifest.content_digest, verified,
                      sig_from if verified else None)


def _signature_referrers(client, container, digest: str) -> list[bytes]:  # noqa: ANN001
    """The model-signing bundles pushed as referrers of the manifest ``digest``, the newest first (by their
    ``org.opencontainers.image.created``, then the registry's order)."""
    found = [r for r in referrers.discover(client, container, digest)
             if r.artifact_type == referrers.SIGSTORE_BUNDLE and r.kind == "signature"]
    order = sorted(range(len(found)), key=lambda i: (found[i].annotations.get("org.opencontainers.image.created", ""), i))
    return [referrers.fetch_layer(client, container, found[i]) for i in reversed(order)]


def _get_manifest(client, container, src: OciRef) -> tuple[dict[str, Any], str]:  # noqa: ANN001
    """The image manifest of ``src`` and its digest (``sha256:<hex>`` of the bytes served)."""
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use

    url = f"{client.prefix}://{container.manifest_url()}"
    try:
        r = referrers.registry_request(client, url, "GET", headers={"Accept": MANIFEST_MEDIA_TYPE})
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise PublishError(f"{src}: cannot read the manifest ({type(exc).__name__})",
                           fix="Check that the registry is running.") from exc
    if r.status_code == 404:
        raise PublishError(f"{src}: the registry has no such repository or tag",
                           fix="Check the repository and tag (`modelyard publish` prints them).")
    check_response(r, "to serve the manifest", src)
    if src.digest and _sha(r.content) != src.digest[7:]:
        raise HashMismatchError(f"{src}: the manifest the registry served does not have the digest asked for",
                                fix="Do not trust this registry's copy.")
    try:
        return r.json(), "sha256:" + _sha(r.content)
    except ValueError as exc:
        raise PublishError(f"{src}: the manifest is not JSON", fix="Pull an artifact pushed by `modelyard publish`.") from exc


def _check_layers(manifest: dict[str, Any], src: OciRef) -> list[dict[str, Any]]:
    if manifest.get("artifactType") != ARTIFACT_TYPE and (manifest.get("config") or {}).get("mediaType") != CONFIG_MEDIA_TYPE:
        raise PublishError(f"{src}: not a ModelPack model artifact (artifactType {manifest.get('artifactType')!r})",
                           fix="Pull an artifact pushed by `modelyard publish`.")
    out = []
    seen: set[str] = set()
    for i, lay in enumerate(manifest.get("layers") or []):
        ann = lay.get("annotations") or {}
        rel = ann.get(TITLE)
        if not isinstance(rel, str):
            raise PublishError(f"{src}: layer {i} has no {TITLE} annotation", fix="Pull an artifact pushed by `modelyard publish`.")
        if rel != MANIFEST:
            check_rel(str(src), rel)
        if rel in seen:
            raise PublishError(f"{src}: two layers are titled {rel!r}", fix="Do not use this copy.")
        seen.add(rel)
        digest, size = lay.get("digest"), lay.get("size")
        if not isinstance(digest, str) or not _DIGEST_RE.match(digest) or not isinstance(size, int) or size < 0:
            raise PublishError(f"{src}: layer {rel!r} has no sha256 digest or size", fix="Do not use this copy.")
        out.append({**lay, TITLE: rel})
    return out


def _blob_chunks(client, container, layer: dict[str, Any], rel: str, src: OciRef, start: int = 0):  # noqa: ANN001, ANN202
    """The blob's bytes from ``start`` on (> 0: a killed pull's file continued), in order: ranged GETs, several at
    once (:func:`~._streams.ordered_parts`), past one part or from ``start``, when the registry answers ``Range``
    (206, as distribution does); else, and for small blobs, one streamed GET (its first ``start`` bytes skipped)."""
    import requests  # noqa: PLC0415 - heavy: requests, imported on first use
    import urllib3  # noqa: PLC0415 - requests' own transport: a streamed read's timeout is its error

    size = int(layer["size"])
    url = f"{client.prefix}://{container.get_blob_url(layer['digest'])}"

    def missing(status: int) -> PublishError:
        return PublishError(f"{src}: the registry has no blob for {rel} ({layer['digest']}): HTTP {status}",
                            fix="The push was incomplete or the blob was deleted: publish the artifact again.")

    def get(start: int, end: int) -> bytes:
        with referrers.registry_request(client, url, "GET", headers={**client.headers, "Range": f"bytes={start}-{end - 1}"},
                                       stream=True) as r:
            if r.status_code != 206:
                raise missing(r.status_code)
            return r.raw.read(end - start)  # one read of the range (requests' .content joins 10 KiB reads)

    try:
        if size - start > RANGE_PART or start:
            end = min(start + RANGE_PART, size)
            with referrers.registry_request(client, url, "GET", stream=True,
                                            headers={**client.headers, "Range": f"bytes={start}-{end - 1}"}) as first:
                if first.status_code == 206:
                    head = first.raw.read(end - start)
                elif first.status_code == 200:  # Range ignored: this answer is the whole blob
                    yield from skip_bytes(first.iter_content(chunk_size=1 << 20), start)
                    return
                else:
                    raise missing(first.status_code)
            yield head
            if len(head) == end - start and end < size:
                yield from ordered_parts(get, end, size)
            return
        with referrers.registry_request(client, url, "GET", headers=client.headers, stream=True) as r:
            if r.status_code != 200:
                raise missing(r.status_code)
            yield from r.iter_content(chunk_size=1 << 20)
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
        silent = isinstance(exc, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError)) or \
            "timed out" in str(exc).lower()
        limit = getattr(client.session, "modelyard_silence_s", DEFAULT_SILENCE_S)
        raise PublishError(f"{src}: downloading {rel} failed (" + (
            f"the registry sent nothing for {limit:g} s" if silent else type(exc).__name__) + ")",
                           fix="Check the registry and the network, then pull again (it continues where it stopped)"
                               + ("; MODELYARD_REGISTRY_TIMEOUT sets how long a registry may stay silent" if silent
                                  else "") + ".") from exc


__all__ = ["publish_oci", "pull_oci", "attach_oci", "parse_oci_ref", "media_type", "model_config", "OciRef",
           "ARTIFACT_TYPE", "CONFIG_MEDIA_TYPE", "WEIGHT_RAW", "WEIGHT_CONFIG_RAW", "DOC_RAW"]


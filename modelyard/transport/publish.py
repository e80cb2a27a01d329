"""publish: send an artifact to a remote target, or pull one back, by URI scheme.

``oci://host[:port]/repo[:tag]`` → :mod:`.oci` (a ModelPack artifact, one raw layer per file);
``s3://bucket/prefix`` → :mod:`.s3` (the files, ``manifest.json`` last); ``oci://`` with the ``modelcar``
flavour → :mod:`.modelcar` (``model/`` as a KServe ModelCar image). Both pulls check every
file's sha256 and write into a temp folder renamed into place at the end; both verify ``model.sig``
when a public key is given. These are the functions the ingest flow calls for ``--publish``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from modelyard.artifact.manifest import Manifest, base_beside
from modelyard.errors import BundleError, PublishError
from modelyard.settings import Settings
from modelyard.transport._transfer import PublishResult, PullResult
from modelyard.transport.modelcar import FLAVOURS, publish_modelcar
from modelyard.transport.oci import attach_oci, parse_oci_ref, publish_oci, pull_oci
from modelyard.transport.s3 import parse_s3_uri, publish_s3, pull_s3

SCHEMES = ("oci://", "s3://")
_FIX = "Use oci://HOST[:PORT]/REPO[:TAG] or s3://BUCKET/PREFIX."


def check_target(to: str) -> None:
    """Parse ``to`` (``oci://host/repo[:tag]`` or ``s3://bucket/prefix``) without contacting it;
    raises :class:`PublishError` (exit 2) naming what is wrong. Lets ingest refuse a bad
    ``--publish`` before fetching anything."""
    if to.startswith("oci://"):

        parse_oci_ref(to)
    elif to.startswith("s3://"):

        parse_s3_uri(to)
    else:
        raise PublishError(f"{to!r} is not a publish target modelyard knows", fix=_FIX)


def base_target(to: str, base_name: str, base_revision: str) -> str:
    """Where a LoRA adapter published to ``to`` has its base published: beside it as the store keeps the two
    (``<name>/<revision>`` each; the adapter's serve/vllm.yaml reaches its base at ``../../<base>/<revision>``):
    ``oci://host/[ns/]<base_name>:<base_revision>``, the adapter repository's sibling, or
    ``s3://bucket/[path/]<base_name>/<base_revision>`` for an adapter at ``s3://bucket/[path/]NAME/REVISION``.
    Raises :class:`PublishError` (exit 2) for an S3 prefix of fewer than two levels."""
    if to.startswith("oci://"):
        ref = parse_oci_ref(to)
        ns = ref.repo.rpartition("/")[0]
        return f"oci://{ref.host}/{ns + '/' if ns else ''}{base_name}:{base_revision}"
    bucket, prefix = parse_s3_uri(to)
    parts = prefix.split("/")
    if len(parts) < 2:
        raise PublishError(f"{to!r}: an adapter's S3 prefix needs two levels, NAME/REVISION, so that its base goes "
                           f"beside it at ../../{base_name}/{base_revision} as in the store",
                           fix="Publish to s3://BUCKET/[PATH/]NAME/REVISION, or pass --without-base.")
    return f"s3://{bucket}/{'/'.join([*parts[:-2], base_name, base_revision])}"


def _lora_base(folder: Path) -> tuple[Path, Manifest] | None:
    """A LoRA artifact's base folder (``<store>/<base>/<revision>`` beside it, its content digest the one the
    adapter's manifest names) and the adapter's manifest; None for a model artifact. Raises
    :class:`PublishError` (exit 2) when the base is not there."""
    m = Manifest.load(folder)
    if not m.is_lora or m.base is None:
        return None
    base_dir, found = base_beside(folder, m)
    if found != m.base.digest:
        raise PublishError(f"the adapter's base {m.base.name}@{m.base.revision} ({m.base.digest}) is not beside it: "
                           f"{base_dir} holds {found or 'no artifact'}",
                           fix="Publish the adapter from the store that holds its base, or pass --without-base to "
                               "publish the adapter alone (its manifest names the base by digest).")
    return base_dir, m


def publish(artifact: str | Path, to: str, *, settings: Settings, home: Path | None = None,
            flavour: str = "modelpack", referrers_only: bool = False, with_base: bool = True) -> PublishResult:
    """Publish the artifact (folder or store reference ``NAME[@REV]``) to ``to`` (``oci://`` or ``s3://``).

    ``flavour`` (OCI only): ``modelpack`` (default) pushes the whole artifact as a ModelPack artifact, one raw
    layer per file (:mod:`.oci`); ``modelcar`` pushes ``model/`` as a runnable ModelCar image for KServe's
    ``oci://`` storage (:mod:`.modelcar`). Raises :class:`PublishError` (exit 2) for an unknown flavour or
    ``modelcar`` with ``s3://``; :class:`~modelyard.errors.SignatureError` (exit 1) when the artifact's
    ``model.sig`` was not made over its files (or, with ``MODELYARD_SIGNING_PUBLIC_KEY`` set, does not verify
    with that key): nothing is pushed. ``referrers_only`` (``oci://`` only): push no layer, only the signature
    and attestations as referrers of the manifest already at ``to`` (:func:`~.oci.attach_oci`). ``settings``: the
    run's (credentials, endpoints, the store, ``MODELYARD_SIGNING_PUBLIC_KEY``).

    A LoRA adapter artifact is published with its base (``with_base``, the default): the base first, at
    :func:`base_target`, then the adapter (its OCI annotations name the base by digest); the result's ``base``
    is the base's. Raises :class:`PublishError` (exit 2) when the base is not beside the adapter in the store."""
    if flavour not in FLAVOURS:
        raise PublishError(f"--flavour {flavour!r} is not a publish flavour", fix=f"Use one of: {', '.join(FLAVOURS)}.")
    if flavour == "modelcar" and not to.startswith("oci://"):
        raise PublishError(f"--flavour modelcar is an OCI image; {to!r} is not an oci:// reference",
                           fix="Publish the ModelCar to oci://HOST[:PORT]/REPO[:TAG] (S3 takes the artifact as files).")
    if referrers_only and not to.startswith("oci://"):
        raise PublishError(f"--referrers-only attaches OCI 1.1 referrers; {to!r} is not an oci:// reference",
                           fix="Give the oci://HOST/REPO:TAG (or @sha256:...) the artifact was published as.")
    artifact = _signature_checked(artifact, settings, home)
    lora = _lora_base(artifact) if with_base and not referrers_only and flavour == "modelpack" else None
    if lora is not None:
        base_dir, m = lora
        assert m.base is not None
        base = publish(base_dir, base_target(to, m.base.name, m.base.revision), settings=settings, home=home)
        return replace(publish(artifact, to, settings=settings, home=home, with_base=False), base=base)
    if referrers_only:
        return attach_oci(artifact, to, settings=settings, home=home)
    if to.startswith("oci://"):
        if flavour == "modelcar":
            return publish_modelcar(artifact, to, settings=settings, home=home)
        return publish_oci(artifact, to, settings=settings, home=home)
    if to.startswith("s3://"):

        return publish_s3(artifact, to, settings=settings, home=home)
    raise PublishError(f"{to!r} is not a publish target modelyard knows", fix=_FIX)


def _signature_checked(artifact: str | Path, settings: Settings, home: Path | None) -> Path:
    """The artifact's folder, its ``model.sig`` (when it has one) checked before any byte leaves: verified
    with ``MODELYARD_SIGNING_PUBLIC_KEY`` when that is set, else compared without a key with the artifact's
    files (:func:`~modelyard.transport.signing.signature_covers`). A stale signature pushed to a registry
    fails every later ``pull --key``; this refuses it here instead (:class:`SignatureError`, exit 1)."""
    from modelyard.artifact.layout import SIGNATURE  # noqa: PLC0415
    from modelyard.transport.refs import resolve_artifact  # noqa: PLC0415
    from modelyard.transport.signing import signature_covers, verify_signature  # noqa: PLC0415

    try:
        folder = resolve_artifact(artifact, home, settings=settings)
    except BundleError as exc:
        raise PublishError(exc.message, fix=exc.fix) from exc
    if (folder / SIGNATURE).is_file():
        key = getattr(settings, "signing_public_key", None)
        if key:
            verify_signature(folder, public_key=key)
        else:
            signature_covers(folder)
    return folder


def pull(ref: str, into: Path, *, public_key: Path | str | None = None, settings: Settings,
         allow_partial: bool = False, check: Callable[[Path], None] | None = None) -> PullResult:
    """Pull ``ref`` (``oci://...`` or ``s3://...``) into the new artifact folder ``into``. With ``public_key``, a
    signature over ``model/`` alone is refused unless ``allow_partial``
    (:func:`~modelyard.transport.signing.verify_signature`). ``check(staged_folder)``, when given, runs once every
    file arrived and before the folder is renamed into place; what it raises refuses the pull (nothing kept).
    ``settings``: the run's (credentials, endpoints, an S3 store's local cache)."""
    if ref.startswith("oci://"):

        return pull_oci(ref, into, public_key=public_key, settings=settings, allow_partial=allow_partial, check=check)
    if ref.startswith("s3://"):
        stored = _STORE_REF.match(ref.rstrip("/"))
        if stored is not None:
            if (res := _pull_stored(ref, stored.groups(), into, public_key, settings, allow_partial, check)) is not None:
                return res
        return pull_s3(ref, into, public_key=public_key, settings=settings, allow_partial=allow_partial, check=check)
    raise PublishError(f"{ref!r} is not a source modelyard can pull from", fix=_FIX)


#: an artifact's URI in an S3 store (what ingest prints for ``MODELYARD_STORE=s3://...``):
#: ``s3://bucket/prefix/artifacts/<name>/<revision>`` (:meth:`S3Store.artifact_uri`)
_STORE_REF = re.compile(r"^(s3://[^/]+/.+?)/artifacts/([^/]+)/([^/]+)$")


def _pull_stored(ref: str, where: tuple[str, ...], into: Path, public_key: Path | str | None,
                 settings: Settings, allow_partial: bool = False,
                 check: Callable[[Path], None] | None = None) -> PullResult | None:
    """Pull ``name@revision`` from the S3 store at ``store_uri`` (``where``: the three, as :data:`_STORE_REF` reads
    them from ``ref``) into ``into``: through this worker's cache
    (:meth:`S3Store.local`, every file checked against its sha256 on the way down), then copied and hashed
    again into a temp folder beside ``into``, renamed into place; ``model.sig`` verified with ``public_key``
    (required then). None when the store has no manifest there (``ref`` is then read as a published prefix)."""
    from modelyard.artifact.layout import MANIFEST, SIGNATURE  # noqa: PLC0415
    from modelyard.errors import SignatureError  # noqa: PLC0415
    from modelyard.transport._transfer import Staging, read_artifact  # noqa: PLC0415
    from modelyard.transport.objectstore import S3Store  # noqa: PLC0415
    from modelyard.transport.signing import verify_signature  # noqa: PLC0415

    store_uri, name, revision = where
    store = S3Store(store_uri, settings.store_dir(), settings)
    loaded = store.load(name, revision)
    if loaded is None:
        return None
    art = read_artifact(store.local(loaded[0]))
    if public_key is not None and not any(f.rel == SIGNATURE for f in art.files):
        raise SignatureError(f"{ref} is unsigned (no {SIGNATURE}); --key asks for a signed artifact, nothing was written",
                             fix="Sign the artifact (`modelyard sign`) and store it again, or pull without --key.")
    with Staging(into, total=art.total_bytes) as st:
        st.put(MANIFEST, art.manifest_bytes)
        for f in art.files:
            st.write(f.rel, _chunks(f.path), f.size, f.sha256, ref)
        if public_key is not None:
            verify_signature(st.tmp, public_key=public_key, allow_partial=allow_partial)
        path = st.commit(check)
    return PullResult(path, len(art.files) + 1, sum(f.size for f in art.files), art.manifest.content_digest,
                      True if public_key is not None else None, "layer" if public_key is not None else None)


def _chunks(path: Path, size: int = 8 << 20):  # noqa: ANN202 - Iterator[bytes]
    with open(path, "rb") as fh:
        while block := fh.read(size):
            yield block


__all__ = ["publish", "pull", "PublishResult", "PullResult", "SCHEMES", "FLAVOURS"]

"""publish: send an artifact to a remote target, or pull one back, by URI scheme.

``oci://host[:port]/repo[:tag]`` → :mod:`.oci` (a ModelPack artifact, one raw layer per file);
``s3://bucket/prefix`` → :mod:`.s3` (the files, ``manifest.json`` last); ``oci://`` with the ``modelcar``
flavour → :mod:`.modelcar` (``model/`` as a KServe ModelCar image). Both pulls check every
file's sha256 and write into a temp folder renamed into place at the end; both verify ``model.sig``
when a public key is given. These are the functions the ingest flow calls for ``--publish``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelyard.errors import PublishError
from modelyard.transport._transfer import PublishResult, PullResult
from modelyard.transport.modelcar import FLAVOURS, publish_modelcar
from modelyard.transport.oci import parse_oci_ref, publish_oci, pull_oci
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


def publish(artifact: str | Path, to: str, *, settings: Any = None, home: Path | None = None,
            flavour: str = "modelpack") -> PublishResult:
    """Publish the artifact (folder or store reference ``NAME[@REV]``) to ``to`` (``oci://`` or ``s3://``).

    ``flavour`` (OCI only): ``modelpack`` (default) pushes the whole artifact as a ModelPack artifact, one raw
    layer per file (:mod:`.oci`); ``modelcar`` pushes ``model/`` as a runnable ModelCar image for KServe's
    ``oci://`` storage (:mod:`.modelcar`). Raises :class:`PublishError` (exit 2) for an unknown flavour or
    ``modelcar`` with ``s3://``."""
    if flavour not in FLAVOURS:
        raise PublishError(f"--flavour {flavour!r} is not a publish flavour", fix=f"Use one of: {', '.join(FLAVOURS)}.")
    if flavour == "modelcar" and not to.startswith("oci://"):
        raise PublishError(f"--flavour modelcar is an OCI image; {to!r} is not an oci:// reference",
                           fix="Publish the ModelCar to oci://HOST[:PORT]/REPO[:TAG] (S3 takes the artifact as files).")
    if to.startswith("oci://"):
        if flavour == "modelcar":
            return publish_modelcar(artifact, to, settings=settings, home=home)
        return publish_oci(artifact, to, settings=settings, home=home)
    if to.startswith("s3://"):

        return publish_s3(artifact, to, settings=settings, home=home)
    raise PublishError(f"{to!r} is not a publish target modelyard knows", fix=_FIX)


def pull(ref: str, into: Path, *, public_key: Path | str | None = None, settings: Any = None) -> PullResult:
    """Pull ``ref`` (``oci://...`` or ``s3://...``) into the new artifact folder ``into``."""
    if ref.startswith("oci://"):

        return pull_oci(ref, into, public_key=public_key, settings=settings)
    if ref.startswith("s3://"):

        return pull_s3(ref, into, public_key=public_key, settings=settings)
    raise PublishError(f"{ref!r} is not a source modelyard can pull from", fix=_FIX)


__all__ = ["publish", "pull", "PublishResult", "PullResult", "SCHEMES", "FLAVOURS"]

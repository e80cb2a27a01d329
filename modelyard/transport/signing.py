"""signing: an OpenSSF model-signing bundle over the whole artifact (``model.sig``).

``model.sig`` sits beside ``model/`` in the artifact (see :mod:`modelyard.artifact.layout`). It is a Sigstore
bundle whose payload is an in-toto statement listing every file of the artifact with its SHA256 (PyPI
``model-signing`` 1.1.1, file serialization): ``model/``, ``report.json``/``report.md``, ``serve/`` (what an
operator runs: an edited ``compose.yaml`` or ``vllm.yaml`` no longer verifies), patches and quantization
records. Not covered (:data:`UNSIGNED`): ``model.sig`` itself and ``manifest.json``, which a promotion
rewrites by design; its file list and report digest are checked against the signed files instead
(:func:`manifest_agrees`). A signature made before this covered ``model/`` only: it still verifies, as
``scope="model/"``, and says so. Key-based signing uses an elliptic-curve private
key (PEM); verification uses the matching public key, or a certificate chain (``trust_root``) for
certificate-based signatures, or a Sigstore identity + OIDC issuer for keyless signatures (see the
README). A file changed, added or removed in ``model/`` fails verification with
:class:`~modelyard.errors.SignatureError` naming it.

The manifest's per-file SHA256 and the signature's digests are computed independently: the
signature is a second, key-bound opinion on the same bytes, not derived from ``manifest.json``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from modelyard.artifact.layout import SIGNATURE
from modelyard.errors import SignatureError, SigningKeyError
from modelyard.model.digest import file_digest

SIGNATURE_NAME = SIGNATURE


@dataclass(frozen=True)
class SignResult:
    artifact: Path
    signature: Path
    method: str  # "key", "certificate" or "sigstore"


#: what the signature does not cover, relative to the artifact folder (see the module doc)
UNSIGNED = (SIGNATURE_NAME, "manifest.json")
#: the scope of a signature: the whole artifact, or (signatures made before) ``model/`` only
SCOPE_ARTIFACT, SCOPE_MODEL = "artifact", "model/"
#: the refusal of a ``model/``-only signature where the whole artifact must be signed (:func:`verify_signature`)
PARTIAL_MESSAGE = ("{artifact}: model.sig verifies over model/ only (a signature made before modelyard signed the whole "
                   "artifact, or by `model_signing sign ... model/`): serve/, report.json and the records beside "
                   "model/ are unsigned, so nothing was kept")
PARTIAL_FIX = ("Sign the whole artifact (`modelyard sign ARTIFACT --key private.pem`) and publish or bundle it again, or "
               "pass --allow-partial-signature to accept a signature over model/ alone.")


@dataclass(frozen=True)
class VerifySignatureResult:
    artifact: Path
    signature: Path
    method: str
    files: int  # files the signature covers
    scope: str = SCOPE_ARTIFACT  # "artifact", or "model/" for a signature made before the whole artifact was signed


def _hashing(extra: tuple[str, ...] = ()):  # noqa: ANN202 - model_signing.hashing.Config
    from model_signing import hashing  # noqa: PLC0415 - heavy: model-signing, imported on first use

    return hashing.Config().set_ignored_paths(paths=[*UNSIGNED, *extra], ignore_git_paths=True)


def _model_dir(artifact: Path) -> Path:
    artifact = Path(artifact).expanduser().absolute()
    model = artifact / "model"
    if not model.is_dir():
        raise SigningKeyError(f"{artifact} has no model/ folder to sign or verify",
                              fix="Pass an artifact folder (manifest.json + model/), or NAME@REVISION from the store.")
    return model


def _key_file(path: Path | str, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SigningKeyError(f"the {what} {p} does not exist (or is not a file)",
                              fix=f"Pass the path of a PEM {what}.")
    return p


def sign_artifact(artifact: Path, *, private_key: Path | str, password: str | None = None) -> SignResult:
    """Sign the artifact folder (``model/`` and every file beside it but :data:`UNSIGNED`) with an
    elliptic-curve private key (PEM); writes ``artifact/model.sig`` (replacing an older one atomically).
    Raises :class:`SigningKeyError` for a missing or unusable key."""
    from model_signing import signing  # noqa: PLC0415 - heavy: model-signing, imported on first use

    model = _model_dir(artifact)
    key = _key_file(private_key, "private key")
    sig = model.parent / SIGNATURE_NAME
    tmp = model.parent / f".{SIGNATURE_NAME}.{os.getpid()}.partial"
    try:
        cfg = signing.Config().use_elliptic_key_signer(private_key=key, password=password)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"{key} is not a usable elliptic-curve private key ({_first_line(exc)})",
                              fix="Make one with `openssl ecparam -name prime256v1 -genkey -noout -out private.pem` "
                                  "(give --password if it is encrypted).") from exc
    try:
        cfg.set_hashing_config(_hashing((tmp.name,))).sign(model.parent, tmp)
        os.replace(tmp, sig)
    except OSError as exc:
        raise SigningKeyError(f"cannot write {sig}: {exc.strerror or exc}",
                              fix="Check that the artifact folder is writable.") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return SignResult(model.parent, sig, "key")


def verify_signature(artifact: Path, *, public_key: Path | str | None = None,
                     trust_root: Path | str | None = None, identity: str | None = None,
                     oidc_issuer: str | None = None, allow_partial: bool = True) -> VerifySignatureResult:
    """Verify ``artifact/model.sig`` over ``artifact/model``: with an EC ``public_key`` (PEM), with a
    certificate chain ``trust_root`` (PEM) for certificate signatures, or with a Sigstore ``identity``
    and ``oidc_issuer`` (keyless; needs the network). Exactly one method.

    A signature over ``model/`` alone (:data:`SCOPE_MODEL`: made before the whole artifact was signed, or by
    ``model_signing sign ... model/``) verifies with ``allow_partial`` and says so in its ``scope``; without it, it
    is refused: ``serve/`` (what an operator runs), the report and the records beside ``model/`` are then unsigned,
    and a pull or unbundle that says "signature: verified" must mean all of them.

    Raises :class:`SignatureError` (exit 1) when model/ differs from what was signed, the signature
    is not from that key, or it covers model/ alone and ``allow_partial`` is false; :class:`SigningKeyError`
    (exit 2) for a missing signature or key."""
    from model_signing import verifying  # noqa: PLC0415 - heavy: model-signing, imported on first use

    model = _model_dir(artifact)
    sig = model.parent / SIGNATURE_NAME
    if not sig.is_file():
        raise SigningKeyError(f"{model.parent} has no {SIGNATURE_NAME}",
                              fix=f"Sign it first: `modelyard sign {model.parent} --key private.pem`.")
    chosen = [m for m, v in (("key", public_key), ("certificate", trust_root), ("sigstore", identity)) if v]
    if len(chosen) != 1:
        raise SigningKeyError("pass exactly one of a public key, a trust root (certificate chain) or a Sigstore identity",
                              fix="e.g. `modelyard verify-signature ARTIFACT --key public.pem`.")
    method = chosen[0]
    try:
        cfg = verifying.Config()
        if method == "key":
            cfg = cfg.use_elliptic_key_verifier(public_key=_key_file(public_key, "public key"))  # type: ignore[arg-type]
        elif method == "certificate":
            cfg = cfg.use_certificate_verifier(certificate_chain=[_key_file(trust_root, "trust root")])  # type: ignore[arg-type]
        else:
            if not oidc_issuer:
                raise SigningKeyError("a Sigstore identity needs its OIDC issuer",
                                      fix="Add --issuer, e.g. https://accounts.google.com.")
            cfg = cfg.use_sigstore_verifier(identity=identity, oidc_issuer=oidc_issuer)  # type: ignore[arg-type]
    except SigningKeyError:
        raise
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"cannot use that {method} to verify ({_first_line(exc)})",
                              fix="Pass the PEM public key that matches the signing key.") from exc
    diffs: list[str] = []
    _capture_diff(cfg, diffs)
    try:
        cfg.set_hashing_config(_hashing()).verify(model.parent, sig)
    except ValueError as exc:
        diffs = list(diffs)  # the legacy attempt below rewrites the captured list
        if _legacy_verifies(cfg, model, sig):
            if not allow_partial:
                raise SignatureError(PARTIAL_MESSAGE.format(artifact=model.parent.name), fix=PARTIAL_FIX) from exc
            return VerifySignatureResult(model.parent, sig, method, sum(1 for p in model.rglob("*") if p.is_file()),
                                         SCOPE_MODEL)
        tampered = str(exc).startswith("Signature mismatch")
        raise SignatureError(_explain(model, exc, diffs), fix=_FIX_TAMPERED if tampered else _FIX_KEY) from exc
    except Exception as exc:  # noqa: BLE001 - the library raises many kinds for a bad or foreign signature
        raise SignatureError(f"{sig} does not verify with that {method}: {type(exc).__name__}: {_first_line(exc)}",
                             fix=_FIX_KEY) from exc
    manifest_agrees(model.parent)
    files = sum(1 for p in model.parent.rglob("*") if p.is_file() and p.relative_to(model.parent).as_posix() not in UNSIGNED)
    return VerifySignatureResult(model.parent, sig, method, files)


def _legacy_verifies(cfg, model: Path, sig: Path) -> bool:  # noqa: ANN001
    """Whether ``sig`` is a signature of the earlier kind, over ``model/`` alone, that verifies."""
    from model_signing import hashing  # noqa: PLC0415

    try:
        cfg.set_hashing_config(hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=True)).verify(model, sig)
    except Exception:  # noqa: BLE001 - any failure: not a valid legacy signature either
        return False
    return True


def manifest_agrees(artifact: Path) -> None:
    """``manifest.json`` (not itself signed: a promotion rewrites it) must agree with the signed files: each
    ``files[]`` entry's sha256 with the file, ``verification.report_sha256`` with ``report.json``, and its
    claims with the signed report: the verdict and counts (``verification``) and the smoke's verdict, level and
    vLLM version, and its ``source`` record (where the checkpoint came from: uri, repo, commit, provenance) with
    the report's (reports written before that record have none; their manifest's source is unsigned), its
    ``target``, and its identity (``name``, ``revision``, ``kind``, ``content_digest``, a LoRA's ``base``, ``tools``:
    :meth:`~modelyard.artifact.manifest.Manifest.claims`) with the report's ``artifact`` record (reports written
    before it have none). Only ``created_at`` and the promotion records stay unsigned: a promotion rewrites them.
    Raises :class:`SignatureError` naming the first disagreement."""
    from modelyard.artifact.manifest import Manifest  # noqa: PLC0415

    try:
        m = Manifest.load(artifact)
    except (OSError, ValueError) as exc:
        raise SignatureError(f"{artifact}: manifest.json cannot be read beside the signature ({exc})",
                             fix=_FIX_TAMPERED) from exc
    want = {f.path: f.sha256 for f in m.files}
    if m.verification.report_sha256:
        want["report.json"] = m.verification.report_sha256
    for rel, sha in sorted(want.items()):
        p = artifact / rel
        got = file_digest(p).sha256 if p.is_file() else None
        if got != sha:
            raise SignatureError(f"{artifact.name}: manifest.json records sha256 {sha} for {rel}, the signed file "
                                 f"has {got}: the manifest was edited after signing", fix=_FIX_TAMPERED)
    if not (artifact / "report.json").is_file():
        return
    from modelyard.artifact.report_record import ReportRecord  # noqa: PLC0415

    try:
        r = ReportRecord.from_bytes((artifact / "report.json").read_bytes())
    except (OSError, ValueError) as exc:
        raise SignatureError(f"{artifact.name}: the signed report.json cannot be read ({exc})", fix=_FIX_TAMPERED) from exc
    claims: dict[str, tuple[object, object]] = {
        "verification": ((m.verification.passed, m.verification.errors, m.verification.warnings),
                         (r.summary.passed, r.summary.errors, r.summary.warnings))}
    if r.source is not None:  # reports written before the source was signed have none
        said_source, signed_source = m.source.to_dict(), r.source.to_dict()
        for key in sorted(set(said_source) | set(signed_source)):
            claims[f"source.{key}"] = (said_source.get(key), signed_source.get(key))
    claims["target"] = (m.target.to_dict(), r.target.to_dict())
    if r.artifact is not None:  # reports written before the identity was signed have none
        said_claims, signed_claims = m.claims(), r.artifact.to_dict()
        for key in sorted(set(said_claims) | set(signed_claims)):
            claims[key] = (said_claims.get(key), signed_claims.get(key))
    if m.smoke is not None or r.smoke is not None:
        said_smoke, signed_smoke = (None if s is None else (s.passed, s.level_name, s.vllm_version) for s in (m.smoke, r.smoke))
        claims["smoke"] = (said_smoke, signed_smoke)
    for what, (said, signed) in claims.items():
        if said != signed:
            raise SignatureError(f"{artifact.name}: manifest.json's {what} claim {said!r} is not the signed report's "
                                 f"{signed!r}: the manifest was edited after signing", fix=_FIX_TAMPERED)



def signed_digests(artifact: Path) -> dict[str, str]:
    """The files ``model.sig`` names and their sha256 (hex), relative to the artifact folder, read from the
    bundle's in-toto payload (``predicate.resources``, model-signing's file serialization) WITHOUT checking
    the signature: what the signer claims, for a keyless comparison before a publish. A signature over
    ``model/`` alone names its files as ``model/...``. Raises :class:`SignatureError` for a bundle that is
    not a model-signing bundle."""
    import base64  # noqa: PLC0415
    import json  # noqa: PLC0415

    sig = artifact / SIGNATURE_NAME
    try:
        bundle = json.loads(sig.read_bytes())
        stmt = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        resources = stmt["predicate"]["resources"]
        legacy = stmt["subject"][0]["name"] == "model" and all(not r["name"].startswith("model/") for r in resources)
        return {("model/" if legacy else "") + r["name"]: r["digest"] for r in resources if r.get("algorithm") == "sha256"}
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise SignatureError(f"{sig} is not a model-signing bundle ({type(exc).__name__}: {_first_line(exc)})",
                             fix=_FIX_KEY) from exc


def signature_covers(artifact: Path) -> None:
    """Check, without a key, that ``model.sig`` was made over this artifact's bytes: the files it names are
    the artifact's files (but :data:`UNSIGNED`), with the manifest's sha256 for ``model/`` files (what a
    registry or object store checks each blob against) and the computed sha256 for the rest. A publish runs it
    first, so that a stale or mismatched signature is not pushed to where every pull would refuse it. It says
    nothing about WHO signed (that needs the key: :func:`verify_signature`). Raises :class:`SignatureError`
    naming the first file that differs."""
    from modelyard.artifact.manifest import Manifest  # noqa: PLC0415

    signed = signed_digests(artifact)
    known = {f.path: f.sha256 for f in Manifest.load(artifact).files}
    legacy = all(rel.startswith("model/") for rel in signed)
    for p in sorted(artifact.rglob("*")):
        rel = p.relative_to(artifact).as_posix()
        if not p.is_file() or rel in UNSIGNED or (legacy and not rel.startswith("model/")):
            continue
        have = known.get(rel) or file_digest(p).sha256
        got = signed.pop(rel, None)
        if got != have:
            why = "is not named by it" if got is None else f"has sha256 {have}, it signed {got}"
            raise SignatureError(f"{artifact.name}: {SIGNATURE_NAME} was not made over this artifact: {rel} {why}",
                                 fix=_FIX_STALE)
    if signed:
        raise SignatureError(f"{artifact.name}: {SIGNATURE_NAME} names {sorted(signed)[0]}, which the artifact does "
                             f"not hold", fix=_FIX_STALE)


_FIX_KEY = "Check that the key matches the one that signed, and that model.sig is intact (re-sign if it is not)."
_FIX_STALE = ("Re-sign the artifact (`modelyard sign ARTIFACT --key private.pem`) if its content is what you "
              "mean to publish; otherwise restore it from the store, a bundle or the registry.")
_FIX_TAMPERED = ("The artifact is not what was signed: restore it from the store, a bundle or the registry "
                 "(each checks every file's sha256), or re-sign it if the change was intended.")


def _capture_diff(cfg, into: list[str]) -> None:  # noqa: ANN001
    """Keep model-signing's list of differences (it raises them as one repr'd string)."""
    orig = getattr(cfg, "_get_manifest_diff", None)
    if orig is None:
        return

    def capture(actual, expected):  # noqa: ANN001, ANN202
        into[:] = orig(actual, expected)
        return into

    cfg._get_manifest_diff = capture


def _explain(model: Path, exc: ValueError, diffs: list[str]) -> str:
    """'model/x changed since it was signed; ...' from model-signing's differences (paths relative to the artifact)."""
    if not str(exc).startswith("Signature mismatch"):
        return f"{model.parent / SIGNATURE_NAME} does not verify: {_first_line(exc)}"
    parts = []
    for d in diffs:
        if m := re.match(r"Hash mismatch for '(.+?)': ", d):
            parts.append(f"{m.group(1)} changed since it was signed")
        elif m := re.match(r"(Extra|Missing) files (?:found )?in model '.*?': (.*)$", d):
            parts.append(("not signed (added after signing): " if m.group(1) == "Extra" else "signed but missing: ")
                         + m.group(2))
    return f"{model.parent.name}: the signature over the artifact does not match: " + ("; ".join(parts) or _first_line(exc))


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    return s.splitlines()[0] if s else type(exc).__name__


def verify_after_unbundle(into: Path, *, public_key: Path | str | None = None,
                          trust_root: Path | str | None = None,
                          allow_partial: bool = False) -> VerifySignatureResult | None:
    """For the unbundle path: verify ``into/model.sig`` when a key or trust root is given. Returns None
    when none is given; raises :class:`SigningKeyError` when one is given but the artifact has no
    ``model.sig``, :class:`SignatureError` when it does not verify."""
    if public_key is None and trust_root is None:
        return None
    return verify_signature(into, public_key=public_key, trust_root=trust_root, allow_partial=allow_partial)

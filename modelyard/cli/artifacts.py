"""bundle, unbundle, publish, pull, sign, verify-signature, list and show: moving, signing and
inspecting stored artifacts."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from modelyard.artifact.bom import build_bom, validate_bom
from modelyard.checks.report import counted
from modelyard.cli._common import (
    alias_option,
    either,
    emit_json,
    human_bytes,
    json_option,
    out,
    output_option,
    store_option,
    stored_path,
    verbose_option,
    working,
)
from modelyard.errors import BundleError, InvalidTargetError, SigningKeyError, StoreError
from modelyard.settings import Settings
from modelyard.stages.verify import carried_verdict_holds
from modelyard.text import one_line
from modelyard.transport.catalog import list_artifacts, show_artifact
from modelyard.transport.hfcache import rehydrate
from modelyard.transport.objectstore import is_remote
from modelyard.transport.oci import OciRef, parse_oci_ref
from modelyard.transport.publish import publish, pull
from modelyard.transport.refs import bundle_artifact, resolve_artifact
from modelyard.transport.signing import SIGNATURE_NAME, sign_artifact, verify_signature
from modelyard.transport.unbundle import unbundle


def bundle_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder (manifest.json + model/) or a store reference NAME[@REVISION]"),
    output: Path = typer.Option(..., "-o", "--output", help="the .tar.zst to write (written to a temp name, then renamed)"),
    level: int = typer.Option(3, "--level", min=1, max=19, help="zstd level"),
    force: bool = typer.Option(False, "--force", help="replace OUTPUT if it exists"),
    store: Optional[str] = store_option(),
    as_json: bool = json_option("{bundle, bytes_in, bytes_out, files, content_digest}"),
    verbose: bool = verbose_option(),
) -> None:
    """Write an artifact as one deterministic .tar.zst for an air-gapped site (manifest.json first)."""
    with working(as_json):
        res = bundle_artifact(artifact, output, settings=Settings(), level=level, force=force, home=store)
    d = {"bundle": str(res.path), "bytes_in": res.bytes_in, "bytes_out": res.bytes_out, "files": res.files,
         "content_digest": res.content_digest}
    if as_json:
        emit_json(d)
    else:
        out.print(f"bundle: {res.path}  ({res.files} files, {res.bytes_in} bytes -> {res.bytes_out} bytes)", highlight=False)
        out.print(f"content: {res.content_digest}", highlight=False, soft_wrap=True)


def unbundle_cmd(  # noqa: PLR0913
    bundle: Path = typer.Argument(..., help="a .tar.zst made by `modelyard bundle`"),
    output: Optional[Path] = output_option("new artifact folder to create"),
    into: Optional[Path] = alias_option("--into"),
    hf_cache: Optional[Path] = typer.Option(None, "--hf-cache", help="a Hugging Face cache folder (HF_HUB_CACHE) to add the model to"),
    repo_id: Optional[str] = typer.Option(None, "--repo-id", help="with --hf-cache: org/name (default: the manifest's hub repo)"),
    max_ratio: float = typer.Option(100.0, "--max-ratio", min=1.0, help="refuse bundles declaring more than this x their compressed size"),
    key: Optional[Path] = typer.Option(None, "--key", help="public key (PEM): model.sig must verify before anything is kept"),
    trust_root: Optional[Path] = typer.Option(None, "--trust-root", help="certificate chain (PEM) for model.sig"),
    allow_partial: bool = typer.Option(False, "--allow-partial-signature",
                                       help="with --key: accept a signature over model/ alone (serve/ and the report "
                                            "stay unsigned)"),
    as_json: bool = json_option("{artifact, files, content_digest, signature_verified} or, with --hf-cache, "
                                "{hf_cache, repo_id, commit, commit_synthesized, snapshot, files, reused}"),
    verbose: bool = verbose_option(),
) -> None:
    """Check every byte of BUNDLE against its manifest and extract it (all or nothing): as an artifact
    folder (-o/--output) or into a Hugging Face cache (--hf-cache) that transformers loads offline. A bundle whose
    manifest says "verification passed" while its model/ fails the static checks is refused (exit 1)."""
    with working(as_json):
        into = either(output, into, "--output")
        if (into is None) == (hf_cache is None):
            raise InvalidTargetError("pass exactly one of -o/--output DIR and --hf-cache DIR",
                                     fix="-o/--output for an artifact folder, --hf-cache for transformers/vLLM's hub cache.")
        if into is not None:
            c = unbundle(bundle, into, max_ratio=max_ratio, public_key=key, trust_root=trust_root,
                         allow_partial=allow_partial, check=carried_verdict_holds)
            d = {"artifact": str(into.expanduser().absolute()), "files": len(c.files) + 2,
                 "content_digest": c.manifest.content_digest,
                 "signature_verified": True if (key or trust_root) else None}
        else:
            r = rehydrate(bundle, hf_cache, repo_id=repo_id, max_ratio=max_ratio)  # type: ignore[arg-type]
            d = {"hf_cache": str(r.cache_dir), "repo_id": r.repo_id, "commit": r.commit,
                 "commit_synthesized": r.commit_synthesized, "snapshot": str(r.snapshot), "files": r.files,
                 "reused": r.reused}
    if as_json:
        emit_json(d)
    elif into is not None:
        out.print(f"artifact: {d['artifact']}  ({d['files']} files verified)", highlight=False)
        out.print(f"content: {d['content_digest']}", highlight=False, soft_wrap=True)
        out.print(_unbundled_signature(into.expanduser().absolute(), bool(key or trust_root)), highlight=False,
                  soft_wrap=True)
    else:
        out.print(f"hf cache: {d['hf_cache']}  repo: {d['repo_id']}  commit: {d['commit']}"
                  + ("  (synthesized)" if d["commit_synthesized"] else ""), highlight=False, soft_wrap=True)
        out.print(f"load with: HF_HUB_CACHE={d['hf_cache']} HF_HUB_OFFLINE=1, "
                  f"from_pretrained({d['repo_id']!r}, revision={d['commit']!r})", highlight=False, soft_wrap=True)


def _unbundled_signature(artifact: Path, verified: bool) -> str:
    """The unbundle's signature line: verified with the key, present but not checked, or absent (then the
    bundle's claims, such as "verification: passed", are its own: anyone who edits a bundle can restate them)."""
    if verified:
        return "signature: verified (the files, the report and the claims of manifest.json)"
    if (artifact / SIGNATURE_NAME).is_file():
        return (f"signature: present, not checked (pass --key PUBLIC.pem, or `modelyard verify-signature {artifact} "
                "--key PUBLIC.pem`)")
    return (f"signature: none: the bundle's claims (verification, revision, source) are its own; `modelyard verify "
            f"{artifact}` judges the files again")


def publish_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder or a store reference NAME[@REVISION]"),
    to: str = typer.Option(..., "--to", help="oci://HOST[:PORT]/REPO[:TAG] or s3://BUCKET/PREFIX"),
    flavour: str = typer.Option("modelpack", "--flavour", help="OCI only: modelpack (the whole artifact, one raw layer "
                                "per file) or modelcar (model/ as a runnable image for KServe's oci:// storage)"),
    referrers_only: bool = typer.Option(False, "--referrers-only", help="OCI only: push no layer, only the "
                                        "signature and attestations as referrers of the manifest already at --to "
                                        "(a tag or @sha256:...; it must be this artifact's): sign after publishing"),
    without_base: bool = typer.Option(False, "--without-base", help="a LoRA adapter artifact: publish it alone "
                                      "(its manifest names its base by digest) instead of with its base beside it "
                                      "(oci://HOST/[NS/]BASE:REVISION, s3://BUCKET/[PATH/]BASE/REVISION)"),
    as_json: bool = json_option("{uri, files, bytes, skipped, sent, digest, content_digest, referrers, flavour, "
                                "storage_uri}"),
    verbose: bool = verbose_option(),
) -> None:
    """Publish ARTIFACT to an OCI registry (a ModelPack artifact, one raw layer per file, each layer's
    digest = the file's sha256; or with --flavour modelcar a KServe ModelCar image, model/ under /models)
    or to S3 (manifest.json last). A LoRA adapter artifact goes with its base, published first beside it
    (unless --without-base). Credentials: MODELYARD_REGISTRY_USER / MODELYARD_REGISTRY_PASSWORD;
    the AWS variables and MODELYARD_S3_ENDPOINT_URL."""

    with working(as_json):
        res = publish(artifact, to, settings=Settings(), flavour=flavour, referrers_only=referrers_only,
                      with_base=not without_base)
    storage = _storage_uri(res.uri, res.digest, flavour)
    if as_json:
        emit_json(asdict(res) | {"flavour": flavour if to.startswith("oci://") else None, "storage_uri": storage})
        return
    out.print(f"published: {res.uri}  ({res.files} files, {res.bytes} bytes"
              + (f", {res.skipped} {'files' if to.startswith('s3://') else 'blobs'} already there" if res.skipped else "")
              + (f", {res.sent} bytes sent" if res.sent is not None and res.sent != res.bytes else "") + ")",
              highlight=False, soft_wrap=True)
    if res.digest:
        out.print(f"manifest digest: {res.digest}", highlight=False, soft_wrap=True)
    if res.referrers:
        out.print(f"referrers of the manifest (OCI 1.1): {', '.join(res.referrers)}", highlight=False, soft_wrap=True)
    out.print(f"content: {res.content_digest}", highlight=False, soft_wrap=True)
    if res.base is not None:
        out.print(f"base published beside it: {res.base.uri}  ({res.base.content_digest})", highlight=False,
                  soft_wrap=True)
    if storage:
        out.print(f"KServe storageUri: {storage}  (modelyard serve-plan ... --storage-uri {storage})",
                  highlight=False, soft_wrap=True)


def _storage_uri(uri: str, digest: str | None, flavour: str) -> str | None:
    """Where KServe reads the published model from, or None (a ModelPack artifact is not a ModelCar):
    the S3 prefix (serve-plan adds /model), or the ModelCar pinned by its index digest."""
    if uri.startswith("s3://"):
        return uri
    if flavour == "modelcar" and digest:
        ref = parse_oci_ref(uri)
        return str(OciRef(ref.host, ref.repo, None, digest))
    return None


def pull_cmd(
    ref: str = typer.Argument(..., help="oci://HOST[:PORT]/REPO:TAG (or @sha256:...), s3://BUCKET/PREFIX, or an S3 store's "
                                        "s3://BUCKET/PREFIX/artifacts/NAME/REVISION (as ingest prints it)"),
    output: Optional[Path] = output_option("new artifact folder to create (required)"),
    into: Optional[Path] = alias_option("--into"),
    key: Optional[Path] = typer.Option(None, "--key", help="public key (PEM): require a signature (model.sig, or for "
                                       "oci:// a signature referrer of the manifest) and verify it; an unsigned "
                                       "artifact is refused"),
    allow_partial: bool = typer.Option(False, "--allow-partial-signature",
                                       help="with --key: accept a signature over model/ alone (serve/ and the report "
                                            "stay unsigned)"),
    as_json: bool = json_option("{artifact, files, bytes, content_digest, signature_verified, signature_from}"),
    verbose: bool = verbose_option(),
) -> None:
    """Download an artifact, checking every file's sha256 (all or nothing); with --key, verify its signature. An
    artifact whose manifest says "verification passed" while its model/ fails the static checks is refused (exit 1)."""
    with working(as_json):
        res = pull(ref, either(output, into, "--output", required=True), public_key=key, settings=Settings(),
                   allow_partial=allow_partial, check=carried_verdict_holds)
    d = {"artifact": str(res.path), "files": res.files, "bytes": res.bytes, "content_digest": res.content_digest,
         "signature_verified": res.signature_verified, "signature_from": res.signature_from}
    if as_json:
        emit_json(d)
        return
    out.print(f"artifact: {res.path}  ({res.files} files verified)", highlight=False, soft_wrap=True)
    out.print(f"content: {res.content_digest}", highlight=False, soft_wrap=True)
    if res.signature_verified:
        out.print("signature: verified (model.sig" + (", from the OCI referrer of the manifest)"
                                                      if res.signature_from == "referrer" else ")"))


def _signing_root(artifact: str) -> Path:
    """The artifact folder for sign/verify-signature; a bad reference is a SigningKeyError (exit 2)."""

    try:
        return resolve_artifact(artifact, settings=Settings())
    except BundleError as exc:
        raise SigningKeyError(exc.message, fix=exc.fix) from exc


def sign_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder or a store reference NAME[@REVISION]"),
    key: Path = typer.Option(..., "--key", help="elliptic-curve private key (PEM)"),
    password: Optional[str] = typer.Option(None, "--password", envvar="MODELYARD_SIGNING_KEY_PASSWORD",
                                           help="the key's password, if encrypted (or MODELYARD_SIGNING_KEY_PASSWORD)"),
    as_json: bool = json_option("{signature, method}"),
    verbose: bool = verbose_option(),
) -> None:
    """Sign ARTIFACT with OpenSSF model-signing: every file (model/, reports, serve/, records) but manifest.json;
    writes model.sig beside model/."""
    with working(as_json):
        res = sign_artifact(_signing_root(artifact), private_key=key, password=password)
    if as_json:
        emit_json({"signature": str(res.signature), "method": res.method})
        return
    out.print(f"signed: {res.signature}", highlight=False, soft_wrap=True)


def verify_signature_cmd(
    artifact: str = typer.Argument(..., help="an artifact folder or a store reference NAME[@REVISION]"),
    key: Optional[Path] = typer.Option(None, "--key", help="public key (PEM) matching the signing key"),
    trust_root: Optional[Path] = typer.Option(None, "--trust-root", help="certificate chain (PEM) for certificate signatures"),
    identity: Optional[str] = typer.Option(None, "--identity", help="Sigstore keyless: the signer's identity (e-mail, workflow)"),
    issuer: Optional[str] = typer.Option(None, "--issuer", help="Sigstore keyless: the OIDC issuer"),
    as_json: bool = json_option("{signature, method, files, scope}"),
    verbose: bool = verbose_option(),
) -> None:
    """Check model.sig against the artifact's files and the key, and manifest.json's file list against them: exit 0
    when it verifies, 1 when it does not, 2 for bad input."""
    with working(as_json):
        res = verify_signature(_signing_root(artifact), public_key=key, trust_root=trust_root, identity=identity,
                               oidc_issuer=issuer)
    if as_json:
        emit_json({"signature": str(res.signature), "method": res.method, "files": res.files, "scope": res.scope})
        return
    what = ("files of the artifact; manifest.json is not signed (a promotion rewrites it), its file list and report "
            "digest agree with the signed files" if res.scope == "artifact"
            else "files of model/ only: a signature made before modelyard signed the whole artifact; re-sign it")
    out.print(f"[bold green]signature verified[/] ({res.method}): {escape(str(res.signature))} covers "
              f"{res.files} {what}", highlight=False, soft_wrap=True)


def list_cmd(
    store: Optional[str] = store_option(),
    out_dir: Optional[str] = alias_option("--out"),
    as_json: bool = json_option("{store, artifacts: [{name, revision, content_digest, created_at, quantization, "
                                "size, ...}]}"),
    verbose: bool = verbose_option(),
) -> None:
    """List the artifacts in the store: name, revision, content digest, created, quantization, size."""
    settings = Settings()
    home = _require_store(either(store, out_dir, "--store"), settings)
    with working(as_json):
        arts = list_artifacts(home, settings=settings)
    if as_json:
        emit_json({"store": str(home), "artifacts": [a.to_dict() for a in arts]})
        return
    out.print(f"store: {escape(str(home))}", highlight=False, soft_wrap=True)
    if not arts:
        out.print("the store holds no artifacts")
        return

    cols = ("name", "revision", "content digest", "created", "quantization", "size")
    rows = [(a.name, a.revision, a.content_digest[:19], a.created_at or "", a.quantization or "-", human_bytes(a.size))
            for a in arts]
    if not out.is_terminal:  # logs and pipes: one unwrapped line per artifact, columns aligned
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        for r in (cols, *rows):
            sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
        return
    t = Table(title_justify="left")
    rev_width = max(len(r[1]) for r in rows)  # a revision is printed whole: show/bundle/publish take it
    for col in cols:
        t.add_column(col, overflow="fold", min_width=rev_width if col == "revision" else None)
    for r in rows:
        t.add_row(*(escape(v) for v in r))
    out.print(t)


def _require_store(store: Optional[str], settings: Settings, unless: Optional[Path] = None) -> str:
    """The store (``--store``, else the store of ``settings``: MODELYARD_STORE, else MODELYARD_HOME): an ``s3://`` URI as given, a
    folder made absolute; raises :class:`StoreError` (exit 2) when the folder does not exist, unless
    ``unless`` (an artifact folder given instead of a name) exists."""
    spec = store if store is not None else settings.store_spec()
    if is_remote(spec):
        return spec
    home = Path(spec).expanduser().absolute()
    if not home.is_dir() and not (unless is not None and unless.exists()):
        raise StoreError(f"there is no store at {home}",
                         fix="Pass --store DIR or set MODELYARD_HOME to the store's folder (`modelyard ingest` creates it).")
    return str(home)


def show_cmd(
    ref: str = typer.Argument(..., help="NAME[@REVISION] in the store, or an artifact folder"),
    store: Optional[str] = store_option(),
    out_dir: Optional[str] = alias_option("--out"),
    as_json: bool = json_option("the summary: identity, path, source, files, quantization, verification, smoke, "
                                "signature, report"),
    verbose: bool = verbose_option(),
) -> None:
    """Summarize one artifact: identity, source, files, quantization, verification, smoke, signature."""
    with working(as_json):
        settings = Settings()
        spec = either(store, out_dir, "--store")
        path_like = "/" in ref.partition("@")[0] or ref.startswith((".", "~"))  # a folder: no store is read
        home = spec if path_like else _require_store(spec, settings, unless=Path(ref).expanduser())
        d = show_artifact(ref, home, settings=settings)
    if as_json:
        emit_json(d.to_dict())
        return
    def o(value: object) -> str:  # a value from the artifact's files, printed as part of one line
        return escape(one_line(str(value)))

    a = d.summary
    out.print(f"[bold]{o(a.name)}[/]@{o(a.revision)}  {o(a.path)}", highlight=False, soft_wrap=True)
    out.print(f"content: {o(a.content_digest)}", highlight=False, soft_wrap=True)
    out.print(f"created: {o(a.created_at)}  size: {human_bytes(a.size)} in {d.files} model files  "
              f"quantization: {o(a.quantization or 'none')}  patches: {o(d.patches)}  "
              f"signed: {'yes' if d.signed else 'no'}", highlight=False, soft_wrap=True)
    src = d.source
    out.print(f"source: {o(src.get('uri'))}" + (f"  commit: {o(src['commit'])}" if src.get("commit") else ""),
              highlight=False, soft_wrap=True)
    for r in d.replaced:
        out.print(f"replaced: {o(r['file'])} {o(r['by'])} ({o(r['evidence'])})", highlight=False, soft_wrap=True)
    v = d.verification or {}
    claim = ("signed with report.json: `modelyard verify-signature` checks it" if d.signed else
             "manifest.json's claim, unsigned: `modelyard verify` judges the files again")
    out.print(f"verification: {'passed' if v.get('passed') else 'FAILED'} ({counted(v.get('errors', 0), 'error')}, "
              f"{counted(v.get('warnings', 0), 'warning')}; {claim})", highlight=False)
    s = d.smoke
    out.print(f"smoke: vLLM {o(s['vllm_version'])}, loaded in {o(s['load_seconds'])} s, finish_reason "
              f"{o(s['finish_reason'])}" if s else "smoke: not run", highlight=False)
    for f in ((d.report or {}).get("findings") or [])[:20]:
        out.print(f"  {o(f['severity']):<7} {o(f['code'])}  {o(f.get('file') or '')}: {o(f['message'])}",
                  highlight=False, soft_wrap=True)


def bom_cmd(
    ref: str = typer.Argument(..., help="an artifact folder, or NAME[@REVISION] in the store"),
    output: Optional[Path] = output_option("write the AI-BOM to this file (written to a temp name, then renamed); "
                                           "default: stdout"),
    store: Optional[str] = store_option(),
    as_json: bool = json_option("{path, serial_number, spec_version, files}, with the AI-BOM itself as bom when there "
                                "is no -o"),
    verbose: bool = verbose_option(),
) -> None:
    """Write the artifact's AI-BOM: a CycloneDX 1.6 ML-BOM (model, files and SHA-256, base model and lineage,
    calibration data, quantization, measured figures, toolchain), validated against the CycloneDX schema.

    Exit 0 when written, 2 when the artifact cannot be read."""
    with working(as_json):
        folder = stored_path(Path(ref).expanduser(), store)
        if not (folder / "manifest.json").is_file():
            raise InvalidTargetError(f"{ref}: no artifact there (no manifest.json in {folder})",
                                     fix="Pass an artifact folder (manifest.json + model/) or NAME[@REVISION] of the store.")
        doc = build_bom(folder)
        validate_bom(doc)
        text = json.dumps(doc, indent=2) + "\n"
        if output is not None:
            tmp = output.with_name(f".{output.name}.modelyard-tmp")
            tmp.write_text(text)
            os.replace(tmp, output)
    if as_json:
        emit_json({"path": str(output.absolute()) if output else None, "serial_number": doc["serialNumber"],
                   "spec_version": doc["specVersion"], "files": len(doc["metadata"]["component"].get("components", [])),
                   **({} if output else {"bom": doc})})
        return
    if output is None:
        sys.stdout.write(text)
        return
    out.print(f"AI-BOM (CycloneDX 1.6, valid): {escape(str(output))}", highlight=False, soft_wrap=True)

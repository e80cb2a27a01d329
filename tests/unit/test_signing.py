"""Signing: model-signing over model/ with an EC key made here; list/show over the store;
publish target parsing (no server needed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelyard.errors import PublishError, SignatureError, SigningKeyError
from modelyard.settings import Settings
from modelyard.transport.signing import (
    PARTIAL_FIX,
    PARTIAL_MESSAGE,
    SIGNATURE_NAME,
    sign_artifact,
    verify_after_unbundle,
    verify_signature,
)
from tests.conftest import json_error, json_result, run_cli
from tests.unit.test_bundle import _build_artifact


def _keypair(d: Path, name: str = "k") -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = d / f"{name}-private.pem", d / f"{name}-public.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    return _keypair(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def store_artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


@pytest.fixture
def artifact(store_artifact, tmp_path) -> Path:
    """A private copy (tests tamper with it)."""
    dst = tmp_path / "art"
    shutil.copytree(store_artifact, dst)
    return dst


def _tamper(p: Path, data: bytes) -> None:
    os.chmod(p, 0o644)
    p.write_bytes(data)


def test_sign_then_verify(artifact, keys):
    priv, pub = keys
    res = sign_artifact(artifact, private_key=priv)
    assert res.signature == artifact / SIGNATURE_NAME and res.signature.is_file()
    v = verify_signature(artifact, public_key=pub)
    signed = [p for p in artifact.rglob("*") if p.is_file() and p.name not in ("model.sig", "manifest.json")]
    assert (v.method, v.scope, v.files) == ("key", "artifact", len(signed))
    assert {"serve/vllm.yaml", "report.json"} <= {p.relative_to(artifact).as_posix() for p in signed}
    assert not list(artifact.glob(".*partial"))


def test_tampered_file_fails_naming_it(artifact, keys):
    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    _tamper(artifact / "model" / "config.json", b'{"model_type": "llama"}')
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert "model/config.json changed since it was signed" in ei.value.message
    assert ei.value.exit_code == 1 and ei.value.fix


def test_added_and_removed_files_fail(artifact, keys):
    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    (artifact / "model" / "extra.txt").write_text("x")
    (artifact / "model" / "generation_config.json").unlink()
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert "model/extra.txt" in ei.value.message and "model/generation_config.json" in ei.value.message


def test_other_key_fails(artifact, keys, tmp_path):
    sign_artifact(artifact, private_key=keys[0])
    _, other_pub = _keypair(tmp_path, "other")
    with pytest.raises(SignatureError, match="does not verify"):
        verify_signature(artifact, public_key=other_pub)


def test_key_problems_are_bad_input(artifact, keys, tmp_path):
    with pytest.raises(SigningKeyError, match="has no model.sig"):
        verify_signature(artifact, public_key=keys[1])
    with pytest.raises(SigningKeyError, match="does not exist"):
        sign_artifact(artifact, private_key=tmp_path / "nope.pem")
    with pytest.raises(SigningKeyError, match="not a usable elliptic-curve private key"):
        sign_artifact(artifact, private_key=keys[1])  # a public key
    sign_artifact(artifact, private_key=keys[0])
    with pytest.raises(SigningKeyError, match="exactly one"):
        verify_signature(artifact)


def test_verify_after_unbundle(artifact, keys, tmp_path):
    from modelyard.transport.refs import bundle_artifact
    from modelyard.transport.unbundle import unbundle

    sign_artifact(artifact, private_key=keys[0])
    b = bundle_artifact(artifact, tmp_path / "b.tar.zst", settings=Settings()).path
    out = tmp_path / "far"
    unbundle(b, out)
    assert verify_after_unbundle(out) is None  # no key given: nothing to check
    assert verify_after_unbundle(out, public_key=keys[1]).method == "key"


def test_cli_sign_and_verify_exit_codes(artifact, keys):
    priv, pub = keys
    r = run_cli("sign", str(artifact), "--key", str(priv))
    assert r.returncode == 0, r.stderr
    r = run_cli("verify-signature", str(artifact), "--key", str(pub), "--json")
    assert r.returncode == 0 and json_result(r.stdout, "verify-signature")["method"] == "key"
    _tamper(artifact / "model" / "tokenizer.json", b"{}")
    r = run_cli("verify-signature", str(artifact), "--key", str(pub))
    assert r.returncode == 1
    assert "model/tokenizer.json" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("verify-signature", str(artifact), "--key", str(artifact / "missing.pem"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


# ---- list / show ---------------------------------------------------------------------------------------


def test_list_and_show(store_artifact):
    home = store_artifact.parents[1]
    r = run_cli("list", "--json", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    listed = json_result(r.stdout, "list")
    assert listed["store"] == str(home)
    rows = listed["artifacts"]
    m = json.loads((store_artifact / "manifest.json").read_text())
    assert [(a["name"], a["revision"], a["content_digest"]) for a in rows] == [("tiny", m["revision"], m["content_digest"])]
    assert rows[0]["size"] == sum(f["size"] for f in m["files"]) and rows[0]["quantization"] is None
    r = run_cli("list", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 0 and "tiny" in r.stdout
    r = run_cli("show", "tiny", "--json", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    d = json_result(r.stdout, "show")
    assert d["content_digest"] == m["content_digest"] and d["source"]["commit"] == m["source"]["commit"]
    assert d["report"]["summary"]["passed"] is True and d["signed"] is False
    r = run_cli("show", f"tiny@{m['revision']}", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 0 and m["content_digest"] in r.stdout
    r = run_cli("show", "nosuch", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 2 and "no artifact named 'nosuch'" in r.stderr and "Traceback" not in r.stderr


def test_show_prints_each_value_of_the_artifact_on_its_own_line_only(store_artifact, tmp_path):
    """A manifest value with a raw line break (here the source URI, which an edited copy can carry) cannot print a
    line of its own such as a fake "verification: passed": it is written as an escape, on the source line."""
    import shutil

    from typer.testing import CliRunner

    from modelyard.cli import app

    copy = tmp_path / "copy"
    shutil.copytree(store_artifact, copy)
    (copy / "manifest.json").chmod(0o644)
    m = json.loads((copy / "manifest.json").read_text())
    m["source"]["uri"] = "file:///x\nverification: passed (0 errors, 0 warnings)\r\x1b[2K"
    (copy / "manifest.json").write_text(json.dumps(m))
    r = CliRunner().invoke(app, ["show", str(copy)])
    lines = r.output.splitlines()
    (source,) = [line for line in lines if line.startswith("source: ")]
    assert source.startswith("source: file:///x\\x0averification: passed (0 errors, 0 warnings)\\x0d\\x1b[2K  commit: ")
    assert sum(line.startswith("verification:") for line in lines) == 1  # the artifact's own line alone


# ---- target parsing ------------------------------------------------------------------------------------


def test_parse_targets():
    from modelyard.transport.oci import DOC_RAW, WEIGHT_CONFIG_RAW, WEIGHT_RAW, media_type, parse_oci_ref
    from modelyard.transport.s3 import parse_s3_uri

    r = parse_oci_ref("oci://127.0.0.1:5000/models/tiny:v1")
    assert (r.host, r.repo, r.tag, r.digest) == ("127.0.0.1:5000", "models/tiny", "v1", None)
    d = "sha256:" + "a" * 64
    assert parse_oci_ref(f"oci://reg.example/m@{d}").digest == d
    assert parse_oci_ref("oci://reg.example/m").tag is None
    for bad in ("oci://", "oci://host", "oci://user:pw@host/repo", "oci://h/Upper", "oci://h/r:bad tag",
                "oci://h/r@sha256:xyz", "http://h/r"):
        with pytest.raises(PublishError):
            parse_oci_ref(bad)
    assert parse_s3_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    for bad in ("s3://bucket", "s3://bucket/", "s3://b/../x", "s3:///x"):
        with pytest.raises(PublishError):
            parse_s3_uri(bad)
    assert media_type("model/model-00001-of-00002.safetensors") == WEIGHT_RAW
    assert media_type("model/tokenizer.json") == WEIGHT_CONFIG_RAW
    assert media_type("model/model.safetensors.index.json") == WEIGHT_CONFIG_RAW
    assert media_type("report.md") == DOC_RAW and media_type("model.sig") == DOC_RAW


def test_publish_bad_target_exit_2(store_artifact):
    r = run_cli("publish", str(store_artifact), "--to", "ftp://x/y")
    assert r.returncode == 2 and "not a publish target" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("pull", "oci://127.0.0.1:9/models/tiny:v1", "--into", str(store_artifact.parent / "x"))
    assert r.returncode == 2 and "cannot be reached" in r.stderr


def test_unbundle_with_key_keeps_nothing_unless_the_signature_verifies(artifact, keys, tmp_path):
    from modelyard.transport.refs import bundle_artifact

    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    b = tmp_path / "signed.tar.zst"
    bundle_artifact(str(artifact), b, settings=Settings())
    r = run_cli("unbundle", str(b), "--into", str(tmp_path / "ok"), "--key", str(pub), "--json")
    assert r.returncode == 0, r.stderr
    assert json_result(r.stdout, "unbundle")["signature_verified"] is True
    r = run_cli("unbundle", str(b), "--into", str(tmp_path / "ok2"), "--key", str(pub))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "signature: verified (the files, the report and the claims of manifest.json)"
    r = run_cli("unbundle", str(b), "--into", str(tmp_path / "ok3"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (f"signature: present, not checked (pass --key PUBLIC.pem, or `modelyard "
                                         f"verify-signature {tmp_path / 'ok3'} --key PUBLIC.pem`)")
    _, other = _keypair(tmp_path, "other")
    r = run_cli("unbundle", str(b), "--into", str(tmp_path / "bad"), "--key", str(other), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert json_error(r.stdout, "unbundle", 1)["type"] == "SignatureError"
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.unbundle-*"))


def test_list_names_its_store_and_revisions_resolve_by_prefix(store_artifact, tmp_path):
    home = store_artifact.parents[1]
    rev = store_artifact.name
    r = run_cli("list", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 0 and r.stdout.splitlines()[0] == f"store: {home}"
    assert r.stdout.splitlines()[2].split()[:2] == ["tiny", rev]  # the whole revision (header on line 2)
    r = run_cli("show", f"tiny@{rev[:16]}", "--json", env={"MODELYARD_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert json_result(r.stdout, "show")["revision"] == rev
    missing = tmp_path / "nowhere"
    r = run_cli("list", "--out", str(missing))
    assert r.returncode == 2 and f"error[store_failed]: there is no store at {missing}" in r.stderr


def test_the_signature_covers_what_is_run_not_only_model(artifact, keys):
    """model.sig covered model/ only: an edited serve/vllm.yaml (trust-remote-code) or compose.yaml still
    verified as "signature: verified"."""
    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    vllm = artifact / "serve" / "vllm.yaml"
    original = vllm.read_bytes()
    _tamper(vllm, original + b"trust-remote-code: true\n")
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert "serve/vllm.yaml changed since it was signed" in ei.value.message
    _tamper(vllm, original)
    (artifact / "serve" / "compose.yaml").write_text("services: {vllm: {privileged: true, volumes: ['/:/host']}}\n")
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert "not signed (added after signing): serve/compose.yaml" in ei.value.message


def test_a_manifest_edited_after_signing_must_still_agree_with_the_signed_files(artifact, keys):
    import json

    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    m = json.loads((artifact / "manifest.json").read_text())
    m["promotion"] = {"approved_by": "alice"}  # a promotion rewrites the manifest: still verifies
    _tamper(artifact / "manifest.json", json.dumps(m).encode())
    assert verify_signature(artifact, public_key=pub).scope == "artifact"
    m["verification"]["report_sha256"] = "0" * 64  # a claim about another report
    _tamper(artifact / "manifest.json", json.dumps(m).encode())
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert ei.value.message.startswith(f"art: manifest.json records sha256 {'0' * 64} for report.json, the signed file has ")


def test_a_signature_made_over_model_alone_still_verifies_and_says_its_scope(artifact, keys):
    from model_signing import hashing, signing

    priv, pub = keys
    signing.Config().use_elliptic_key_signer(private_key=priv).set_hashing_config(
        hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=True)).sign(artifact / "model", artifact / "model.sig")
    v = verify_signature(artifact, public_key=pub)
    assert (v.scope, v.files) == ("model/", len(list((artifact / "model").iterdir())))
    # where the whole artifact must be signed (pull --key, unbundle --key), it is refused unless allowed
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub, allow_partial=False)
    assert ei.value.message == PARTIAL_MESSAGE.format(artifact=artifact.name) and ei.value.fix == PARTIAL_FIX
    assert ei.value.message.startswith("art: model.sig verifies over model/ only (")


def test_manifest_claims_must_match_the_signed_report(artifact, keys):
    import json

    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    m = json.loads((artifact / "manifest.json").read_text())
    m["verification"]["errors"] = 0
    m["verification"]["passed"] = True
    m["smoke"] = {"passed": True, "level": "bench", "vllm_version": "0.32.0"}  # a smoke that never ran
    _tamper(artifact / "manifest.json", json.dumps(m).encode())
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert ei.value.message == ("art: manifest.json's smoke claim (True, 'bench', '0.32.0') is not the signed "
                                "report's None: the manifest was edited after signing")


def test_manifest_source_must_be_the_signed_reports(artifact, keys):
    """The source record (repo, commit, provenance) is signed through report.json: a manifest that names
    another origin, or drops a provenance key, does not verify."""
    import json

    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    assert verify_signature(artifact, public_key=pub).scope == "artifact"
    m = json.loads((artifact / "manifest.json").read_text())
    m["source"]["repo_id"] = "meta-llama/Llama-3.1-8B-Instruct"
    _tamper(artifact / "manifest.json", json.dumps(m).encode())
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert ei.value.message == ("art: manifest.json's source.repo_id claim 'meta-llama/Llama-3.1-8B-Instruct' is not "
                                "the signed report's 'org/tiny': the manifest was edited after signing")
    m["source"]["repo_id"] = "org/tiny"
    del m["source"]["endpoint"]
    _tamper(artifact / "manifest.json", json.dumps(m).encode())
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    assert ei.value.message == ("art: manifest.json's source.endpoint claim None is not the signed report's "
                                "'https://hub.example': the manifest was edited after signing")


@pytest.mark.parametrize(("field", "value", "said", "signed"), [
    ("name", "llama-3.1-8b-prod", "'llama-3.1-8b-prod'", "'tiny'"),
    ("tools", {"modelyard": "0.0.1"}, "{'modelyard': '0.0.1'}", None),
    ("kind", "lora", "'lora'", "'model'"),
    ("base", {"name": "other", "revision": "r1", "digest": "sha256:" + "1" * 64},
     "{'name': 'other', 'revision': 'r1', 'digest': 'sha256:" + "1" * 64 + "'}", "None"),
])
def test_the_artifacts_identity_claims_are_signed(artifact, keys, field, value, said, signed):
    """Name, revision, kind, content digest, a LoRA's base binding and the tool versions are copied into the signed
    report.json (its ``artifact`` record): edited in the unsigned manifest.json, the artifact no longer verifies."""
    import json

    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    report = json.loads((artifact / "report.json").read_text())
    m = json.loads((artifact / "manifest.json").read_text())
    assert report["artifact"] == {"name": "tiny", "revision": m["revision"], "kind": "model",
                                  "content_digest": m["content_digest"], "base": None, "tools": m["tools"]}
    if signed is None:
        signed = repr(m["tools"])
    m[field] = value
    assert _refused(artifact, pub, m) == (f"art: manifest.json's {field} claim {said} is not the signed report's "
                                          f"{signed}: the manifest was edited after signing")


def _refused(artifact: Path, pub: Path, manifest: dict) -> str:
    """The message verify_signature refuses ``artifact`` with once its manifest.json is ``manifest``."""
    import json

    _tamper(artifact / "manifest.json", json.dumps(manifest).encode())
    with pytest.raises(SignatureError) as ei:
        verify_signature(artifact, public_key=pub)
    return ei.value.message


def test_the_target_and_the_revision_are_signed(artifact, keys):
    import json

    priv, pub = keys
    sign_artifact(artifact, private_key=priv)
    m = json.loads((artifact / "manifest.json").read_text())
    rev = m["revision"]
    m["target"]["tensor_parallel_size"] = 8
    assert _refused(artifact, pub, m).startswith("art: manifest.json's target claim {'tensor_parallel_size': 8, ")
    m["target"]["tensor_parallel_size"] = 1
    m["revision"] = "v2"
    assert _refused(artifact, pub, m) == (f"art: manifest.json's revision claim 'v2' is not the signed report's "
                                          f"{rev!r}: the manifest was edited after signing")


def test_show_says_whether_the_verification_claim_is_signed(artifact, keys):
    from typer.testing import CliRunner

    from modelyard.cli import app

    r = CliRunner().invoke(app, ["show", str(artifact)])
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("verification:")]
    assert line == ("verification: passed (0 errors, 0 warnings; manifest.json's claim, unsigned: `modelyard verify` "
                    "judges the files again)")
    sign_artifact(artifact, private_key=keys[0])
    r = CliRunner().invoke(app, ["show", str(artifact)], env={"COLUMNS": "200"})
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("verification:")]
    assert line == ("verification: passed (0 errors, 0 warnings; signed with report.json: `modelyard verify-signature` "
                    "checks it)")


def test_signature_covers_compares_without_a_key(artifact, keys):
    """What publish checks before pushing: the files model.sig names are the artifact's, with its bytes."""
    from modelyard.transport.signing import signature_covers, signed_digests

    priv, _ = keys
    sign_artifact(artifact, private_key=priv)
    signature_covers(artifact)
    assert sorted(signed_digests(artifact)) == sorted(
        p.relative_to(artifact).as_posix() for p in artifact.rglob("*")
        if p.is_file() and p.name not in ("model.sig", "manifest.json"))
    _tamper(artifact / "serve" / "vllm.yaml", b"model: ../model\nmax-model-len: 256\n")  # same bytes: still covered
    signature_covers(artifact)
    (artifact / "serve" / "compose.yaml").write_text("services: {}\n")
    with pytest.raises(SignatureError) as ei:
        signature_covers(artifact)
    assert ei.value.message == "art: model.sig was not made over this artifact: serve/compose.yaml is not named by it"
    (artifact / "serve" / "compose.yaml").unlink()
    (artifact / "report.md").chmod(0o644)
    (artifact / "report.md").unlink()
    with pytest.raises(SignatureError) as ei:
        signature_covers(artifact)
    assert ei.value.message == "art: model.sig names report.md, which the artifact does not hold"


def test_signature_covers_reads_a_model_only_signature(artifact, keys):
    from model_signing import hashing, signing

    from modelyard.transport.signing import signature_covers, signed_digests

    priv, _ = keys
    signing.Config().use_elliptic_key_signer(private_key=priv).set_hashing_config(
        hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=True)).sign(artifact / "model", artifact / "model.sig")
    assert all(rel.startswith("model/") for rel in signed_digests(artifact))
    signature_covers(artifact)

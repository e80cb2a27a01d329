"""`modelyard pull` cannot be made to write outside its output, or to ship files the artifact does not list, against
the session's real OCI registry (Debian docker-registry). The resume folder's name is predictable
(``.<output>.pull-<digest16>`` beside ``-o``), so anyone who can write beside the output can plant it first: a
symbolic link to another folder, a folder of another user or open to others, or a folder of extra files
(``model/modeling_evil.py``, ``serve/hook.sh``, ``.git/config``, a link inside). The pull refuses the first kinds and
removes the last before the artifact is assembled, with or without ``--key``. ``pull --key`` of an unsigned
artifact is refused before any file blob is read."""

from __future__ import annotations

import hashlib
import os
import pwd
import uuid
from pathlib import Path

import pytest

from modelyard.settings import Settings
from modelyard.transport.oci import publish_oci
from tests.conftest import json_error, json_result, run_cli
from tests.unit.test_bundle import _build_artifact, edited_artifact
from tests.unit.test_signing import _keypair

pytestmark = [pytest.mark.e2e, pytest.mark.publish]


@pytest.fixture(scope="module")
def published(tiny_llama_dir, registry, tmp_path_factory) -> tuple[Path, str, str]:
    """(the artifact folder, its oci:// reference, the manifest digest's first 16 hex digits)."""
    art = _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("escape-store"), hub=True)
    ref = f"oci://{registry}/models/escape-{uuid.uuid4().hex[:8]}:v1"
    res = publish_oci(art, ref, settings=Settings())
    return art, ref, res.digest.removeprefix("sha256:")[:16]


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _planted(into: Path, digest16: str) -> Path:
    return into.parent / f".{into.name}.pull-{digest16}"


@pytest.mark.parametrize("plant", ["link", "other-user", "open-mode"])
def test_a_planted_resume_folder_is_refused_and_nothing_is_written_through_it(published, tmp_path, plant):
    _, ref, digest16 = published
    into, outside = tmp_path / "out" / "pulled", tmp_path / "outside"
    into.parent.mkdir()
    outside.mkdir()
    staging = _planted(into, digest16)
    if plant == "link":
        staging.symlink_to(outside)
        why = "a symbolic link"
    else:
        staging.mkdir(mode=0o700)
        if plant == "other-user":
            if os.geteuid() != 0:
                pytest.skip("chown to another user needs root (CI runs as root)")
            os.chown(staging, pwd.getpwnam("nobody").pw_uid, -1)
            why = f"owned by uid {pwd.getpwnam('nobody').pw_uid}, not 0"
        else:
            staging.chmod(0o777)
            why = "open to other users (mode 777)"
    r = run_cli("pull", ref, "-o", str(into), "--json")
    err = json_error(r.stdout, "pull", 2)
    assert err["message"] == (f"{staging} exists and is not a pull folder this user's modelyard made ({why}); nothing "
                              "was written through it")
    assert err["fix"] == f"Remove {staging} (check who made it), then pull again."
    assert list(outside.iterdir()) == [] and not into.exists()


def test_files_planted_in_the_resume_folder_never_reach_the_pulled_artifact(published, tmp_path):
    """A resume folder that passes the ownership check (this user's, 0700) but holds files the artifact does not
    list, a link to an outside file where a model file goes and a link to an outside folder where serve/ goes:
    the pull succeeds, the artifact is exactly the published one, and nothing outside changed."""
    art, ref, digest16 = published
    into, outside = tmp_path / "out" / "pulled", tmp_path / "outside"
    into.parent.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("outside\n")
    staging = _planted(into, digest16)
    staging.mkdir(mode=0o700)
    for rel, text in (("model/modeling_evil.py", "import os\n"), (".git/config", "[core]\n"), ("notes/x", "x\n")):
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_text(text)
    (staging / "model" / "config.json").symlink_to(outside / "keep.txt")
    (staging / "serve").symlink_to(outside)
    r = run_cli("pull", ref, "-o", str(into), "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json_result(r.stdout, "pull")["files"] == len(_tree(art))
    assert _tree(into) == _tree(art)
    assert not any(p.is_symlink() for p in into.rglob("*"))
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"] and (outside / "keep.txt").read_text() == "outside\n"


def test_pull_with_a_key_refuses_an_unsigned_artifact_before_any_file_blob(published, registry, tmp_path,
                                                                          tmp_path_factory):
    """The registry's own request log: after the manifest and the manifest.json layer, no blob GET of the
    artifact's files (the signature is looked for first: no model.sig layer, no referrer)."""
    art, ref, _ = published
    _, pub = _keypair(tmp_path)
    log = Path(tmp_path_factory.getbasetemp()) / "registry0" / "registry.log"
    before = len(log.read_text().splitlines())
    r = run_cli("pull", ref, "-o", str(tmp_path / "p"), "--key", str(pub), "--json")
    err = json_error(r.stdout, "pull", 1)
    assert err["type"] == "SignatureError" and "is unsigned" in err["message"]
    manifest_sha = hashlib.sha256((art / "manifest.json").read_bytes()).hexdigest()
    repo = ref.removeprefix(f"oci://{registry}/").split(":")[0]
    blob_gets = {line.split(f"/v2/{repo}/blobs/sha256:")[1][:64] for line in log.read_text().splitlines()[before:]
                 if f'"GET /v2/{repo}/blobs/sha256:' in line}
    assert blob_gets <= {manifest_sha}, blob_gets
    assert not (tmp_path / "p").exists()


def test_pull_with_a_key_refuses_a_signature_over_model_alone_unless_allowed(published, registry, tmp_path):
    """An artifact signed over model/ only (as `model_signing sign ... model/` signs, or modelyard before it signed
    the whole artifact), with serve/ edited after signing: `pull --key` refuses it (exit 1, nothing kept);
    `--allow-partial-signature` accepts it and says the signature's scope through its verification."""
    import shutil

    from model_signing import hashing, signing

    art, _, _ = published
    priv, pub = _keypair(tmp_path)
    copy = tmp_path / "art"
    shutil.copytree(art, copy)
    signing.Config().use_elliptic_key_signer(private_key=priv).set_hashing_config(
        hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=True)).sign(copy / "model", copy / "model.sig")
    (copy / "serve" / "vllm.yaml").chmod(0o644)
    with open(copy / "serve" / "vllm.yaml", "a") as fh:
        fh.write("trust-remote-code: true\n")  # unsigned: the signature never covered serve/
    ref = f"oci://{registry}/models/partial-{uuid.uuid4().hex[:8]}:v1"
    publish_oci(copy, ref, settings=Settings())
    r = run_cli("pull", ref, "-o", str(tmp_path / "p"), "--key", str(pub), "--json")
    err = json_error(r.stdout, "pull", 1)
    assert err["message"].startswith("p.pull-") is False and "model.sig verifies over model/ only (" in err["message"]
    assert err["fix"].endswith("or pass --allow-partial-signature to accept a signature over model/ alone.")
    assert not (tmp_path / "p").exists()
    r = run_cli("pull", ref, "-o", str(tmp_path / "q"), "--key", str(pub), "--allow-partial-signature", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json_result(r.stdout, "pull")["signature_verified"] is True


def test_pull_refuses_an_edited_artifact_whose_carried_verdict_its_files_fail(published, registry, tmp_path):
    """An unsigned artifact edited after verification and pushed to the real registry (config changed, manifest
    digests recomputed, "verification: passed" kept) pulls byte-exact, and is refused (exit 1) before its folder
    appears: its model/ fails the checks its manifest says it passed."""
    art, _, _ = published
    ref = f"oci://{registry}/models/edited-{uuid.uuid4().hex[:8]}:v1"
    publish_oci(edited_artifact(art, tmp_path / "edited"), ref, settings=Settings())
    into = tmp_path / "out" / "pulled"
    r = run_cli("pull", ref, "-o", str(into), "--json", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    err = json_error(r.stdout, "pull", 1)
    assert err["type"] == "VerificationFailedError" and "its manifest says verification passed" in err["message"]
    assert not into.exists() and not list(into.parent.glob(f".{into.name}.pull-*"))
    r = run_cli("pull", published[1], "-o", str(tmp_path / "genuine"), "--json", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

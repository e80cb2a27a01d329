"""A LoRA adapter artifact published with its base, to a real Debian docker-registry and a real moto S3 on
127.0.0.1: the base goes first, beside the adapter as the store keeps the two (``<name>/<revision>`` each), the
adapter's OCI manifest names its base by digest, and both pulled into a store layout serve as a pair
(``lora_serving`` finds the base the adapter's manifest names, by content digest)."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from modelyard.stages.adapter import lora_serving
from modelyard.transport import oci
from tests.conftest import json_envelope, json_result, run_cli
from tests.e2e.publish_servers import AWS_ENV
from tests.unit.test_adapter import make_adapter
from tests.unit.test_bundle import _build_artifact

pytestmark = pytest.mark.publish  # needs Debian docker-registry and moto_server: `make test` installs both


@pytest.fixture(scope="module")
def lora_art(tiny_llama_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(base artifact, adapter artifact), both in one folder store."""
    home = tmp_path_factory.mktemp("lora-store")
    base = _build_artifact(tiny_llama_dir, home, hub=False)
    adapter = make_adapter(tiny_llama_dir, tmp_path_factory.mktemp("adapter") / "tiny-lora", r=8)
    r = run_cli("ingest", f"file://{adapter}", "--base", str(base), "--name", "tiny-lora", "--store", str(home),
                "--serve", "completion", "--no-smoke", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return base, Path(json_result(r.stdout, "ingest")["artifact"])


def _pulled_pair(pull_args: list[str], base_ref: str, base: Path, art: Path, root: Path, env: dict | None = None) -> None:
    """Pull the adapter and its base into ``root/<name>/<revision>`` each; the pair must serve together."""
    b = json.loads((base / "manifest.json").read_text())
    a = json.loads((art / "manifest.json").read_text())
    for ref, m in ((base_ref, b), (pull_args[0], a)):
        r = run_cli("pull", ref, "--into", str(root / m["name"] / m["revision"]), env=env)
        assert r.returncode == 0, r.stderr
    serving = lora_serving(root / a["name"] / a["revision"])
    assert serving is not None
    assert (serving.base_model, serving.base_name) == (root / b["name"] / b["revision"] / "model", "tiny")
    assert [n for n, _ in serving.adapters] == ["tiny-lora"]


def test_an_adapter_goes_to_oci_with_its_base_beside_it(lora_art, registry, tmp_path):
    base, art = lora_art
    a = json.loads((art / "manifest.json").read_text())
    b = json.loads((base / "manifest.json").read_text())
    r = run_cli("publish", str(art), "--to", f"oci://{registry}/team/tiny-lora:{a['revision']}", "--json")
    assert r.returncode == 0, r.stderr
    res = json_result(r.stdout, "publish")
    # the base first, in the adapter repository's sibling, tagged with its revision
    assert (res["base"]["uri"], res["base"]["digest"].startswith("sha256:")) == (
        f"oci://{registry}/team/tiny:{b['revision']}", True), res["base"]
    assert res["base"]["content_digest"] == b["content_digest"] == a["base"]["digest"]
    req = urllib.request.Request(f"http://{registry}/v2/team/tiny-lora/manifests/{a['revision']}",
                                 headers={"Accept": oci.MANIFEST_MEDIA_TYPE})
    with urllib.request.urlopen(req, timeout=10) as resp:
        ann = json.loads(resp.read())["annotations"]
    assert {k: v for k, v in ann.items() if k.startswith("dev.modelyard.") and k != "dev.modelyard.content-digest"} == {
        "dev.modelyard.kind": "lora", "dev.modelyard.base.name": "tiny", "dev.modelyard.base.revision": b["revision"],
        "dev.modelyard.base.digest": b["content_digest"], "dev.modelyard.quantization": "none"}
    _pulled_pair([f"oci://{registry}/team/tiny-lora:{a['revision']}"], f"oci://{registry}/team/tiny:{b['revision']}",
                 base, art, tmp_path / "store")
    # --without-base: the adapter alone, to a repository whose sibling has no base
    r = run_cli("publish", str(art), "--to", f"oci://{registry}/solo/tiny-lora:v1", "--without-base", "--json")
    assert json_result(r.stdout, "publish")["base"] is None


def test_an_adapter_goes_to_s3_with_its_base_beside_it(lora_art, s3_endpoint, tmp_path):
    base, art = lora_art
    a = json.loads((art / "manifest.json").read_text())
    b = json.loads((base / "manifest.json").read_text())
    env = {"MODELYARD_S3_ENDPOINT_URL": s3_endpoint, **AWS_ENV}
    r = run_cli("publish", str(art), "--to", f"s3://models/lora/tiny-lora/{a['revision']}", "--json", env=env)
    assert r.returncode == 0, r.stderr
    res = json_result(r.stdout, "publish")
    assert (res["uri"], res["base"]["uri"], res["base"]["content_digest"]) == (
        f"s3://models/lora/tiny-lora/{a['revision']}", f"s3://models/lora/tiny/{b['revision']}", b["content_digest"])
    _pulled_pair([res["uri"]], res["base"]["uri"], base, art, tmp_path / "store", env=env)
    # one level of prefix leaves no room beside it for the base: refused before anything is sent
    r = run_cli("publish", str(art), "--to", "s3://models/flat-lora", "--json", env=env)
    err = json_envelope(r.stdout, "publish", 2)["error"]
    assert err["message"] == ("'s3://models/flat-lora': an adapter's S3 prefix needs two levels, NAME/REVISION, so that "
                              f"its base goes beside it at ../../tiny/{b['revision']} as in the store")
    # an adapter whose base is not beside it in the store
    lone = tmp_path / "lone" / "tiny-lora" / a["revision"]
    shutil.copytree(art, lone)
    r = run_cli("publish", str(lone), "--to", f"s3://models/lone/tiny-lora/{a['revision']}", "--json", env=env)
    err = json_envelope(r.stdout, "publish", 2)["error"]
    assert err["message"].startswith(f"the adapter's base tiny@{b['revision']} ({b['content_digest']}) is not beside it"), err


def test_a_pulled_adapter_is_judged_again_against_the_base_beside_it(lora_art, tmp_path):
    """The carried verdict of a LoRA artifact is its adapter's against its base: an adapter whose declared rank was
    edited after it was verified is refused where its base is beside it, as a pull checks before keeping it."""
    from modelyard.errors import VerificationFailedError
    from modelyard.stages.verify import carried_verdict_holds

    base, art = lora_art
    pair = tmp_path / "store"
    shutil.copytree(base, pair / base.parent.name / base.name)
    edited = pair / art.parent.name / art.name
    shutil.copytree(art, edited)
    carried_verdict_holds(edited)  # as verified: kept
    cfg = json.loads((edited / "model" / "adapter_config.json").read_text())
    (edited / "model" / "adapter_config.json").write_text(json.dumps({**cfg, "r": 4}))
    with pytest.raises(VerificationFailedError, match=r"its model/ fails \d+ check\(s\) now: \[adapter.rank_mismatch\]"):
        carried_verdict_holds(edited)

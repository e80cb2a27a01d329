"""Preflight before the first weight byte: the model card's license, free disk space, the GPU memory the target
needs (the parts that need no hub; tests/e2e/test_hub_ingest.py runs them against the local hub)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from modelyard.checks import Target
from modelyard.errors import InsufficientResourcesError, ServePlanError, VerificationFailedError
from modelyard.flows.options import IngestOptions
from modelyard.flows.preflight import GateBeforeWeights
from modelyard.model.checkpoint import Checkpoint
from modelyard.model.snapshot import Snapshot
from modelyard.model.source import parse_source
from modelyard.settings import Settings
from modelyard.stages.fetch import fetch
from modelyard.stages.fetch.preflight import card_license, refuse_license, require_space
from tests.unit.test_serve_plan import llama_dir


@pytest.mark.parametrize(("card", "expected"), [
    ("---\nlicense: apache-2.0\n---\n# m\n", {"license": "apache-2.0"}),
    ("---\nlicense: other\nlicense_name: llama3.1\nlicense_link: https://example.org/LICENSE\nbase_model: x/y\n---\n",
     {"license": "other", "license_name": "llama3.1", "license_link": "https://example.org/LICENSE"}),
    ("---\nlicense: [mit, cc-by-4.0]\n---\n", {"license": "mit AND cc-by-4.0"}),
    ("---\nlicense: \"apache-2.0\\x1b[2J\"\n---\n", {"license": "apache-2.0\\x1b[2J"}),  # escaped, never raw
    ("# a card without front matter\n", {}),
    ("---\nlanguage: en\n---\n", {}),
    # YAML that does not parse, or a field that is no license id: not read, and said so (not "no license")
    ("---\nlicense: [mit\n---\n",
     {"license_error": "the model card's metadata (YAML front matter) does not parse: while parsing a flow sequence"}),
    ("---\nlicense: {a: b}\nlicense_link: https://example.org/L\n---\n",
     {"license_link": "https://example.org/L", "license_error": "the model card's license is not a license id but a mapping"}),
    ("---\nlicense: [mit, 3]\n---\n", {"license_error": "the model card's license is not a license id but a list of non-strings"}),
    ("# a card without front matter\n", {}),
])
def test_card_license(card, expected):
    assert card_license(card) == expected


def test_a_card_license_is_read_in_one_spelling():
    assert card_license("---\nlicense: \" CC-BY-NC-4.0\\u00a0\\t\"\n---\n") == {"license": "CC-BY-NC-4.0"}
    assert card_license("---\nlicense: other\nlicense_name: \"llama\\u200b3.1 \"\n---\n") == {
        "license": "other", "license_name": "llama3.1"}


def test_an_unreadable_card_is_refused_as_unreadable_not_as_unlicensed():
    prov = {"license_error": "the model card's license is not a license id but a mapping"}
    with pytest.raises(VerificationFailedError) as e:
        refuse_license(prov, ["unknown"], "hf://org/m@abc")
    assert e.value.message == ("hf://org/m@abc: the model card (README.md) names no license that can be read (the model "
                               "card's license is not a license id but a mapping), which --refuse-license refuses")
    refuse_license(prov, ["mit"], "hf://org/m@abc")  # nothing named: nothing of the list matched


@pytest.mark.parametrize(("provenance", "refused", "hit"), [
    ({"license": "cc-by-nc-4.0"}, ["CC-BY-NC-4.0"], "cc-by-nc-4.0"),
    ({"license": "other", "license_name": "llama3.1"}, ["llama3.1"], "llama3.1"),
    ({}, ["unknown"], "unknown"),
    ({"license": "apache-2.0 AND mit"}, ["MIT"], "mit"),  # any id of a card's list refuses it
    ({"license": "apache-2.0"}, ["unknown", "cc-by-nc-4.0"], None),
    ({"license": "cc-by-nc-4.0"}, [], None),
    # spacing is not a license: a trailing space, a tab, a no-break space, a zero-width space, a leading space
    ({"license": "cc-by-nc-4.0 "}, ["CC-BY-NC-4.0"], "cc-by-nc-4.0"),
    ({"license": "cc-by-nc-4.0\t"}, ["CC-BY-NC-4.0"], "cc-by-nc-4.0"),
    ({"license": "\u00a0cc-by-nc-4.0"}, ["CC-BY-NC-4.0"], "cc-by-nc-4.0"),
    ({"license": "cc-by-nc\u200b-4.0"}, ["CC-BY-NC-4.0"], "cc-by-nc-4.0"),
    ({"license": "other", "license_name": " CC-BY-NC-4.0"}, ["cc-by-nc-4.0"], "cc-by-nc-4.0"),
    ({"license": "cc-by-nc-4.0"}, [" cc-by-nc-4.0\u00a0"], "cc-by-nc-4.0"),
    ({"license": "(Apache-2.0 OR CC-BY-NC-4.0)"}, ["cc-by-nc-4.0"], "cc-by-nc-4.0"),  # any id of an SPDX expression
    ({"license": "apache-2.0 and\tmit"}, ["mit"], "mit"),
])
def test_refuse_license(provenance, refused, hit):
    if hit is None:
        refuse_license(provenance, refused, "hf://org/m@abc")
        return
    with pytest.raises(VerificationFailedError) as e:
        refuse_license(provenance, refused, "hf://org/m@abc")
    said = "names no license" if hit == "unknown" else f"says license: {hit}"
    assert e.value.message == f"hf://org/m@abc: the model card (README.md) {said}, which --refuse-license refuses"
    assert e.value.fix == f"Drop --refuse-license {hit} if this license is acceptable, or choose another model."
    assert e.value.exit_code == 1


def test_require_space_names_the_folder_and_the_bytes(tmp_path):
    folder = tmp_path / "not-yet" / "blobs"  # asked of its nearest existing parent's filesystem
    with pytest.raises(InsufficientResourcesError) as e:
        require_space([(folder, 10**18, "downloading 1 weight file(s) of org/m")])
    free = shutil.disk_usage(tmp_path).free
    msg = e.value.message
    assert msg.startswith(f"{folder} has ") and msg.endswith(
        " bytes free; this run needs 1,000,000,000,000,000,000 there "
        "(downloading 1 weight file(s) of org/m 1,000,000,000,000,000,000 bytes)")
    assert abs(int(msg.split(" has ")[1].split(" ")[0].replace(",", "")) - free) < 1 << 30
    assert e.value.exit_code == 2 and not folder.parent.exists()  # nothing made
    require_space([(folder, 1, "a byte"), (folder, 0, "nothing"), (folder, -5, "nothing either")])


def test_needs_on_one_filesystem_add_up(tmp_path):
    half = shutil.disk_usage(tmp_path).free // 2 + (4 << 20)
    require_space([(tmp_path / "a", half - (8 << 20), "the download")])  # each alone fits
    with pytest.raises(InsufficientResourcesError, match=r"\(the download [0-9,]+ bytes, the fp8 variant [0-9,]+ bytes\)"):
        require_space([(tmp_path / "a", half, "the download"), (tmp_path / "b", half, "the fp8 variant")])


def _snapshot(root: Path) -> Snapshot:
    return fetch(parse_source(f"file://{root}"), Settings(home=root.parent / "store"))


def test_the_gate_refuses_a_model_too_big_for_the_gpu_before_verify(tmp_path):
    """Llama 3.1 8B (config only: no weight byte is needed to plan) at 131,072 tokens on one L4: refused by the
    serve plan, before the verifier would look for weights."""
    d = llama_dir(tmp_path, "8b")
    gate = GateBeforeWeights.of(IngestOptions(gpu="L4-24GB", max_model_len=131072), Settings(home=tmp_path / "s"))
    snap = Snapshot(root=d, source=f"file://{d}", kind="file", files=())
    with pytest.raises(ServePlanError) as e:
        gate(snap)
    assert e.value.message.startswith(f"file://{d} on 1 x L4-24GB (tensor parallel 1, utilization 0.9): the KV cache "
                                      "holds 18,736 tokens")  # names the model asked for
    assert "131,072-token sequence" in e.value.message
    assert "--gpus 2" in e.value.fix
    # a quantized variant is planned after quantizing: its unquantized weights are not judged here
    with pytest.raises(VerificationFailedError):  # ...the verifier is (no weights at all)
        GateBeforeWeights(Target(), IngestOptions().patching, IngestOptions(gpu="L4-24GB").serving,
                          quantize="fp8-dynamic")(snap)


def test_the_gate_passes_a_healthy_model_and_returns_what_the_run_will_write(tiny_llama_dir, tmp_path):
    snap = _snapshot(tiny_llama_dir)
    settings = Settings(home=tmp_path / "store")
    assert GateBeforeWeights.of(IngestOptions(), settings)(snap) == []  # staging beside the cache: hard links
    needs = GateBeforeWeights.of(IngestOptions(quantize="fp8-dynamic", gpu="H100-80GB"), settings)(snap)
    weight_bytes = sum(t.end - t.begin for t in Checkpoint(tiny_llama_dir).tensors.values())
    # the quantize stage's own estimate: the weights at 8 of 16 bits, plus 10 % and 64 MiB
    assert needs == [(settings.staging_dir(), int(weight_bytes * 8 / 16 * 1.1 + 64 * 1024**2), "the fp8-dynamic variant")]


def test_a_folders_card_license_is_recorded(tiny_llama_dir, tmp_path):
    src = tmp_path / "carded"
    shutil.copytree(tiny_llama_dir, src)
    src.chmod(0o755)
    (src / "README.md").write_text("---\nlicense: cc-by-nc-4.0\n---\n# carded\n")
    snap = _snapshot(src)
    assert snap.provenance == {"license": "cc-by-nc-4.0"}
    assert "README.md" in snap.left_out  # read for its license, not taken into model/


def test_verify_judges_a_folder_for_the_gpu_and_its_card_license(tmp_path, tiny_llama_dir):
    """`verify FOLDER --gpu/--gpus` plans weights + KV cache at --max-model-len as ingest's gate does (exit 2 when
    it does not fit, before any check); `--refuse-license` reads the folder's own model card (README.md)."""
    from tests.conftest import json_error, json_result, run_cli

    d = llama_dir(tmp_path, "8b")
    r = run_cli("verify", str(d), "--gpu", "L4-24GB", "--max-model-len", "131072", "--json")
    err = json_error(r.stdout, "verify", 2)
    assert err["type"] == "ServePlanError" and "the KV cache holds 18,736 tokens" in err["message"]
    assert "131,072-token sequence" in err["message"] and "--gpus 2" in err["fix"]
    carded = tmp_path / "carded"
    shutil.copytree(tiny_llama_dir, carded)
    (carded / "README.md").write_text("---\nlicense: llama3.1\n---\n# a card\n")
    r = run_cli("verify", str(carded), "--refuse-license", "LLAMA3.1", "--json")
    err = json_error(r.stdout, "verify", 1)
    assert (err["type"], err["message"]) == ("VerificationFailedError", f"{carded}: the model card (README.md) says "
                                                                        "license: llama3.1, which --refuse-license refuses")
    r = run_cli("verify", str(carded), "--refuse-license", "unknown", "--gpu", "L4-24GB", "--json")
    assert json_result(r.stdout, "verify")["summary"]["errors"] == 0, r.stdout[-2000:]

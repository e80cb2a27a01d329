"""The defect cases of ../shared/cases that the foundation gate covers (read in place, never copied).

The full suite of cases belongs to the verification issue; here: the healthy base, the index/shard
cases (C07*), the LFS pointer (C08) and the truncated download (C09).
"""

import pytest

from modelyard.pipeline.verify import verify_folder
from tests.conftest import SHARED_CASES, run_cli

pytestmark = pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases is not beside this checkout")

EXPECTED = {
    "B-healthy": [],
    "C07-index-missing-shard-fixed": [],
    "C07-index-missing-shard": [("safetensors.index.missing_shard", "model-00002-of-00002.safetensors")],
    "C07a-index-missing-shard-fp8": [("safetensors.index.missing_shard", "model-00002-of-00002.safetensors")],
    "C07b-index-30-shards-15-present": [("safetensors.index.missing_shard", f"model-{i:05d}-of-00030.safetensors")
                                        for i in range(16, 31)],
    "C08-lfs-pointer": [("files.lfs_pointer", "model.safetensors")],
    "C09-truncated-download": [("safetensors.data.truncated", "model.safetensors")],
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_case_errors(case):
    r = verify_folder(SHARED_CASES / case)
    got = []
    for f in r.errors:
        where = f.field.split(" -> ")[1] if f.code == "safetensors.index.missing_shard" else f.file
        got.append((f.code, where))
    assert got == EXPECTED[case]


def test_c07_missing_tensors_named():
    r = verify_folder(SHARED_CASES / "C07-index-missing-shard")
    assert r.errors[0].value == ["lm_head.weight", "model.layers.0.mlp.down_proj.weight",
                                 "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]


def test_cli_exit_codes_on_cases():
    bad = run_cli("verify", str(SHARED_CASES / "C07-index-missing-shard"))
    assert bad.returncode == 1
    assert "model-00002-of-00002.safetensors" in bad.stderr and "lm_head.weight" in bad.stderr
    good = run_cli("verify", str(SHARED_CASES / "B-healthy"))
    assert good.returncode == 0, good.stderr
    assert "PASS" in good.stdout

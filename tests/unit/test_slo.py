"""The bench level's service-level targets: parsing --slo, the default table per class (the same as
the one in docs/reference/smoke.md), the verdict, the device -> class mapping, reuse of a stored bench
run, and the usage errors of the CLI. The real runs (loose targets pass, an impossible one fails) are
in tests/e2e/test_serving_kit_vllm.py."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from modelyard.artifact.records import SmokeRecord
from modelyard.cli import app
from modelyard.errors import InvalidTargetError
from modelyard.flows.ingest import smoke_covers
from modelyard.flows.options import IngestOptions
from modelyard.stages.smoke import bench
from tests.conftest import ROOT


def test_parse_slo():
    assert bench.parse_slo("ttft_p95_ms=500, itl_p95_ms=50.5,error_rate=0") == {
        "ttft_p95_ms": 500.0, "itl_p95_ms": 50.5, "error_rate": 0.0}
    assert bench.parse_slo(None) == {} and bench.parse_slo("") == {}
    assert bench.parse_slo("output_tokens_per_s=10,ttft_p99_ms=0.001") == {"output_tokens_per_s": 10.0,
                                                                           "ttft_p99_ms": 0.001}


@pytest.mark.parametrize("text,msg", [
    ("ttft_p95=5", "unknown target 'ttft_p95'"),
    ("ttft_p95_ms", "'ttft_p95_ms': no =value"),
    ("ttft_p95_ms=-1", "ttft_p95_ms='-1' is not a number in range"),
    ("ttft_p95_ms=fast", "ttft_p95_ms='fast' is not a number in range"),
    ("ttft_p95_ms=nan", "ttft_p95_ms='nan' is not a number in range"),
    ("error_rate=1.5", "error_rate='1.5' is not a number in range"),
    ("itl_p95_ms=5,itl_p95_ms=6", "gives itl_p95_ms twice"),
])
def test_bad_slo_is_a_usage_error(text, msg):
    with pytest.raises(InvalidTargetError) as e:
        bench.parse_slo(text)
    assert msg in e.value.message and e.value.exit_code == 2


def test_default_targets_per_class():
    assert bench.default_targets("cpu") == {"ttft_p95_ms": 30000.0, "itl_p95_ms": 2000.0, "error_rate": 0.0}
    # H100 80GB: 81559 MiB / 3.35 TB/s = 25.5 ms per full read; twice that, rounded up to 5 ms
    assert bench.default_targets("H100") == {"ttft_p95_ms": 500.0, "itl_p95_ms": 55.0, "error_rate": 0.0}
    assert bench.default_targets("L4-24GB")["itl_p95_ms"] == 165.0  # 23034 MiB / 0.3 TB/s = 80.5 ms
    assert bench.default_targets(None) == {"error_rate": 0.0}
    with pytest.raises(InvalidTargetError, match="--slo-class 'V100' is not a GPU class"):
        bench.default_targets("V100")
    assert set(bench.BANDWIDTH_TBPS) == set(bench.GPUS)  # every GPU class of the serve plan has a row


def test_docs_table_is_the_code_table():
    """docs/reference/smoke.md's table of defaults says what default_targets gives, row by row."""
    doc = (ROOT / "docs" / "reference" / "smoke.md").read_text()
    rows = re.findall(r"^\| `([\w-]+)` \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", doc, re.M)
    assert [r[0] for r in rows] == ["cpu", *bench.GPUS]
    for cls, ttft, itl, err in rows:
        assert bench.default_targets(cls) == {"ttft_p95_ms": float(ttft), "itl_p95_ms": float(itl),
                                              "error_rate": float(err)}, cls


BENCH = {"completed": 7, "failed": 1, "p95_ttft_ms": 812.5, "p99_itl_ms": 40.0, "output_throughput": 25.0}


def test_judge():
    v = bench.judge(BENCH, {"ttft_p95_ms": 1000.0, "itl_p99_ms": 30.0, "error_rate": 0.2, "output_tokens_per_s": 30.0,
                            "e2el_p50_ms": 5.0}, cls="cpu", explicit={"itl_p99_ms": 30.0}).to_dict()
    assert v["class"] == "cpu" and v["passed"] is False
    assert [(x["target"], x["value"], x["passed"], x["source"]) for x in v["verdicts"]] == [
        ("ttft_p95_ms", 812.5, True, "default"), ("itl_p99_ms", 40.0, False, "--slo"),
        ("error_rate", 0.125, True, "default"), ("output_tokens_per_s", 25.0, False, "default"),
        ("e2el_p50_ms", None, False, "default")]  # not measured: missed
    assert bench.judge(BENCH, {"ttft_p95_ms": 812.5}, cls=None).passed is True  # the bound is inclusive
    # nothing completed: no latency stands, the error rate is 1
    none = bench.judge({"completed": 0, "failed": 8, "p95_ttft_ms": 0.0}, {"ttft_p95_ms": 1e9, "error_rate": 1.0}, cls=None)
    assert [(x.value, x.passed) for x in none.verdicts] == [(None, False), (1.0, True)]
    assert bench.missed({"slo": v}) == ["slo:itl_p99_ms", "slo:output_tokens_per_s", "slo:e2el_p50_ms"]


def test_device_class():
    assert bench.device_class({"type": "cpu", "name": "cpu", "memory_bytes": None}) == "cpu"
    assert bench.device_class({"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984}) == "H100-80GB"
    assert bench.device_class({"type": "cuda", "name": "NVIDIA H100 NVL", "memory_bytes": 95830 * 2**20}) == "H100-94GB"
    assert bench.device_class({"type": "cuda", "name": "Tesla T4", "memory_bytes": 16 * 2**30}) is None
    assert bench.device_class(None) is None


def _stored(ttft_p95: float) -> SmokeRecord:
    b = {"completed": 8, "failed": 0, "p95_ttft_ms": ttft_p95, "p95_itl_ms": 150.0}
    return SmokeRecord.model_validate({"passed": True, "level": "bench", "mode": "chat", "numeric": {"passed": True},
                                       "bench": b | {"slo": bench.judge(b, bench.default_targets("cpu"), cls="cpu").to_dict()}})


def test_stored_bench_is_rejudged_against_new_targets():
    prev = _stored(6500.0)
    assert smoke_covers(prev, IngestOptions(smoke_level="bench")) is True
    assert smoke_covers(prev, IngestOptions(smoke_level="bench", slo="ttft_p95_ms=7000")) is True
    assert smoke_covers(prev, IngestOptions(smoke_level="bench", slo="ttft_p95_ms=5000")) is False
    # the stored run's class (cpu) gives the other targets; H100's 55 ms ITL is not met by 150 ms
    assert smoke_covers(prev, IngestOptions(smoke_level="bench", slo_class="H100-80GB", slo="ttft_p95_ms=7000")) is False
    assert smoke_covers(prev, IngestOptions(smoke_level="server")) is True


@pytest.mark.parametrize("args,msg", [
    (["--smoke", "server", "--slo", "ttft_p95_ms=1"], "--slo and --slo-class judge the bench load, not --smoke server"),
    (["--smoke", "bench", "--slo", "ttft=1"], "unknown target 'ttft'"),
    (["--smoke", "bench", "--slo-class", "V100"], "--slo-class 'V100' is not a GPU class"),
    (["--smoke", "load", "--url", "http://127.0.0.1:9"], "--url needs --smoke server or bench"),
])
def test_smoke_cli_usage_errors(tiny_llama_dir, args, msg):
    r = CliRunner().invoke(app, ["smoke", str(tiny_llama_dir), *args, "--json"])
    assert r.exit_code == 2, r.output
    assert msg in r.stdout


def test_ingest_refuses_slo_without_bench(tiny_llama_dir, tmp_path):
    r = CliRunner().invoke(app, ["ingest", f"file://{tiny_llama_dir}", "--store", str(tmp_path), "--slo",
                                 "ttft_p95_ms=1", "--json"])
    assert r.exit_code == 2, r.output
    assert "--slo and --slo-class judge the bench load" in r.stdout
    assert not list(tmp_path.glob("*/*/manifest.json"))

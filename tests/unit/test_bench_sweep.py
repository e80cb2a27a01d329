"""The bench sweep: parsing of the levels, the length mix and a prompts file, the plan the runner gets, the
duration sizing of the runner, the verdict per level and the sizing answer (the highest concurrency meeting
the SLO), and the files of --bench-out (bench.json and a PNG that opens). The real sweep against vLLM is in
tests/e2e/test_bench_slo_vllm.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from modelyard.cli import app
from modelyard.errors import InvalidTargetError
from modelyard.runtime.process import ScriptRun
from modelyard.stages.smoke import bench, bench_out, sweep


def _runner():
    spec = importlib.util.spec_from_file_location("vllm_bench_runner", bench.RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_levels():
    assert sweep.parse_levels("4, 1,2") == (1, 2, 4)
    assert sweep.parse_levels("8") == (8,)
    assert sweep.parse_levels(",".join(map(str, range(1, 17)))) == tuple(range(1, 17))


@pytest.mark.parametrize("text,msg", [
    ("1,0", "--concurrency '0' is not an integer >= 1"), ("1,x", "--concurrency 'x' is not an integer >= 1"),
    ("2,-1", "--concurrency '-1' is not"), ("1,2,1", "--concurrency gives 1 twice"), (" , ", "gives 0 levels"),
    (",".join(map(str, range(1, 18))), "gives 17 levels"),
])
def test_bad_levels(text, msg):
    with pytest.raises(InvalidTargetError, match=msg.replace("(", r"\(")):
        sweep.parse_levels(text)


def test_load_prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Hi", "output_len": 5}\n\n{"prompt": "Tell me"}\n')
    assert sweep.load_prompts(f, 16) == [{"prompt": "Hi", "output_len": 5}, {"prompt": "Tell me", "output_len": 16}]


@pytest.mark.parametrize("text,msg", [
    ("{nope\n", "line 1 is not JSON"), ('{"prompt": "a"}\n{"text": "b"}\n', 'line 2 has no non-empty "prompt"'),
    ('{"prompt": "  "}\n', 'line 1 has no non-empty "prompt"'), ('["a"]\n', 'line 1 has no non-empty'),
    ('{"prompt": "a", "output_len": 0}\n', "line 1: output_len 0 is not an integer >= 1"),
    ('{"prompt": "a", "output_len": true}\n', "output_len True is not"),
    ('{"prompt": "a", "output_tokens": 3}\n', "line 1 has unknown keys ['output_tokens']"),
    ("\n\n", "holds no prompt"),
])
def test_bad_prompts_file(tmp_path, text, msg):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    with pytest.raises(InvalidTargetError) as exc:
        sweep.load_prompts(f, 16)
    assert msg in str(exc.value)


def test_a_prompts_file_that_never_ends_is_refused_not_read_to_the_end():
    with pytest.raises(InvalidTargetError) as exc:
        sweep.load_prompts(Path("/dev/zero"), 16)
    assert exc.value.message == "--prompts /dev/zero is over 67,108,864 bytes (or never ends)"
    assert exc.value.exit_code == 2


def test_bench_spec(tmp_path):
    assert sweep.bench_spec() == sweep.BenchSpec() and sweep.BenchSpec().levels == (4,)
    s = sweep.bench_spec(concurrency="2,1", requests=4, input_len=64, output_len=8, range_ratio=0.5)
    assert (s.levels, s.max_concurrency, s.num_prompts, s.input_len, s.output_len, s.range_ratio, s.duration) == \
        ((1, 2), 2, 4, 64, 8, 0.5, None)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Hi"}\n')
    s = sweep.bench_spec(prompts=f, duration=2.5)
    assert (s.prompts, s.duration, s.levels, s.num_prompts) == (str(f), 2.5, (4,), 8)
    assert s.prompts_source == f"{f}@sha256:97472c8b8126"


@pytest.mark.parametrize("kw,msg", [
    ({"requests": 4, "duration": 5.0}, "--requests and --duration both bound a level"),
    ({"range_ratio": 1.0}, "--range-ratio 1.0 is outside [0, 1)"), ({"range_ratio": -0.1}, "outside [0, 1)"),
    ({"requests": 0}, "must be >= 1"), ({"output_len": 0}, "must be >= 1"),
    ({"duration": 0.0}, "--duration 0.0 is not a number of seconds > 0"),
    ({"duration": float("inf")}, "is not a number of seconds"),
    ({"input_len": 8, "prompts": Path("x.jsonl")}, "shape random prompts, not a --prompts file"),
    ({"prompts": Path("/nonexistent/p.jsonl")}, "--prompts /nonexistent/p.jsonl: cannot read it"),
])
def test_bad_bench_spec(kw, msg):
    with pytest.raises(InvalidTargetError) as exc:
        sweep.bench_spec(**kw)
    assert msg in str(exc.value)


def test_dataset_args(tmp_path):
    assert sweep.dataset_args(sweep.BenchSpec(), tmp_path) == [
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "16", "--random-range-ratio", "0.0"]
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "Hi", "output_len": 5}\n{"prompt": "Yo"}\n')
    args = sweep.dataset_args(sweep.bench_spec(prompts=f, output_len=7), tmp_path)
    assert args == ["--dataset-name", "custom", "--dataset-path", str(tmp_path / "prompts.jsonl"),
                    "--custom-output-len", "-1", "--skip-chat-template"]
    # vLLM's CustomDataset reads "prompt" and "output_tokens"
    assert (tmp_path / "prompts.jsonl").read_text() == \
        '{"prompt": "Hi", "output_tokens": 5}\n{"prompt": "Yo", "output_tokens": 7}\n'


def test_sized_concurrency():
    lv = [{"concurrency": c, "passed": p} for c, p in ((1, True), (2, True), (4, False), (8, True))]
    assert sweep.sized_concurrency(lv) == 2  # 8 passing above a miss at 4 is not a safe size
    assert sweep.sized_concurrency(lv[:2]) == 2
    assert sweep.sized_concurrency([{"concurrency": 1, "passed": False}, *lv[1:]]) is None
    assert sweep.sized_concurrency([]) is None


def test_runner_sizes_a_duration_level(monkeypatch):
    runner = _runner()
    assert runner.probe_prompts(4) == 8
    assert runner.requests_for(10.0, 2.34, 8) == 24  # ceil(23.4)
    assert runner.requests_for(1.0, 2.0, 8) == 8  # never fewer than the probe
    assert runner.requests_for(1e6, 50.0, 8) == runner.MAX_SIZED
    assert runner.requests_for(10.0, None, 8) == 8 and runner.requests_for(10.0, 0.0, 8) == 8
    calls = []

    def fake(args, n):
        calls.append(n)
        return {"duration": n / 2.0, "request_throughput": 2.0, "completed": n, "failed": 0}

    monkeypatch.setattr(runner, "_bench", fake)
    r = runner.run_level({"concurrency": 2, "args": ["--x"], "duration": 6.0, "num_prompts": None})
    assert calls == [4, 12] and (r["ok"], r["num_prompts"], r["result"]["completed"]) == (True, 12, 12)
    assert r["probe"] == {"num_prompts": 4, "duration": 2.0, "request_throughput": 2.0}
    calls.clear()  # a probe that already ran for the duration is the level
    r = runner.run_level({"concurrency": 2, "args": [], "duration": 1.5, "num_prompts": None})
    assert calls == [4] and r["num_prompts"] == 4
    calls.clear()
    r = runner.run_level({"concurrency": 1, "args": [], "duration": None, "num_prompts": 5})
    assert calls == [5] and r["probe"] is None and r["num_prompts"] == 5

    def broken(args, n):
        raise ValueError("no server")

    monkeypatch.setattr(runner, "_bench", broken)
    r = runner.run_level({"concurrency": 1, "args": [], "duration": None, "num_prompts": 5})
    assert (r["ok"], r["error"]) == (False, "ValueError: no server")


def _figures(c: int, ttft: float, failed: int = 0) -> dict:
    return {"completed": 4 - failed, "failed": failed, "duration": 2.0 * c, "total_output_tokens": 16 * (4 - failed),
            "request_throughput": 1.0 * c, "output_throughput": 10.0 * c, "total_token_throughput": 30.0 * c,
            **{f"p{p}_{m}_ms": ttft * (1 + p / 100) for m in ("ttft", "itl", "tpot", "e2el") for p in (50, 95, 99)},
            "errors": ["boom"] * failed}


def _run(monkeypatch, tmp_path, levels, spec, slo=None):
    """run_bench with the runner replaced by canned ``levels`` (its result file); returns the result and the plan."""
    seen = {}

    def fake_run(python, script, args, *, env, timeout, log):
        seen["plan"] = json.loads(Path(args[args.index("--plan") + 1]).read_text())
        seen["timeout"] = timeout
        Path(args[args.index("--out") + 1]).write_text(json.dumps({
            "ok": all(x["ok"] for x in levels), "error": next((x["error"] for x in levels if not x["ok"]), None),
            "levels": levels, "device": {"type": "cpu", "name": "cpu", "memory_bytes": None}}))
        return ScriptRun(returncode=0, timed_out=False, seconds=1.0, tail="")

    monkeypatch.setattr(bench, "run_script", fake_run)
    return bench.run_bench(Path("py"), "http://h:1", "demo", Path("/tok"), spec, {}, tmp_path, slo=slo), seen


def _level(c, ttft, failed=0, n=4):
    return {"concurrency": c, "num_prompts": n, "ok": True, "error": None, "result": _figures(c, ttft, failed),
            "probe": None}


def test_sweep_verdict_per_level_and_sizing(monkeypatch, tmp_path):
    spec = sweep.bench_spec(concurrency="1,2,4", requests=4)
    r, seen = _run(monkeypatch, tmp_path, [_level(1, 100.0), _level(2, 200.0), _level(4, 900.0)], spec,
                   slo={"ttft_p95_ms": 500.0})
    assert [x["concurrency"] for x in seen["plan"]["levels"]] == [1, 2, 4] and seen["timeout"] == 900.0
    args = seen["plan"]["levels"][1]["args"]
    assert args[-2:] == ["--max-concurrency", "2"] and "--num-prompts" not in args
    assert [x["num_prompts"] for x in seen["plan"]["levels"]] == [4, 4, 4]
    assert [(x["concurrency"], x["passed"], x["slo"]["passed"]) for x in r["levels"]] == [
        (1, True, True), (2, True, True), (4, False, False)]
    assert [[(v["target"], v["value"], v["passed"]) for v in x["slo"]["verdicts"] if v["target"] == "ttft_p95_ms"]
            for x in r["levels"]] == [[("ttft_p95_ms", 195.0, True)], [("ttft_p95_ms", 390.0, True)],
                                      [("ttft_p95_ms", 1755.0, False)]]
    assert (r["max_concurrency_meeting_slo"], r["passed"]) == (2, True)
    # the headline is the sizing level's figures
    assert (r["p95_ttft_ms"], r["request_throughput"], r["total_token_throughput"], r["slo"]["passed"]) == \
        (390.0, 2.0, 60.0, True)
    assert r["spec"]["concurrency"] == [1, 2, 4] and r["spec"]["max_concurrency"] == 4
    assert bench.missed(r) == []


def test_sweep_whose_lowest_level_misses_fails(monkeypatch, tmp_path):
    r, _ = _run(monkeypatch, tmp_path, [_level(1, 100.0, failed=1), _level(2, 100.0)],
                sweep.bench_spec(concurrency="1,2", requests=4))
    assert [x["passed"] for x in r["levels"]] == [False, True]
    assert (r["max_concurrency_meeting_slo"], r["passed"], r["failed"], r["errors"]) == (None, False, 1, ["boom"])
    assert bench.missed(r) == ["slo:error_rate"]  # the headline is the lowest level


def test_unaccounted_requests_and_a_failed_level(monkeypatch, tmp_path):
    short = _level(1, 100.0, n=5)  # 4 of 5 came back: not every request is accounted for
    broken = {"concurrency": 2, "num_prompts": 4, "ok": False, "error": "RuntimeError: gone", "result": None, "probe": None}
    r, _ = _run(monkeypatch, tmp_path, [_level(1, 100.0), broken], sweep.bench_spec(concurrency="1,2", requests=4))
    assert [x["passed"] for x in r["levels"]] == [True, False] and r["levels"][1]["errors"] == ["RuntimeError: gone"]
    assert (r["max_concurrency_meeting_slo"], r["passed"], r["error"]) == (1, False, "RuntimeError: gone")
    r, _ = _run(monkeypatch, tmp_path, [short], sweep.BenchSpec())
    assert (r["levels"][0]["slo"]["passed"], r["levels"][0]["passed"], r["passed"]) == (True, False, False)


def test_default_load_keeps_its_keys(monkeypatch, tmp_path):
    r, seen = _run(monkeypatch, tmp_path, [_level(4, 100.0, n=8) | {"result": _figures(4, 100.0) | {"completed": 8}}],
                   sweep.BenchSpec())
    assert seen["plan"]["levels"][0]["args"][-2:] == ["--max-concurrency", "4"] and seen["timeout"] == 300.0
    assert set(bench.KEPT) | {"errors", "slo", "spec", "client", "device", "passed", "levels", "headline",
                              "max_concurrency_meeting_slo", "max_request_rate_meeting_slo"} == set(r)
    assert (r["completed"], r["passed"], r["max_concurrency_meeting_slo"], r["spec"]["num_prompts"]) == (8, True, 4, 8)
    assert (r["headline"], r["max_request_rate_meeting_slo"]) == (
        {"concurrency": 4, "request_rate": None, "num_prompts": 8}, None)


def _rated(rate, ttft, failed=0, n=4):
    return {**_level(1, ttft, failed, n), "concurrency": None, "request_rate": rate}


def test_open_loop_sweep_offers_poisson_arrivals_and_sizes_by_rate(monkeypatch, tmp_path):
    """--request-rate: each level offers its rate with Poisson arrivals (vLLM bench's --request-rate, burstiness 1)
    whatever the answers do; the sizing answer is the highest rate meeting the targets, and the headline says which
    level it is (it said the spec's concurrency, whatever level the figures came from)."""
    spec = sweep.bench_spec(request_rate="4,0.5,2", duration=10.0)
    assert (spec.request_rates, spec.open_loop, spec.level_key) == ((0.5, 2.0, 4.0), True, "request_rate")
    r, seen = _run(monkeypatch, tmp_path, [_rated(0.5, 100.0, n=5), _rated(2.0, 200.0, n=20),
                                           _rated(4.0, 900.0, n=40)], spec, slo={"ttft_p95_ms": 500.0})
    plan = seen["plan"]["levels"]
    assert [(x["request_rate"], x["concurrency"], x["num_prompts"], x["duration"]) for x in plan] == [
        (0.5, None, 5, None), (2.0, None, 20, None), (4.0, None, 40, None)]
    assert plan[1]["args"][-4:] == ["--request-rate", "2", "--burstiness", "1.0"]
    assert "--max-concurrency" not in plan[1]["args"]
    assert [(x["request_rate"], x["passed"]) for x in r["levels"]] == [(0.5, False), (2.0, False), (4.0, False)]
    # _figures counts 4 answers per level: 5, 20 and 40 sent are not all accounted for; with 4 sent, they are
    r, seen = _run(monkeypatch, tmp_path, [_rated(0.5, 100.0), _rated(2.0, 200.0), _rated(4.0, 900.0)],
                   sweep.bench_spec(request_rate="0.5,2,4", requests=4, concurrency="8"), slo={"ttft_p95_ms": 500.0})
    assert seen["plan"]["levels"][0]["args"][-6:] == ["--request-rate", "0.5", "--burstiness", "1.0",
                                                      "--max-concurrency", "8"]
    assert [(x["request_rate"], x["passed"]) for x in r["levels"]] == [(0.5, True), (2.0, True), (4.0, False)]
    assert (r["max_request_rate_meeting_slo"], r["max_concurrency_meeting_slo"], r["passed"]) == (2.0, None, True)
    assert r["headline"] == {"concurrency": None, "request_rate": 2.0, "num_prompts": 4}
    assert (r["spec"]["request_rates"], r["spec"]["concurrency"]) == ([0.5, 2.0, 4.0], [8])
    files = bench_out.write_bench_out(tmp_path / "rated", r)
    with Image.open(files["plot"]) as im:
        assert (im.format, im.size) == ("PNG", (1100, 750))


@pytest.mark.parametrize(("text", "msg"), [
    ("0", "--request-rate '0' is not a number of requests per second > 0"),
    ("1,x", "--request-rate 'x' is not a number of requests per second > 0"),
    ("inf", "--request-rate 'inf' is not a number of requests per second > 0"),
    ("2,2", "--request-rate gives 2 twice"),
])
def test_request_rates_are_positive_numbers_given_once(text, msg):
    with pytest.raises(InvalidTargetError) as e:
        sweep.parse_rates(text)
    assert e.value.message == msg
    with pytest.raises(InvalidTargetError) as e:
        sweep.bench_spec(request_rate="1,2", concurrency="1,2")
    assert e.value.message == "--request-rate sweeps arrival rates; --concurrency '1,2' gives several levels"


def test_duration_plan(monkeypatch, tmp_path):
    _, seen = _run(monkeypatch, tmp_path, [_level(1, 1.0)], sweep.bench_spec(concurrency="1", duration=30.0))
    assert seen["plan"]["levels"][0]["duration"] == 30.0 and seen["plan"]["levels"][0]["num_prompts"] is None
    assert seen["timeout"] == 360.0


def test_bench_out_writes_json_and_a_png(monkeypatch, tmp_path):
    r, _ = _run(monkeypatch, tmp_path, [_level(1, 100.0), _level(2, 200.0), _level(4, 900.0)],
                sweep.bench_spec(concurrency="1,2,4", requests=4), slo={"ttft_p95_ms": 500.0, "output_tokens_per_s": 5.0})
    files = bench_out.write_bench_out(tmp_path / "out" / "sub", r)
    assert files == {"json": str(tmp_path / "out/sub/bench.json"), "plot": str(tmp_path / "out/sub/bench.png")}
    assert json.loads(Path(files["json"]).read_text()) == r
    png = Path(files["plot"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with Image.open(png) as im:
        im.load()
        assert (im.format, im.size) == ("PNG", bench_out.PIXELS) == ("PNG", (1100, 750))
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (750, 1100)
    assert sorted(p.name for p in png.parent.iterdir()) == ["bench.json", "bench.png"]  # no temp file left


@pytest.mark.parametrize("args,msg", [
    (["--smoke", "server", "--concurrency", "1,2"], "--concurrency shape the bench load, not --smoke server"),
    (["--smoke", "load", "--requests", "4", "--bench-out", "x"], "--requests, --bench-out shape the bench load"),
    (["--smoke", "bench", "--concurrency", "1,1"], "--concurrency gives 1 twice"),
    (["--smoke", "bench", "--requests", "4", "--duration", "5"], "--requests and --duration both bound a level"),
    (["--smoke", "bench", "--range-ratio", "1.5"], "--range-ratio 1.5 is outside [0, 1)"),
])
def test_sweep_cli_usage_errors(tiny_llama_dir, args, msg):
    r = CliRunner().invoke(app, ["smoke", str(tiny_llama_dir), *args, "--json"])
    assert r.exit_code == 2, r.output
    assert msg in r.stdout

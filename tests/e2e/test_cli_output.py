"""`ingest` as CI runs it, stdout and stderr piped: the exact lines of both (one plain line per finished stage,
nothing wrapped, no progress bars, no library output) and the artifact's model/ holding only what a runtime
reads, the training leftovers named in the report."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from rich.filesize import decimal

from tests.conftest import run_cli, store_artifacts

pytestmark = pytest.mark.e2e


def test_piped_ingest_prints_plain_lines_and_leaves_training_files_out(tiny_llama_dir, tmp_path):
    src = tmp_path / "finetuned"
    shutil.copytree(tiny_llama_dir, src)
    (src / "trainer_state.json").write_text('{"global_step": 500}\n')
    (src / "eval_results.json").write_text('{"eval_loss": 1.25}\n')
    home = tmp_path / "store"
    r = run_cli("ingest", f"file://{src}", "--no-smoke", "--store", str(home))
    assert r.returncode == 0, r.stderr
    (art,) = store_artifacts(home)
    own = sorted(p.name for p in tiny_llama_dir.iterdir())
    assert sorted(p.name for p in (art / "model").iterdir()) == own
    report = json.loads((art / "report.json").read_text())
    assert [(f["code"], f["severity"], f["file"]) for f in report["findings"]] == [
        ("files.left_out", "info", "eval_results.json"), ("files.left_out", "info", "trainer_state.json")]
    manifest = json.loads((art / "manifest.json").read_text())
    assert r.stdout.splitlines() == [
        f"artifact: {art}",
        f"name: finetuned  revision: {art.name}",
        f"content: {manifest['content_digest']}",
        "verification: passed (0 errors, 0 warnings)",
        "left out of model/ (no runtime reads them; see report.json): eval_results.json, trainer_state.json",
        "smoke: skipped (--no-smoke)",
    ]
    size = decimal(sum((tiny_llama_dir / n).stat().st_size for n in own))
    assert [re.sub(r" in \d+\.\d s$", " in X s", ln) for ln in r.stderr.splitlines()] == [
        f"hashing (sha256): {size} in X s",
        f"packaging model/: {size} in X s",
        "writing report and manifest: 3 files in X s",
    ]

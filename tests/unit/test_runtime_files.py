"""model/ holds only the files a runtime reads (stages.fetch.RUNTIME_FILE_PATTERNS); every other file of the
source is left out of it and named in the report (one ``files.left_out`` info finding each)."""

from __future__ import annotations

import json
import shutil

import jsonschema

from modelyard.artifact.schemas import REPORT_SCHEMA
from modelyard.checks.report import Report
from modelyard.flows.watch import is_model_file
from modelyard.model.source import parse_source
from modelyard.settings import Settings
from modelyard.stages.fetch import fetch

#: what a fine-tuning run leaves beside a model, none of which vLLM or transformers reads to serve it
TRAINING_LEFTOVERS = {
    "trainer_state.json": '{"global_step": 500}\n', "eval_results.json": '{"eval_loss": 1.25}\n',
    "all_results.json": "{}\n", "training_args.bin": "pickle", "README.md": "# card\n",
    "requirements.txt": "torch\n", "checkpoint-500/trainer_state.json": "{}\n", "runs/events.out.tfevents.1": "x",
    "original/params.json": "{}\n", "original/consolidated.00.pth": "pickle", "notes.jinja": "{{ x }}\n",
}
#: files a runtime does read (transformers' tokenizer, processor and chat-template files; vLLM's quantization
#: configs), beside the tiny model's own
RUNTIME_EXTRAS = {
    "special_tokens_map.json": "{}\n", "added_tokens.json": "{}\n", "vocab.json": "{}\n", "merges.txt": "#v\n",
    "preprocessor_config.json": "{}\n", "quantize_config.json": "{}\n", "recipe.yaml": "stage: {}\n",
    "additional_chat_templates/tool_use.jinja": "{{ x }}\n",
    # no runtime reads these, but the license asks that they travel with every copy (Apache-2.0 section 4)
    "LICENSE": "apache-2.0\n", "NOTICE": "Copyright the authors\n", "USE_POLICY.md": "# policy\n",
}


def test_model_holds_only_runtime_files_and_the_rest_is_left_out(tiny_llama_dir, tmp_path):
    src = tmp_path / "finetuned"
    shutil.copytree(tiny_llama_dir, src)
    for rel, text in {**TRAINING_LEFTOVERS, **RUNTIME_EXTRAS}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    snap = fetch(parse_source(f"file://{src}"), Settings(home=tmp_path / "store"))
    own = sorted(p.name for p in tiny_llama_dir.iterdir())
    assert [f.path for f in snap.files] == sorted([*own, *RUNTIME_EXTRAS])
    assert list(snap.left_out) == sorted(TRAINING_LEFTOVERS)


def test_left_out_files_are_info_findings_in_the_report_schema():
    report = Report(findings=()).with_left_out(["eval_results.json", "trainer_state.json"])
    d = report.to_dict()
    jsonschema.validate(d, json.loads(REPORT_SCHEMA.read_text()))
    assert d["summary"] == {"errors": 0, "warnings": 0, "infos": 2, "not_judged": 0, "passed": True}
    assert [(f["code"], f["severity"], f["file"], f["message"]) for f in d["findings"]] == [
        ("files.left_out", "info", p, "not read by vLLM or transformers: left out of model/")
        for p in ("eval_results.json", "trainer_state.json")]
    assert "| info | `files.left_out` | trainer_state.json |" in report.to_markdown()


def test_watch_judges_changes_by_the_same_rule():
    """A new revision that only changes what model/ would not hold is skipped by `watch`."""
    assert [is_model_file(p) for p in ("trainer_state.json", "README.md", "eval_results.json")] == [False] * 3
    assert [is_model_file(p) for p in ("recipe.yaml", "quantize_config.json", "tokenizer.json",
                                       "model-00001-of-00002.safetensors")] == [True] * 4

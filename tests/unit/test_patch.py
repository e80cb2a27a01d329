"""The patch stage: repairs as a reviewable, idempotent diff, never written to the source."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelyard.checks import Target
from modelyard.model.unidiff import unified_diff
from modelyard.stages.patch import PatchError, patch_folder
from modelyard.stages.verify import verify_folder
from tests.conftest import SHARED_CASES, json_result, run_cli, store_artifacts
from tests.unit.test_checks_defects import copy, edit_json


def tree_state(root):
    """path -> (sha256, mode, mtime_ns, inode) of every file: what 'never written' must keep."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(root).as_posix()] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode,
                                                   st.st_mtime_ns, st.st_ino)
    return out


def break_eos(d):
    """The Llama 3 failure on the tiny model: every stop id is <s> (1); the template ends turns with <|im_end|> (2)."""
    edit_json(d / "generation_config.json", eos_token_id=1)
    edit_json(d / "config.json", eos_token_id=1)
    edit_json(d / "tokenizer_config.json", eos_token="<s>")
    return d


@pytest.fixture
def broken(tiny_llama_dir, tmp_path):
    return break_eos(copy(tiny_llama_dir, tmp_path / "broken"))


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases is not beside this checkout")
@pytest.mark.parametrize(("case", "target", "file", "pointer", "new"), [
    ("C01-llama3-eot-not-stop", Target(serve="chat"), "generation_config.json", "/eos_token_id", [254, 255]),
    ("C12b-torch-dtype-missing", Target(), "config.json", "/torch_dtype", "bfloat16"),
    ("C20-slow-tokenizer-no-spm", Target(), "tokenizer_config.json", "/tokenizer_class", "PreTrainedTokenizerFast"),
])
def test_fixable_shared_cases_pass_after_patch(case, target, file, pointer, new, tmp_path):
    before = verify_folder(SHARED_CASES / case, target)
    assert [f.severity.value for f in before.findings if f.severity.value != "info"] in (["error"], ["warning"])
    res = patch_folder(SHARED_CASES / case, tmp_path / "out", target=target)
    assert [(op.file, op.pointer, op.new) for op in res.plan.ops] == [(file, pointer, new)]
    assert [f for f in res.after.findings if f.severity.value != "info"] == []


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases is not beside this checkout")
def test_unfixable_case_stays_an_error(tmp_path):
    res = patch_folder(SHARED_CASES / "C07-index-missing-shard", tmp_path / "out")
    assert res.plan.empty
    assert [f.code for f in res.after.errors] == ["safetensors.index.missing_shard"]


def test_stop_token_patch_diff_record_and_idempotence(broken, tmp_path):
    res = patch_folder(broken, tmp_path / "p1", target=Target(serve="chat"))
    assert [(op.file, op.pointer, op.old, op.new, op.code) for op in res.plan.ops] == [
        ("generation_config.json", "/eos_token_id", 1, [1, 2], "tokenizer.stop_tokens.missing_turn_terminator")]
    assert res.after.passed and not res.after.findings
    assert res.before.errors[0].code == "tokenizer.stop_tokens.missing_turn_terminator"
    gen = json.loads((tmp_path / "p1/model/generation_config.json").read_text())
    assert gen["eos_token_id"] == [1, 2]
    record = json.loads((tmp_path / "p1/patches.json").read_text())
    original = hashlib.sha256((broken / "generation_config.json").read_bytes()).hexdigest()
    patched = hashlib.sha256((tmp_path / "p1/model/generation_config.json").read_bytes()).hexdigest()
    assert record["files"] == [{"path": "generation_config.json", "original_sha256": original, "sha256": patched}]
    diff = (tmp_path / "p1/patch.diff").read_text()
    assert diff.startswith("--- a/generation_config.json\n+++ b/generation_config.json\n")
    assert '-  "eos_token_id": 1,\n' in diff and '+  "eos_token_id": [\n+    1,\n+    2\n+  ],\n' in diff
    # Patching a patched folder changes nothing.
    again = patch_folder(tmp_path / "p1", tmp_path / "p2", target=Target(serve="chat"))
    assert again.plan.empty and again.plan.diff == ""
    assert {k: v[0] for k, v in tree_state(tmp_path / "p2/model").items()} == \
        {k: v[0] for k, v in tree_state(tmp_path / "p1/model").items()}


def test_source_is_never_written(broken, tmp_path):
    for p in broken.iterdir():
        p.chmod(0o644)  # a user's writable folder: must be copied, not linked
    state = tree_state(broken)
    res = patch_folder(broken, tmp_path / "out", target=Target(serve="chat"))
    assert not res.plan.empty
    assert tree_state(broken) == state
    out = tree_state(tmp_path / "out/model")
    assert all(out[k][3] != state[k][3] for k in state)  # no inode shared with a writable source


def test_read_only_source_is_copied_not_linked(broken, tmp_path):
    """Even a read-only source is copied: a later chmod+edit of the output must not reach it."""
    for p in broken.iterdir():
        p.chmod(0o444)
    state = tree_state(broken)
    patch_folder(broken, tmp_path / "out", target=Target(serve="chat"))
    out = tree_state(tmp_path / "out/model")
    assert all(out[k][3] != state[k][3] for k in state)
    cfg = tmp_path / "out/model/config.json"
    cfg.chmod(0o644)
    cfg.write_text("{}")
    assert tree_state(broken) == state


def test_out_inside_the_source_and_escaping_links_are_refused(broken, tmp_path):
    state = tree_state(broken)
    with pytest.raises(PatchError, match="inside the source"):
        patch_folder(broken, broken / "fixed")
    assert tree_state(broken) == state and not (broken / "fixed").exists()
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", broken / "extra.json")
    with pytest.raises(PatchError, match="files.symlink_escapes"):
        patch_folder(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_diff_applies_with_git_even_without_trailing_newlines(tiny_llama_dir, tmp_path):
    import subprocess

    tpl = (tiny_llama_dir / "chat_template.jinja").read_text().rstrip("\n").replace("assistant", "assistant ")
    (tmp_path / "t.jinja").write_text(tpl)  # no trailing newline, like the original
    res = patch_folder(tiny_llama_dir, tmp_path / "out", add_special_tokens=["<|im_start|>"],
                       chat_template=tmp_path / "t.jinja")
    assert "\\ No newline at end of file\n" in res.plan.diff
    work = copy(tiny_llama_dir, tmp_path / "work")
    (tmp_path / "p.diff").write_text(res.plan.diff)
    r = subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (work / name).read_bytes() == (tmp_path / "out/model" / name).read_bytes()


def test_dry_run_prints_the_diff_and_writes_nothing(broken, tmp_path):
    r = run_cli("patch", str(broken), "--out", str(tmp_path / "out"), "--dry-run", "--serve", "chat")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("--- a/generation_config.json\n+++ b/generation_config.json\n")
    assert "1 change(s) planned (dry run, nothing written)" in r.stderr
    assert not (tmp_path / "out").exists()
    r = run_cli("patch", str(broken), "--out", str(tmp_path / "out"), "--serve", "chat")
    assert r.returncode == 0 and "verification after patch: PASS" in r.stderr
    r = run_cli("patch", str(broken), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "already exists" in r.stderr


def test_add_special_token_only_from_the_vocabulary(tiny_llama_dir, tmp_path):
    res = patch_folder(tiny_llama_dir, tmp_path / "out", add_special_tokens=["<|im_start|>"])
    assert [(op.file, op.pointer, op.new["content"], op.new["id"], op.new["special"]) for op in res.plan.ops] == [
        ("tokenizer.json", "/added_tokens/3", "<|im_start|>", 3, True)]
    again = patch_folder(tmp_path / "out", None, dry_run=True, add_special_tokens=["<|im_start|>"])
    assert again.plan.empty
    with pytest.raises(PatchError, match="not in the vocabulary"):
        patch_folder(tiny_llama_dir, tmp_path / "out2", add_special_tokens=["<|eot_id|>"])
    assert not (tmp_path / "out2").exists()
    r = run_cli("patch", str(tiny_llama_dir), "--out", str(tmp_path / "out3"), "--add-special-token", "<|eot_id|>")
    assert r.returncode == 2 and "embedding row" in r.stderr and "Traceback" not in r.stderr


def test_chat_template_from_a_file(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    tpl = (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").unlink()
    assert [f.code for f in verify_folder(d, Target(serve="chat")).errors] == ["tokenizer.chat_template.missing"]
    (tmp_path / "t.jinja").write_text(tpl)
    res = patch_folder(d, tmp_path / "out", target=Target(serve="chat"), chat_template=tmp_path / "t.jinja")
    assert [(op.file, op.old) for op in res.plan.ops] == [("chat_template.jinja", None)]
    assert res.after.passed and (tmp_path / "out/model/chat_template.jinja").read_text() == tpl
    assert json.loads((tmp_path / "out/patches.json").read_text())["files"][0]["original_sha256"] is None


def test_control_tokens_marked_special(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    data = json.loads((d / "tokenizer.json").read_text())
    data["added_tokens"][2]["special"] = False  # <|im_end|>
    (d / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    res = patch_folder(d, tmp_path / "out")
    assert [(op.file, op.pointer, op.old, op.new) for op in res.plan.ops] == [
        ("tokenizer.json", "/added_tokens/2/special", False, True)]
    assert not [f for f in res.after.findings if f.severity.value != "info"]


# --- in the ingest flow ------------------------------------------------------------------------

def test_ingest_patches_by_default_and_records_it(broken, tmp_path):
    home = tmp_path / "store"
    r = run_cli("ingest", f"file://{broken}", "--no-smoke", "--out", str(home), "--json")
    assert r.returncode == 0, r.stderr
    (art,) = store_artifacts(home)
    assert art.name.endswith("-patched-" + art.name.rsplit("-", 1)[1]) and "-patched-" in art.name
    m = json.loads((art / "manifest.json").read_text())
    gen = next(f for f in m["files"] if f["path"] == "model/generation_config.json")
    assert gen["origin"] == "patched"
    assert gen["original_sha256"] == hashlib.sha256((broken / "generation_config.json").read_bytes()).hexdigest()
    assert gen["sha256"] == hashlib.sha256((art / "model/generation_config.json").read_bytes()).hexdigest()
    assert m["patches"]["count"] == 1 and m["patches"]["ops"][0]["new"] == [1, 2]
    assert (art / "patch.diff").read_text().startswith("--- a/generation_config.json")
    assert json.loads((art / "report.json").read_text())["summary"]["passed"] is True
    assert run_cli("verify", str(art)).returncode == 0  # manifest hashes match the patched files
    again = run_cli("ingest", f"file://{broken}", "--no-smoke", "--out", str(home), "--json")
    assert again.returncode == 0 and json_result(again.stdout, "ingest")["reused"] is True


def test_patching_a_tampered_artifact_is_refused(broken, tmp_path):
    home = tmp_path / "store"
    assert run_cli("ingest", f"file://{broken}", "--no-smoke", "--out", str(home)).returncode == 0
    (art,) = store_artifacts(home)
    assert patch_folder(art, None, dry_run=True).plan.empty  # intact: nothing left to patch
    cfg = art / "model" / "config.json"
    cfg.chmod(0o644)
    cfg.write_text(cfg.read_text().replace('"vocab_size": 128', '"vocab_size": 129'))
    with pytest.raises(PatchError, match="model/config.json \\(artifact.file_modified\\)"):
        patch_folder(art, tmp_path / "out")


def test_ingest_no_patch_fails_and_unfixable_blocks(broken, tmp_path):
    r = run_cli("ingest", f"file://{broken}", "--no-smoke", "--no-patch", "--out", str(tmp_path / "s1"))
    assert r.returncode == 1 and "tokenizer.stop_tokens.missing_turn_terminator" in r.stderr
    d = copy(broken, tmp_path / "both")
    (d / "model.safetensors.incomplete").write_bytes(b"x")
    edit_json(d / "config.json", intermediate_size=96)  # unfixable: shapes disagree with the weights
    r = run_cli("ingest", f"file://{d}", "--no-smoke", "--out", str(tmp_path / "s2"))
    assert r.returncode == 1
    assert "found 1 error(s): [architecture.shape_mismatch]" in r.stderr  # the fixable one does not block
    assert store_artifacts(tmp_path / "s2") == []
    assert not os.path.exists(tmp_path / "s2" / ".staging") or not any((tmp_path / "s2" / ".staging").iterdir())


# --- the diff ------------------------------------------------------------------------------------

def _apply_unified(old: list[str], diff: list[str]) -> list[str]:
    """``old`` with the unified ``diff`` (as :func:`unified_diff` writes it) applied, checking every context
    and removed line against ``old``."""
    out, i, k = [], 0, 2
    while k < len(diff):
        h = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", diff[k])
        assert h, diff[k]
        first, length = int(h.group(1)), int(h.group(2) or 1)
        start = first - 1 if length else first
        out += old[i:start]
        i, k = start, k + 1
        while k < len(diff) and not diff[k].startswith("@@"):
            mark, line = diff[k][0], diff[k][1:]
            if mark in " -":
                assert old[i] == line
                i += 1
            if mark in " +":
                out.append(line)
            k += 1
    return out + old[i:]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["0\n", "1\n", "2\n", "3\n"]), max_size=30),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.sampled_from(["1\n", "7\n", "x\n"])), max_size=4))
def test_the_diff_applies_back_to_the_patched_file(old, edits):
    new = list(old)
    for kind, at, line in edits:
        if kind == 0 and new:
            new.pop(at % len(new))
        elif kind == 1:
            new.insert(at % (len(new) + 1), line)
        elif new:
            new[at % len(new)] = line
    diff = list(unified_diff(old, new, "a/f", "b/f"))
    assert (diff == []) == (old == new)
    if diff:
        assert diff[:2] == ["--- a/f\n", "+++ b/f\n"]
        assert _apply_unified(old, diff) == new


def test_the_diff_of_a_million_line_tokenizer_json_is_its_two_hunks():
    """difflib's matcher took more than 10 minutes on Gemma-3's 33 MB tokenizer.json with two tokens marked
    special; the lines the two files share at start and end are no longer matched."""
    old = [f'    "tok{i}": {i},\n' for i in range(1_000_000)]
    new = list(old)
    new[10] = '    "tok10": 10, "special": true,\n'
    new[999_990] = '    "tok999990": 999990, "special": true,\n'
    diff = "".join(unified_diff(old, new, "a/tokenizer.json", "b/tokenizer.json"))
    assert diff == ('--- a/tokenizer.json\n+++ b/tokenizer.json\n@@ -8,7 +8,7 @@\n'
                    '     "tok7": 7,\n     "tok8": 8,\n     "tok9": 9,\n-    "tok10": 10,\n'
                    '+    "tok10": 10, "special": true,\n     "tok11": 11,\n     "tok12": 12,\n     "tok13": 13,\n'
                    '@@ -999988,7 +999988,7 @@\n     "tok999987": 999987,\n     "tok999988": 999988,\n'
                    '     "tok999989": 999989,\n-    "tok999990": 999990,\n+    "tok999990": 999990, "special": true,\n'
                    '     "tok999991": 999991,\n     "tok999992": 999992,\n     "tok999993": 999993,\n')


def test_a_patched_json_keeps_non_ascii_that_appears_late_in_the_file():
    """Gemma-3's tokenizer.json is ASCII for its first 100,000 characters, then has "▁" in every piece: only the
    start was read, so the patched copy was re-escaped whole ("\\u2581"), 2.4 million lines in the diff."""
    from modelyard.stages.patch import _dump_like

    doc = {"added_tokens": [{"id": i, "content": f"<unused{i}>", "special": False} for i in range(3000)],
           "model": {"vocab": {"▁the": 0, "\\u0000": 1, "東京": 2}}}
    original = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    assert original[:100_000].isascii() and "▁the" in original
    doc["added_tokens"][7]["special"] = True
    patched = _dump_like(doc, original)
    assert [(a, b) for a, b in zip(original.splitlines(), patched.splitlines()) if a != b] == [
        ('      "special": false', '      "special": true')]

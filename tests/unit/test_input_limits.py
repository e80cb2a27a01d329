"""Verify bounds what it reads whole: a config.json over 32 MiB and a tokenizer.json over 64 MiB are refused
with the size named, at once (a 50 MB config.json took 4.5 minutes and 2.1 GB; a 200 MB tokenizer.json 8.3 GB)."""

from __future__ import annotations

from modelyard.checks import Target
from modelyard.stages.verify import verify_folder
from tests.fixtures import make_tiny_llama


def _pad(path, extra: int) -> int:
    text = path.read_text()
    path.write_text(text[:-2] + " " * extra + text[-2:])
    return path.stat().st_size


def test_an_oversized_config_json_is_refused_with_its_size(tmp_path):
    d = make_tiny_llama(tmp_path / "m")
    size = _pad(d / "config.json", 33 << 20)
    errors = [(f.code, f.message) for f in verify_folder(d, Target(serve="chat")).errors]
    assert errors == [("config.invalid_json",
                       f"config.json is not read: {size} bytes, over the 32 MiB limit modelyard reads whole")]


def test_an_oversized_tokenizer_json_is_not_loaded(tmp_path):
    d = make_tiny_llama(tmp_path / "m")
    size = _pad(d / "tokenizer.json", 65 << 20)
    errors = [(f.code, f.message) for f in verify_folder(d, Target(serve="chat")).errors]
    assert ("tokenizer.load_failed", f"transformers cannot build the tokenizer: LimitError: tokenizer.json is {size} "
            "bytes, over the 64 MiB limit modelyard loads (memory grows ~40x the file)") in errors


def test_control_characters_in_names_and_messages_are_printed_as_escapes(tmp_path):
    """A file name (a hub repo's too) or a tokenizer string with a terminal escape reached the terminal raw."""
    from typer.testing import CliRunner

    from modelyard.checks.base import Finding, Severity
    from modelyard.checks.report import Report
    from modelyard.cli import app
    from modelyard.text import printable

    d = make_tiny_llama(tmp_path / "m")
    (d / "model-\x1b]0;pwned\x07\x1b[2J.safetensors").write_bytes(b"\x00" * 4)
    r = CliRunner().invoke(app, ["verify", str(d)])
    assert r.exit_code == 1
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "model-\\x1b]0;pwned\\x1b[2J.safetensors" in r.stdout  # rich itself drops the BEL
    assert printable("a\u202eb\tc\nd\x9b") == "a\\u202eb\tc\nd\\x9b"
    md = Report(findings=(Finding("files.x.y", Severity.ERROR, "token '\x1b[31m' is red", file="a\x1bb"),)).to_markdown()
    assert "\x1b" not in md and "token '\\x1b[31m' is red" in md

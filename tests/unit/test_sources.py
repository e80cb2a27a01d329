from pathlib import Path

import pytest

from modelyard.errors import InvalidSourceError
from modelyard.pipeline.sources import parse_source, sanitize_name


def test_hf_with_revision():
    s = parse_source("hf://org/tiny@v1.0")
    assert (s.kind, s.repo_id, s.revision, s.uri, s.default_name) == ("hf", "org/tiny", "v1.0", "hf://org/tiny@v1.0", "tiny")


def test_hf_defaults_to_main():
    assert parse_source("hf://HuggingFaceTB/SmolLM2-135M").revision == "main"


def test_file_and_gguf():
    f = parse_source("file:///models/My Model")
    assert (f.kind, f.path, f.default_name) == ("file", Path("/models/My Model"), "my-model")
    g = parse_source("gguf:///x/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (g.kind, g.path, g.default_name) == ("gguf", Path("/x/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2-135m-instruct")


@pytest.mark.parametrize("uri,needle", [
    ("s4://x/y", "unsupported source scheme 's4'"),
    ("hf://justname", "is not an org/name repo id"),
    ("gguf:///x/model.bin", "does not name a .gguf file"),
    ("no-such-thing-here", "is not a URI and no such path exists"),
])
def test_invalid(uri, needle):
    with pytest.raises(InvalidSourceError) as ei:
        parse_source(uri)
    assert needle in str(ei.value)
    assert ei.value.exit_code == 2


def test_sanitize_name():
    assert sanitize_name("Org/Llama 3.1 8B!") == "org-llama-3.1-8b"
    with pytest.raises(InvalidSourceError):
        sanitize_name("!!!")

"""Every finding code the package emits is declared once in the catalogue (modelyard/checks/findings.yaml),
every declared code is emitted somewhere, and docs/reference/findings.md is generated from the catalogue."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import modelyard
from modelyard.checks import catalog
from tests.conftest import ROOT, generated_doc

PKG = Path(modelyard.__file__).resolve().parent
DOC = ROOT / "docs" / "reference" / "findings.md"
#: the concerns a finding code starts with
CODE = re.compile(r"^(adapter|host|files|safetensors|architecture|config|parallelism|tokenizer|quantization|runtime|smoke|artifact|source|internal|security)"
                  r"(\.[a-z0-9_]+)+$")
FILE_NAME = re.compile(r"\.(json|txt|yaml|jinja|model|py|diff|safetensors)$")
#: dotted strings of those concerns that are not codes
NOT_CODES = {
    "config.eos_token_id": "a field path a tokenizer message names",
    "tokenizer.ggml.bos_token_id": "a GGUF metadata key", "tokenizer.ggml.eos_token_id": "a GGUF metadata key",
    "tokenizer.ggml.padding_token_id": "a GGUF metadata key", "tokenizer.ggml.unknown_token_id": "a GGUF metadata key",
}


def _literal_severity(call: ast.Call) -> str | None:
    node = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "severity"), None)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Severity":
        return node.attr.lower()
    return None


def emitted() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(code -> where it appears, code -> the literal severities of the calls that emit it), read with ast from
    every module but the runner scripts (they run in other interpreters and emit no findings)."""
    where: dict[str, list[str]] = {}
    severities: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        if "scripts" in path.relative_to(PKG).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.match(node.value)
                    and not FILE_NAME.search(node.value) and node.value not in NOT_CODES):
                where.setdefault(node.value, []).append(f"{path.relative_to(PKG.parent)}:{node.lineno}")
            if isinstance(node, ast.Call):
                first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "code"), None)
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and CODE.match(first.value):
                    if (sev := _literal_severity(node)) is not None:
                        severities.setdefault(first.value, set()).add(sev)
    return where, severities


def test_every_emitted_code_is_declared_and_every_declared_code_is_emitted():
    where, _ = emitted()
    assert {c: w for c, w in where.items() if not catalog.declared(c)} == {}
    stale = [r.code for r in catalog.RULES if not r.code.endswith("<code>") and r.code not in where]
    assert stale == []
    assert len(catalog.RULES) == len(catalog.BY_CODE) == 216


def test_declared_severity_covers_what_the_call_sites_emit():
    _, severities = emitted()
    wrong = {c: (sorted(s), catalog.BY_CODE[c].severity) for c, s in severities.items()
             if not all(sev in catalog.BY_CODE[c].severity for sev in s)}
    assert wrong == {}


def test_family_codes_are_declared():
    assert catalog.declared("runtime.disagrees.config.max_len.exceeds_derived")
    assert not catalog.declared("runtime.disagrees.no.such_code")
    assert not catalog.declared("config.rope.no_such_rule")


def test_findings_reference_is_generated_from_the_catalogue():
    text = catalog.markdown()
    generated_doc(DOC, text)
    assert text.count("\n| `") == 216

"""The verification report as SARIF 2.1.0 (OASIS Static Analysis Results Interchange Format), the format
code-scanning dashboards (GitHub code scanning, Azure DevOps, SonarQube, DefectDojo) read.

One ``reportingDescriptor`` (rule) per finding code in the report, described from the findings catalogue
(:mod:`modelyard.checks.catalog`: summary, fix as help, source); one ``result`` per finding with its level
(error, warning, note), its message, and a location: the file relative to the model folder
(``uriBaseId`` ``MODEL``, which ``originalUriBaseIds`` resolves to the folder judged) and the JSON field or
tensor as a logical location. The measured value and its limit travel in the result's ``properties``; a
``partialFingerprints`` entry (sha256 of code, file, field and value) keeps findings apart and matches them
across runs; ``security.*`` rules carry the ``security`` tag and a ``security-severity``.

Source: the SARIF 2.1.0 specification (OASIS Standard, errata 01), sections 3.14 (run), 3.19 (tool),
3.27 (result), 3.28 (location), 3.49 (reportingDescriptor); validated in the tests against the OASIS JSON
Schema ``sarif-schema-2.1.0.json``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelyard.checks.catalog import rule_of
from modelyard.checks.report import Report
from modelyard.text import printable
from modelyard.version import __version__

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
#: SARIF ``level`` of each modelyard severity
LEVELS = {"error": "error", "warning": "warning", "info": "note", "not_judged": "note"}
INFORMATION_URI = "https://github.com/modelyard/modelyard"


#: GitHub code scanning's ``security-severity`` (0-10) of a security rule, by severity
SECURITY_SEVERITY = {"error": "9.0", "warning": "5.0", "info": "2.0", "not_judged": "2.0"}


def _rule(code: str) -> dict[str, Any]:
    r = rule_of(code)
    out: dict[str, Any] = {"id": code, "name": "".join(p.title() for p in code.replace("_", ".").split("."))}
    props: dict[str, Any] = {}
    if code.startswith("security."):
        props["tags"] = ["security"]
        if r is not None and r.severity in SECURITY_SEVERITY:
            props["security-severity"] = SECURITY_SEVERITY[r.severity]
    if r is not None:
        out["shortDescription"] = {"text": r.summary}
        if r.fix:
            out["help"] = {"text": r.fix}
        if r.severity in LEVELS:
            out["defaultConfiguration"] = {"level": LEVELS[r.severity]}
        if r.source:
            props["source"] = r.source
    if props:
        out["properties"] = props
    return out


#: the largest JSON file whose fields are given a line (bytes; tokenizer.json files run to tens of MB)
MAX_LOCATE_BYTES = 64 * 1024 * 1024


def field_line(path: Path, field: str) -> int | None:
    """The 1-based line of ``field`` (a dotted path, as findings write it: ``rope_scaling.factor``,
    ``added_tokens.3.content``; keys that contain dots, such as tensor names in ``weight_map``, are matched
    whole) in the JSON file ``path``: the line of its key, or of the array element. None when the file is not
    JSON, larger than :data:`MAX_LOCATE_BYTES`, or has no such field. Values are skipped by the C JSON
    decoder (``raw_decode``), so a large file is not loaded into Python objects."""
    if path.suffix != ".json":
        return None
    try:
        if path.stat().st_size > MAX_LOCATE_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
        pos = _locate(text, field)
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return None
    return None if pos is None else text.count("\n", 0, pos) + 1


_WS = " \t\r\n"


def _ws(text: str, i: int) -> int:
    while text[i] in _WS:
        i += 1
    return i


def _locate(text: str, field: str) -> int | None:
    """The offset of ``field``'s key (or array element) in the JSON ``text``; None when absent."""
    # typeshed omits json.decoder.scanstring, the string scanner json itself uses
    from json.decoder import scanstring  # type: ignore[attr-defined]  # noqa: PLC0415

    skip = json.JSONDecoder().raw_decode
    i, rest, at = _ws(text, 0), field, None
    while rest:
        if text[i] == "{":
            i = _ws(text, i + 1)
            while text[i] != "}":
                start = i
                key, i = scanstring(text, i + 1)
                i = _ws(text, _ws(text, i) + 1)  # past the colon
                if rest == key or rest.startswith(key + "."):
                    at, rest = start, rest[len(key) + 1:]
                    break
                i = _ws(text, skip(text, i)[1])
                if text[i] == ",":
                    i = _ws(text, i + 1)
            else:
                return None
        elif text[i] == "[":
            head, _, tail = rest.partition(".")
            if not head.isdigit():
                return None
            i = _ws(text, i + 1)
            for _ in range(int(head)):
                if text[i] == "]":
                    return None
                i = _ws(text, skip(text, i)[1])
                if text[i] == ",":
                    i = _ws(text, i + 1)
            if text[i] == "]":
                return None
            at, rest = i, tail
        else:
            return None
    return at


def to_sarif(report: Report, model_dir: Path | None = None, *, subject: str | None = None) -> dict[str, Any]:
    """The SARIF log (a dict ready for ``json.dumps``) of ``report``. ``model_dir`` is the folder the files
    of the findings are relative to (it becomes the ``MODEL`` base URI); ``subject`` names what was judged
    (a path, ``hf://org/name@revision``) in the run's properties."""
    # the texts come from the model's files (a tokenizer string, a template): control and bidirectional characters are
    # written as escapes (text.printable), so that a SARIF viewer or a terminal shows them as what they are
    report = replace(report, findings=tuple(
        replace(f, message=printable(f.message), fix=f.fix and printable(f.fix), file=f.file and printable(f.file),
                value=printable(f.value) if isinstance(f.value, str) else f.value, field=f.field and printable(f.field))
        for f in report.findings))
    subject = subject and printable(subject)
    codes = sorted({f.code for f in report.findings})
    index = {c: i for i, c in enumerate(codes)}
    results = []
    for f in report.findings:
        res: dict[str, Any] = {"ruleId": f.code, "ruleIndex": index[f.code], "level": LEVELS[f.severity.value],
                               "message": {"text": f.message},
                               # what identifies this finding across runs (code scanning matches alerts by it)
                               "partialFingerprints": {"modelyardFinding/v1": hashlib.sha256(json.dumps(
                                   [f.code, f.file, f.field, f.value], sort_keys=True, default=str).encode()).hexdigest()}}
        loc: dict[str, Any] = {}
        if f.file:
            loc["physicalLocation"] = {"artifactLocation": {"uri": f.file, "uriBaseId": "MODEL"}}
            line = field_line(Path(model_dir) / f.file, f.field) if model_dir is not None and f.field else None
            if line is not None:
                loc["physicalLocation"]["region"] = {"startLine": line}
        if f.field:
            loc["logicalLocations"] = [{"fullyQualifiedName": f"{f.file}#{f.field}" if f.file else f.field,
                                        "name": f.field, "kind": "member"}]
        if loc:
            res["locations"] = [loc]
        props = {k: v for k, v in (("value", f.value), ("limit", f.limit), ("fix", f.fix), ("source", f.source))
                 if v is not None}
        if props:
            res["properties"] = props
        results.append(res)
    run: dict[str, Any] = {
        "tool": {"driver": {"name": "modelyard", "version": __version__, "semanticVersion": __version__,
                            "informationUri": INFORMATION_URI, "rules": [_rule(c) for c in codes]}},
        "results": results,
        "columnKind": "unicodeCodePoints",
        "properties": {"target": report.target.to_dict(), "passed": report.passed,
                       **({"subject": subject} if subject else {})},
    }
    if model_dir is not None:
        run["originalUriBaseIds"] = {"MODEL": {"uri": Path(model_dir).absolute().as_uri() + "/"}}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}

"""The package's shape, measured with the stdlib ``ast``: no import circle inside any package, no module over
600 lines, and no module outside ``artifact/`` that parses ``manifest.json`` or ``report.json`` itself."""

from __future__ import annotations

import ast
from pathlib import Path

import modelyard

PKG = Path(modelyard.__file__).resolve().parent
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports, at module level or inside functions (``from pkg import sub``
    counts as ``pkg.sub`` when ``sub`` is a module)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in MODULES else mod)
    return {m for m in out if m in MODULES and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_analysis_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_any_package():
    imports = {m: _imports(m, p) for m, p in MODULES.items()}
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    circles = {}
    for pkg in sorted(packages):
        members = {m for m in MODULES if m == pkg or m.rpartition(".")[0] == pkg}
        found = _circles({m: imports[m] & members for m in sorted(members)})
        if found:
            circles[pkg] = found
    assert circles == {}


def test_no_module_over_600_lines():
    long = {str(p.relative_to(PKG.parent)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _parses_artifact_record(tree: ast.AST, source: str) -> list[int]:
    """Lines of ``json.load``/``json.loads`` calls whose argument names the manifest or the report."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "loads")
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json" and node.args):
            arg = (ast.get_source_segment(source, node.args[0]) or "").lower()
            if any(w in arg for w in ("manifest", "report")):
                lines.append(node.lineno)
    return lines


def test_the_record_rule_sees_a_parse():
    src = "import json\nd = json.loads((root / MANIFEST).read_text())\nr = json.load(open(report_path))\nc = json.loads(cfg)\n"
    assert _parses_artifact_record(ast.parse(src), src) == [2, 3]


def test_only_artifact_parses_manifest_and_report():
    found = {}
    for name, path in MODULES.items():
        if name.startswith("modelyard.artifact"):
            continue
        src = path.read_text()
        if lines := _parses_artifact_record(ast.parse(src), src):
            found[name] = lines
    assert found == {}


def test_no_private_name_is_imported_from_another_module():
    found = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("modelyard"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    found.setdefault(name, []).extend(private)
    assert found == {}


def test_no_cli_function_takes_more_than_12_parameters():
    """A command's stage options come from the stages' declarations (modelyard/cli/_options.py), not from a
    parameter each."""
    wide = {}
    for name, path in MODULES.items():
        if not name.startswith("modelyard.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = len(node.args.posonlyargs) + len(node.args.args) + len(node.args.kwonlyargs)
                if n > 12:
                    wide[f"{name}.{node.name}"] = n
    assert wide == {}

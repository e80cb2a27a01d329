"""Unified diffs of text files, as ``difflib.unified_diff`` writes them, in time linear in what two versions share.

A patch changes a few lines of a JSON file; difflib's matcher is quadratic in repeated lines, and a real
tokenizer.json (Gemma-3's: 33 MB, a million lines, tens of thousands of near-identical ``"special": false``
lines) with two tokens marked special took it more than 10 minutes. The lines both versions share at their
start and end are matched directly, equally long versions that differ in few lines are matched line for line,
and only what remains goes to difflib. Pure standard library.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator


class _TrimmedMatcher:
    """The opcodes of ``difflib.SequenceMatcher`` over ``a`` and ``b``, run on what lies between the lines both
    share at their start and end (those are one ``equal`` opcode each): difflib's matcher is quadratic in
    repeated lines, and a real tokenizer.json (Gemma-3's: 33 MB, a million lines) with two tokens marked special
    took it more than 10 minutes."""

    def __init__(self, a: list[str], b: list[str]) -> None:
        self.a, self.b = a, b

    def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:
        a, b = self.a, self.b
        pre, m = 0, min(len(a), len(b))
        while pre < m and a[pre] == b[pre]:
            pre += 1
        suf = 0
        while suf < m - pre and a[-1 - suf] == b[-1 - suf]:
            suf += 1
        inner = _same_length_opcodes(a[pre:len(a) - suf], b[pre:len(b) - suf]) or difflib.SequenceMatcher(
            None, a[pre:len(a) - suf], b[pre:len(b) - suf]).get_opcodes()
        ops = [("equal", 0, pre, 0, pre)] if pre else []
        ops += [(tag, i1 + pre, i2 + pre, j1 + pre, j2 + pre) for tag, i1, i2, j1, j2 in inner if tag != "equal" or i2 > i1]
        if suf:
            ops.append(("equal", len(a) - suf, len(a), len(b) - suf, len(b)))
        merged: list[tuple[str, int, int, int, int]] = []
        for op in ops:
            if merged and op[0] == "equal" == merged[-1][0]:
                merged[-1] = ("equal", merged[-1][1], op[2], merged[-1][3], op[4])
            else:
                merged.append(op)
        return merged or [("equal", 0, 0, 0, 0)]


def _same_length_opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]] | None:
    """Line-for-line opcodes of two equally long line lists that differ in few lines (at most 1 in 20): a
    value set in place (``"special": false`` -> ``true`` in 2 of 6,414 added tokens of a tokenizer.json, 50,000
    near-identical lines apart, where difflib's matcher is quadratic). None otherwise (difflib decides)."""
    if len(a) != len(b):
        return None
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(differ) * 20 > len(a):
        return None
    ops: list[tuple[str, int, int, int, int]] = []
    at = 0
    for i in differ:
        if ops and ops[-1][0] == "replace" and ops[-1][2] == i:
            ops[-1] = ("replace", ops[-1][1], i + 1, ops[-1][3], i + 1)
            at = i + 1
            continue
        if i > at:
            ops.append(("equal", at, i, at, i))
        ops.append(("replace", i, i + 1, i, i + 1))
        at = i + 1
    if at < len(a):
        ops.append(("equal", at, len(a), at, len(a)))
    return ops


def _range(start: int, stop: int) -> str:
    """A unified-diff range (difflib's ``_format_range_unified``): ``first,length``, ``first`` for one line."""
    length = stop - start
    return f"{start + 1}" if length == 1 else f"{start if not length else start + 1},{length}"


def unified_diff(old: list[str], new: list[str], fromfile: str, tofile: str, n: int = 3) -> Iterator[str]:
    """A unified diff of the lines ``old`` -> ``new`` with ``n`` lines of context, as ``difflib.unified_diff``
    writes it, over :class:`_TrimmedMatcher`'s opcodes (linear in the lines the two share at start and end)."""
    matcher = _TrimmedMatcher(old, new)
    for k, group in enumerate(difflib.SequenceMatcher.get_grouped_opcodes(matcher, n)):  # type: ignore[arg-type]
        if k == 0:
            yield f"--- {fromfile}\n"
            yield f"+++ {tofile}\n"
        yield f"@@ -{_range(group[0][1], group[-1][2])} +{_range(group[0][3], group[-1][4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (" " + line for line in old[i1:i2])
                continue
            if tag in ("replace", "delete"):
                yield from ("-" + line for line in old[i1:i2])
            if tag in ("replace", "insert"):
                yield from ("+" + line for line in new[j1:j2])


def marked(lines: Iterable[str]) -> Iterable[str]:
    """Unified-diff lines with git's "\\ No newline at end of file" marker after a last line that
    has no newline, so that `git apply` / `patch` accept the diff."""
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n\\ No newline at end of file\n"

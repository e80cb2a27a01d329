"""Text shown to people, made safe to show: control and invisible characters written as escapes.

A file name, a hub repo's file list, a tokenizer string or a template can carry terminal escape
sequences (``ESC ]0;title BEL``, ``ESC [2J``, cursor moves) and bidirectional overrides (the "Trojan
Source" characters). Printed raw, they rewrite the operator's terminal or make text read differently
than it is. :func:`printable` writes them as ``\\x1b``/``\\u202e`` escapes; newline and tab stay. The
JSON outputs need no such step (JSON escapes control characters itself).

Sources: ECMA-48 (C0 and C1 control sets); Unicode bidirectional formatting characters (UAX #9);
"Trojan Source" (Boucher and Anderson, CVE-2021-42574)."""

from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls, zero-width and bidirectional formatting characters, BOM
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """``text`` with every :data:`UNSAFE` character written as an escape (``"a\\x1b[2Jb"`` for
    ``"a<ESC>[2Jb"``)."""
    return UNSAFE.sub(_escape, text)


#: what :func:`one_line` writes as escapes besides :data:`UNSAFE`: a line break of any kind, and tab
BREAKS = re.compile("[\n\r\t\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` made safe to print as (part of) one line: :func:`printable`, and every line break (and tab) written
    as an escape too, so that a value read from a file (a manifest's name, a source URI, a finding's message) cannot
    start a line of its own, such as a fake ``verification: passed``."""
    return printable(BREAKS.sub(_escape, text))


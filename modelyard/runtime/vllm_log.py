"""Reading what a vLLM process wrote to its log: the runtime layer's door for every stage that runs vLLM
(the load and server smokes, the quantize stage's support measurement)."""

from __future__ import annotations

import re

_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")
#: a vLLM log record below ERROR ("(APIServer pid=7200) WARNING 12-01 21:58:05 [system_utils.py:255] ..."):
#: its text may quote an error it only warns about ("... fd limit errors like `OSError: [Errno 24] ...`")
_NOT_AN_ERROR = re.compile(r"\b(?:DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d ")


def root_cause(log: str) -> str | None:
    """The first ``SomeError: message`` line of a vLLM log that is not a DEBUG, INFO or WARNING record:
    the worker's own exception, which the engine then reports only as ``EngineDeadError``."""
    for line in log.splitlines():
        if _NOT_AN_ERROR.search(line):
            continue
        m = _ERROR_LINE.search(line)
        if m and m.group(1) not in ("EngineDeadError",):
            return f"{m.group(1)}: {m.group(2).strip()}"[:500]
    return None

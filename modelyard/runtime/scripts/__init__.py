"""The runner scripts: each runs INSIDE another interpreter (the vLLM runtime venv, a legacy quantizer's
venv, one process per GPU), started by :func:`modelyard.runtime.process.run_script` or a stage, never
imported by the pipeline (except :mod:`.quality`'s math, which both sides use, and :mod:`.unix_socket`, the
private-socket helpers of the warm workers and their clients). Standard library only at module level, plus the
libraries of the interpreter they run in; nothing of modelyard. :mod:`.amx` and :mod:`.unix_socket` are their
shared stdlib helpers, loaded by path (``runpy``)."""

from pathlib import Path

#: the folder of the runner scripts (their paths are ``SCRIPTS / "<name>.py"``)
SCRIPTS = Path(__file__).resolve().parent

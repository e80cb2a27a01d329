"""The runner scripts: each runs INSIDE another interpreter (the vLLM runtime venv, a legacy quantizer's
venv, one process per GPU), started by :func:`modelyard.runtime.process.run_script` or a stage, never
imported by the pipeline (except :mod:`.quality`'s math, which both sides use). Standard library only at
module level, plus the libraries of the interpreter they run in; nothing of modelyard. :mod:`.amx` is their
shared stdlib helper, loaded by path (``runpy``), as the engine host loads :mod:`modelyard.unixsock`."""

from pathlib import Path

#: the folder of the runner scripts (their paths are ``SCRIPTS / "<name>.py"``)
SCRIPTS = Path(__file__).resolve().parent

"""Warm-up: import what the verify stage needs while the run waits on something else.

The first ``verify`` in a process spends 3 to 9 s importing transformers (torch, its config and
tokenizer machinery), whatever the model's size; the checks themselves take about 1 s. An ingest
first waits for Prefect's API (the ephemeral server is a subprocess) and then fetches and hashes
(hashlib and file reads release the GIL), so those imports can run beside that wait in a daemon thread.
``MODELYARD_NO_WARMUP=1`` (the run's ``settings.no_warmup``) turns it off.

Only the warm-up thread may import transformers while it runs: transformers is a lazy module, and a
second thread that imports from it while the first is still initialising it gets
``ImportError: cannot import name 'AutoConfig'`` (seen in testing). So every stage that imports
transformers calls :func:`wait` first (the ingest flow does, before verify and before a GGUF fetch).
The thread starts only after the flow module, and so Prefect and pydantic, are imported. It does not
start for a local folder whose transformers answers are already in the facts cache
(:mod:`modelyard.checks.hf`): verify then imports neither torch nor transformers.
"""

from __future__ import annotations

import threading
from pathlib import Path

from modelyard.checks import facts_worker, hf
from modelyard.settings import Settings

_started: threading.Thread | None = None
_lock = threading.Lock()


def _imports() -> None:
    try:
        import safetensors  # noqa: PLC0415, F401
        import tokenizers  # noqa: PLC0415, F401
        from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast  # noqa: PLC0415, F401

        AutoConfig.for_model("llama")  # imports the configuration machinery the config checks use
    except Exception:  # a warm-up never fails anything: verify imports what it needs itself
        pass


def wait() -> None:
    """Block until the warm-up (if one was started) has finished; call before importing transformers."""
    t = _started
    if t is not None and t is not threading.current_thread():
        t.join()


def start(settings: Settings, folder: Path | None = None) -> threading.Thread | None:
    """Start the warm-up thread once per process; returns it (None when disabled by
    ``settings.no_warmup`` (``MODELYARD_NO_WARMUP``), when a warm facts worker is set for this process
    (:mod:`modelyard.checks.facts_worker`), or when ``folder``, the local folder about to be verified, has its
    transformers answers in the facts cache: :func:`modelyard.checks.hf.cached`). Calling it again
    returns the same thread."""
    global _started
    if settings.no_warmup or facts_worker.socket_path() is not None:
        return None  # off, or a warm facts worker answers verify's questions: these imports would only compete
    if folder is not None and _started is None and hf.cached(folder):
        return None  # verify will not import transformers: the imports would only compete for the GIL
    with _lock:
        if _started is None:
            _started = threading.Thread(target=_imports, name="modelyard-warmup", daemon=True)
            _started.start()
        return _started

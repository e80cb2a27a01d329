"""The other interpreters modelyard runs code in, and the environment each runs with.

The vLLM runtime lives in its own venv (``.venv-vllm``, or ``MODELYARD_VLLM_PYTHON``) because its pins
clash with the pipeline's; the legacy quantizers each have one too (:mod:`modelyard.stages.quantize.legacy`)."""

from __future__ import annotations

import os
from pathlib import Path

from modelyard.errors import RuntimeNotFoundError
from modelyard.settings import Settings

#: variables a runtime subprocess never inherits: hub tokens (secrets stay in this process), and the
#: pipeline venv's own interpreter settings (they would point the other interpreter at our packages)
DROPPED = ("HF_TOKEN", "MODELYARD_HF_TOKEN", "VIRTUAL_ENV", "PYTHONPATH")


def isolated_env(tmp: str) -> dict[str, str]:
    """The environment of any runtime subprocess: this process's, less :data:`DROPPED`, offline for the
    hub (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``), every cache and temp file under ``tmp``, no
    telemetry (``DO_NOT_TRACK``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=f"{tmp}/hf", XDG_CACHE_HOME=f"{tmp}/cache",
               DO_NOT_TRACK="1", TMPDIR=tmp)
    return env


def runtime_env(settings: Settings, tmp: str) -> dict[str, str]:
    """The environment of a vLLM runtime subprocess: :func:`isolated_env`, plus ``VLLM_CPU_KVCACHE_SPACE``
    (GiB) from the settings, vLLM's cache under ``tmp`` and no usage stats."""
    return isolated_env(tmp) | {"VLLM_CPU_KVCACHE_SPACE": str(settings.vllm_kvcache_space_gib),
                                "VLLM_CACHE_ROOT": f"{tmp}/vllm", "VLLM_NO_USAGE_STATS": "1"}


def vllm_python(settings: Settings, otherwise: str | None = None) -> Path:
    """The vLLM runtime's interpreter (``settings.vllm_interpreter()``). Raises
    :class:`~modelyard.errors.RuntimeNotFoundError` (exit 2) when it does not exist; its fix names
    ``otherwise`` (e.g. ``"pass --no-smoke"``), the caller's way to do without it, after the setup."""
    python = settings.vllm_interpreter()
    if not python.exists():
        fix = "Run `make setup` (creates .venv-vllm) or set MODELYARD_VLLM_PYTHON" + (f"; or {otherwise}." if otherwise else ".")
        raise RuntimeNotFoundError(f"vLLM runtime interpreter {python} does not exist", fix=fix)
    return python


def installed_vllm_version(settings: Settings) -> str | None:
    """The vLLM version installed in the runtime venv (``settings.vllm_interpreter()``), read from its
    ``site-packages/vllm*.dist-info/METADATA`` (distribution ``vllm`` or ``vllm-cpu``) without starting
    it; None when there is no such venv."""
    venv = settings.vllm_interpreter().parent.parent
    for meta in sorted(venv.glob("lib/python*/site-packages/vllm*.dist-info/METADATA")):
        fields: dict[str, str] = {}
        for line in meta.read_text("utf-8", "replace").splitlines()[:20]:
            key, sep, value = line.partition(": ")
            if sep:
                fields.setdefault(key, value.strip())
        if fields.get("Name", "").lower() in ("vllm", "vllm-cpu") and fields.get("Version"):
            return fields["Version"]
    return None

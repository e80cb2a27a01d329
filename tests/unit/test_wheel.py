"""The built wheel is complete: installed into a fresh venv, ``modelyard --version`` runs and every
file the code opens (recipes, golden prompts, calibration text, the report schema, py.typed, the
runner scripts the runtime venvs execute by path) is inside the installed package.

The fresh venv gets only the wheel; its dependencies are reached through a plain path entry to the
test venv's site-packages (a path entry, not a site dir, so the editable install's finder there is
not loaded and ``modelyard`` can only come from the wheel).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from modelyard.version import __version__

ROOT = Path(__file__).resolve().parents[2]
#: the fresh venv's environment: no PYTHONPATH that could put a source tree ahead of the wheel
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _package_files(pkg: Path) -> set[str]:
    return {p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def test_wheel_installs_with_every_data_file(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, cwd=tmp_path, timeout=600)
    (wheel,) = dist.glob("modelyard-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, env=CLEAN_ENV).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, timeout=600)
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = subprocess.run([str(py), "-c", "import modelyard, os; print(os.path.dirname(modelyard.__file__))"],
                           check=True, capture_output=True, text=True, cwd=tmp_path, env=CLEAN_ENV).stdout.strip()
    installed = Path(where)
    assert installed == site / "modelyard"  # the wheel's copy, not the source tree

    assert _package_files(installed) == _package_files(ROOT / "modelyard")

    r = subprocess.run([str(py), "-m", "modelyard", "--version"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120, env=CLEAN_ENV)
    assert (r.returncode, r.stdout) == (0, f"modelyard {__version__}\n")

    # the paths the code opens resolve inside the installed package
    probe = ("from modelyard import paths; from modelyard.stages.smoke import server; "
             "from modelyard.stages.quantize import RECIPES, DATA; "
             "print(paths.PACKAGE, (server.DATA / 'golden-demo.yaml').is_file(), (RECIPES / 'w4a16.yaml').is_file(), "
             "(DATA / 'calibration.txt').is_file())")
    out = subprocess.run([str(py), "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env=CLEAN_ENV).stdout.split()
    assert out == [str(installed), "True", "True", "True"]

"""docs/python.md's install lines for a virtual environment, as a new user runs them: in a
fresh venv of this Python (no --system-site-packages), `pip install ./python` (build
isolation: pip fetches setuptools from the package index), then, after
`pip install setuptools wheel`, `pip install --no-build-isolation ./python`; each time the
package imports and runs a collective, and its typing marker and stubs are installed. From a
copy of python/ and the headers (a build writes build/ and *.egg-info beside setup.py).
Needs the package index: run by the torch 2.x program of `make test`
(tests/python_torch2.mk, which needs it too: DM_PY_PIP_TEST=1), skipped elsewhere."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

if os.environ.get("DM_PY_PIP_TEST") != "1":
    pytest.skip("pip install from the package index: run by tests/python_torch2.mk (DM_PY_PIP_TEST=1)",
                allow_module_level=True)

CHECK = ("import distmesh, numpy as np, os, distmesh._C as C; c = distmesh.FakeCollective(0, 1); "
         "x = np.ones(3, np.float32); c.all_reduce(x, 'sum'); assert x.tolist() == [1, 1, 1]; "
         "d = os.path.dirname(distmesh.__file__); "
         "assert os.path.exists(os.path.join(d, 'py.typed')) and os.path.exists(os.path.join(d, '_C.pyi')); "
         "from distmesh._startup import PTH_NAME, PTH_LINE; "
         "assert open(os.path.join(os.path.dirname(d), PTH_NAME)).read() == PTH_LINE; "   # the startup hook's line
         "print('OK', distmesh.__version__, d)")


# The install lines are the documented ones; CFLAGS=-O0 only shortens the extension's two
# compiles (after Python's own -O2, the last -O wins), which were most of this test's 40 s.
_ENV = dict(os.environ, CFLAGS="-O0")


def _run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, "%s failed:\n%s" % (" ".join(cmd), out[-4000:])
    return out


def test_pip_install_in_a_fresh_venv(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), str(src / "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    for h in glob.glob(os.path.join(ROOT, "distmesh*.h")):
        shutil.copy(h, str(src))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], str(tmp_path))
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--no-input", "--disable-pip-version-check"]
    _run(pip + ["numpy", "./python"], str(src))
    assert "OK" in _run([py, "-c", CHECK], str(tmp_path))
    _run(pip + ["setuptools", "wheel"], str(src))
    _run(pip + ["--force-reinstall", "--no-deps", "--no-build-isolation", "./python"], str(src))
    assert "OK" in _run([py, "-c", CHECK], str(tmp_path))

"""A package that installs like one: the wheel carries libcolocate.so,
simgpu's libraries and the worker (setup.py's build step puts shim/lib in
it), so `pip install` alone is enough to run a program under `colocate run`.

The wheel is built from this checkout without build isolation (its build
dependencies are this venv's) and installed without dependencies into a
fresh venv; the dependencies come from this venv's site-packages through
PYTHONPATH, which does not carry the editable install's path hook, so every
colocate module and library comes from the installed wheel.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import ROOT

VECADD = ROOT / "bench" / "bin" / "vecadd"


@pytest.mark.skipif(not VECADD.exists(), reason="bench programs not built (make progs)")
def test_the_wheel_carries_the_native_libraries(tmp_path):
    dist, env_dir = tmp_path / "dist", tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                        "-w", str(dist), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    wheel = next(dist.glob("colocate-*.whl"))
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "SIMGPU_"))
           and k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join(site.getsitepackages()), SIMGPU_TIMESCALE="0",
               SIMGPU_DIR=str(tmp_path / "sim"), COLOCATE_RUNTIME_DIR=str(tmp_path / "rd"))
    where = subprocess.run([str(py), "-c", "from shim import paths; print(paths.LIBCOLOCATE)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    lib = Path(where.stdout.strip())
    assert lib.is_relative_to(env_dir) and lib.exists(), where.stdout + where.stderr

    # the simulator's device model: the cffi module shim._devmodel, its preset from the wheel's simgpu
    solo = subprocess.run([str(py), "-c", "from shim import devmodel as dm; import shim._devmodel as m; "
                           "print(m.__file__, dm.solo(dm.default_params(), dm.KERNEL, 132, 512, 0, 0, 66e9, 0, 132))"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    mod, secs = solo.stdout.split() if solo.returncode == 0 else ("", "0")
    assert Path(mod).is_relative_to(env_dir) and abs(float(secs) - 1e-3) < 1e-12, solo.stdout + solo.stderr

    r = subprocess.run([str(env_dir / "bin" / "colocate"), "run", "--device", "sim", "--", str(VECADD)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "PASS vecadd" in r.stdout, r.stdout + r.stderr

"""Static checks of libcolocate.so: what it exports, what it links, and that
every hooked name is a real CUDA 13 API (declared in the toolkit headers)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from shim import build, paths

ROOT = Path(__file__).resolve().parents[1]
CUDA_INC = build.cuda_home() / "include"


def _dynsyms(lib: Path, *flags: str) -> list[str]:
    out = subprocess.run(["nm", "-D", *flags, str(lib)], check=True, capture_output=True, text=True)
    names = [ln.split()[-1] for ln in out.stdout.splitlines() if ln.strip()]
    return names if "--with-symbol-versions" in flags else [n.split("@")[0] for n in names]


def test_exports_exactly_the_intended_symbols():
    defined = set(_dynsyms(paths.LIBCOLOCATE, "--defined-only"))
    assert defined == set(build.exported_names())


def test_no_python_on_the_launch_path():
    undefined = _dynsyms(paths.LIBCOLOCATE, "--undefined-only")
    assert not [s for s in undefined if s.startswith(("Py", "_Py"))]
    needed = subprocess.run(["readelf", "-d", str(paths.LIBCOLOCATE)], check=True,
                            capture_output=True, text=True).stdout
    assert "libpython" not in needed
    # linked with -z defs: everything it needs comes from libc (libdl/libpthread
    # are part of glibc 2.34+), nothing is left for the app to provide.
    libs = re.findall(r"Shared library: \[(.+?)\]", needed)
    assert set(libs) <= {"libc.so.6", "libdl.so.2", "libpthread.so.0", "ld-linux-x86-64.so.2"}, libs
    assert all("@GLIBC_" in s or s.startswith(("_ITM_", "__gmon_start__"))
               for s in _dynsyms(paths.LIBCOLOCATE, "--undefined-only", "--with-symbol-versions"))


def test_hooked_names_are_declared_in_cuda13_headers(tmp_path):
    """C API names (and their _ptsz/_ptds/_v2 variants, which the headers
    declare under __CUDA_API_VERSION_INTERNAL) must compile as &name; the
    nvcc-internal __cuda* entry points must be declared in crt/*.h."""
    names = [n for n in build.exported_names() if n != "dlsym"]
    ours = [n for n in names if n.startswith("colocate_")]
    internal = [n for n in names if n.startswith("__cuda")]
    public = [n for n in names if not n.startswith(("__cuda", "colocate_"))]
    # cuDNN/cuBLAS: no headers on these machines; shim/include/colocate_dnn.h
    # declares the subset with the real prototypes
    src = tmp_path / "decls.c"
    src.write_text("#include <cuda.h>\n#include <cuda_runtime_api.h>\n#include \"colocate_dnn.h\"\n"
                   "void f(void){\n" + "".join(f"(void)&{n};\n" for n in public) + "}\n")
    res = subprocess.run(["cc", "-fsyntax-only", "-Werror", "-D__CUDA_API_VERSION_INTERNAL",
                          f"-I{CUDA_INC}", f"-I{ROOT / 'shim' / 'include'}", str(src)],
                         capture_output=True, text=True)
    # our own API: what the public header looks up
    header = (ROOT / "shim" / "include" / "colocate.h").read_text()
    assert all(f'"{n}"' in header for n in ours), ours
    assert res.returncode == 0, res.stderr[-3000:]
    crt = "\n".join(p.read_text(errors="replace") for p in (CUDA_INC / "crt").glob("*.h"))
    missing = [n for n in internal if not re.search(rf"CUDARTAPI\s+{re.escape(n)}\s*\(", crt)]
    assert not missing, missing


def test_declaration_check_catches_a_made_up_name(tmp_path):
    """The check above is able to fail."""
    src = tmp_path / "bad.c"
    src.write_text("#include <cuda.h>\nvoid f(void){ (void)&cuLaunchKernelTwice; }\n")
    res = subprocess.run(["cc", "-fsyntax-only", "-D__CUDA_API_VERSION_INTERNAL",
                          f"-I{CUDA_INC}", str(src)], capture_output=True, text=True)
    assert res.returncode != 0


def test_runtime_hooks_exist_in_the_real_libcudart():
    real = CUDA_INC.parent / "lib64" / "libcudart.so.13"
    if not real.exists():
        pytest.skip(f"{real} not installed")
    have = set(_dynsyms(real, "--defined-only"))
    runtime = [n for n in build.exported_names() if n.startswith(("cuda", "__cuda"))]
    assert not [n for n in runtime if n not in have]

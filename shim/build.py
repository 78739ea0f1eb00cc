"""Build step of the package: the cffi modules (shim._proto for the shared
formats, shim._devmodel for simgpu's device-model engine) and the
native C libraries (libcolocate.so, simgpu's libcudart.so.13 and its
libcuda.so.1).

setup.py hands `ffibuilder` to cffi (cffi_modules) and calls build_native()
from its build_ext command; `python -m shim.build` does both in place, which
is what `make build` runs after a C source changed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from cffi import FFI

HERE = Path(__file__).resolve().parent
LIB = HERE / "lib"
ROOT = HERE.parent
PROTO = HERE / "proto"             # the formats the shim, the worker and Python share
WORKER_SRC = ROOT / "processpool" / "worker"

CFLAGS = ["-O2", "-g", "-fPIC", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-fvisibility=hidden", "-pthread"]

# --- cffi module: Python's view of the shared-memory files, its cdef generated
# from the very headers the shim is compiled with (no copy to drift apart)
CFFI_HEADERS = ("ctlblock.h", "ledger.h", "fwd_proto.h")


def _strip_parens(text: str, word: str) -> str:
    """Remove every `word(...)` with balanced parentheses."""
    out: list[str] = []
    i = 0
    while True:
        j = text.find(word, i)
        if j < 0:
            return "".join(out) + text[i:]
        k = text.index("(", j)
        depth = 0
        for m in range(k, len(text)):
            depth += text[m] == "("
            depth -= text[m] == ")"
            if depth == 0:
                break
        out.append(text[i:j])
        i = m + 1


def _drop_bodies(text: str) -> str:
    """static inline functions become plain prototypes (cffi wraps them)."""
    out: list[str] = []
    i = 0
    for m in re.finditer(r"static\s+inline\s+([^;{]*?\))\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()] + m.group(1) + ";")
        depth, k = 0, m.end() - 1
        for k in range(m.end() - 1, len(text)):
            depth += text[k] == "{"
            depth -= text[k] == "}"
            if depth == 0:
                break
        i = k + 1
    return "".join(out) + text[i:]


def _enum_values_from_compiler(m: re.Match) -> str:
    names = [e.split("=")[0].strip() for e in m.group(2).split(",") if e.strip()]
    return m.group(1) + ", ".join(f"{n}=..." for n in names) + "}"


def cdef_of(header: str) -> str:
    """A cffi cdef from a C header: integer #defines, enums, structs (their
    layout left to the compiler: `...;`, array sizes `[...]`) and function
    prototypes (static inline ones included); C++ guards and attribute
    macros left out.  So Python reads sizes, offsets and constants from the
    header the C code is compiled with, never from a copy."""
    t = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    t = re.sub(r"//[^\n]*", "", t)
    t = re.sub(r"\\\n", " ", t)
    t = re.sub(r"^\s*#\s*ifdef\s+__cplusplus\b.*?^\s*#\s*endif[^\n]*$", "", t, flags=re.M | re.S)
    valued = re.findall(r"^\s*#\s*define\s+([A-Z_][A-Z0-9_]*)[ \t]+(?!__attribute__)\S", t, re.M)
    defines = [f"#define {n} ..." for n in valued]
    t = re.sub(r"^\s*#[^\n]*$", "", t, flags=re.M)
    t = _strip_parens(t, "_Static_assert")
    t = _strip_parens(t, "__attribute__")
    t = _strip_parens(t, "_Alignas")
    t = re.sub(r"\b_Atomic\b", "", t)
    t = re.sub(r"(?<!\w)_Static_assert\s*;", "", t)
    t = _drop_bodies(t)
    t = re.sub(r"\[[^\]]+\]", "[...]", t)
    t = re.sub(r"(\bstruct\s+\w+\s*\{[^{}]*?)\}", lambda m: m.group(1) + "...; }", t)
    t = re.sub(r"(\benum\s+\w+\s*\{)([^}]*)\}", _enum_values_from_compiler, t)
    t = re.sub(r"^\s*;\s*$", "", t, flags=re.M)
    t = re.sub(r"\n\s*\n+", "\n", t)
    return "\n".join(defines) + "\n" + t.strip() + "\n"


def cdef() -> str:
    return "".join(cdef_of((PROTO / h).read_text()) for h in CFFI_HEADERS)


def make_ffi(base: Path) -> FFI:
    """The cffi builder, with paths under base (setuptools wants them relative
    to setup.py's folder; an in-place build wants them absolute)."""
    ffi = FFI()
    ffi.cdef(cdef())
    ffi.set_source("shim._proto", "".join(f'#include "{h}"\n' for h in CFFI_HEADERS),
                   sources=[str(base / f) for f in ("ctlblock.c", "ledger.c", "shmfile.c")],
                   include_dirs=[str(base), str(base / "proto")],
                   extra_compile_args=["-std=gnu11"])
    return ffi


ffibuilder = make_ffi(Path(os.path.relpath(HERE)))

# --- cffi module shim._devmodel: simgpu's device-model engine (engine.c, the
# very file the live device runs) for the simulator, shim/devmodel.py
SIMGPU_SRC = HERE / "simgpu"
DEVMODEL_HEADERS = ("simgpu_model.h", "engine.h")

# Helpers the Python side needs beyond engine.h: the state on the heap (its
# task table grown in place), a task's entry, and the finished tasks
# collected in one call rather than a Python loop over the table.
DEVMODEL_HELPERS = r"""
#include <stdlib.h>
#include <string.h>
#include "engine.h"

static struct en_state *dm_new(const struct simgpu_model_params *p, uint32_t cap)
{
	struct en_state *st = malloc(en_size(cap));

	if (st)
		en_init(st, p, cap);
	return st;
}

/* The same state with room for cap tasks (more than it has); NULL, and st
 * left as it was, when out of memory. */
static struct en_state *dm_grow(struct en_state *st, uint32_t cap)
{
	uint32_t old = st->cap;
	struct en_state *n = realloc(st, en_size(cap));

	if (!n)
		return NULL;
	memset(&n->t[old], 0, (size_t)(cap - old) * sizeof(n->t[0]));
	n->cap = cap;
	return n;
}

static void dm_free(struct en_state *st)
{
	free(st);
}

static struct en_task *dm_task(struct en_state *st, int i)
{
	return &st->t[i];
}

/* Finished tasks: index, start and end of at most n of them, each dropped
 * (its entry free for a new task).  Returns how many. */
static int dm_collect(struct en_state *st, int *idx, double *t0, double *t1, int n)
{
	uint32_t i;
	int got = 0;

	for (i = 0; i < st->hi && got < n; i++) {
		if (st->t[i].state != EN_DONE)
			continue;
		idx[got] = (int)i;
		t0[got] = st->t[i].t_start;
		t1[got] = st->t[i].t_end;
		got++;
		en_drop(st, (int)i, NULL, NULL);
	}
	return got;
}
"""

DEVMODEL_HELPERS_CDEF = """
struct en_state *dm_new(const struct simgpu_model_params *p, uint32_t cap);
struct en_state *dm_grow(struct en_state *st, uint32_t cap);
void dm_free(struct en_state *st);
struct en_task *dm_task(struct en_state *st, int i);
int dm_collect(struct en_state *st, int *idx, double *t0, double *t1, int n);
"""


def devmodel_cdef() -> str:
    """simgpu_model.h and engine.h as a cdef, less what lives outside
    engine.c (simgpu_model_params_get is config.c's: Python asks
    libcudart.so.13 for it), plus the helpers."""
    text = "".join(cdef_of((SIMGPU_SRC / h).read_text()) for h in DEVMODEL_HEADERS)
    text = re.sub(r"^int simgpu_model_params_get\([^;]*\);\n", "", text, flags=re.M)
    return text + DEVMODEL_HELPERS_CDEF


def make_devmodel_ffi(base: Path) -> FFI:
    """The cffi builder of shim._devmodel, its sources under base."""
    ffi = FFI()
    ffi.cdef(devmodel_cdef())
    ffi.set_source("shim._devmodel", DEVMODEL_HELPERS,
                   sources=[str(base / "simgpu" / "engine.c")],
                   include_dirs=[str(base / "simgpu")],
                   extra_compile_args=["-O2", "-std=gnu11"], libraries=["m"])
    return ffi


devmodel_ffibuilder = make_devmodel_ffi(Path(os.path.relpath(HERE)))


def cuda_home() -> Path:
    """The CUDA toolkit whose headers the hooks are checked against."""
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and (Path(cand) / "include" / "cuda.h").exists():
            return Path(cand)
    nvcc = shutil.which("nvcc")
    if nvcc and (Path(nvcc).resolve().parent.parent / "include" / "cuda.h").exists():
        return Path(nvcc).resolve().parent.parent
    raise SystemExit("shim build: CUDA 13 headers not found (no cuda.h); set CUDA_HOME")


def _newer(out: Path, deps: list[Path]) -> bool:
    return out.exists() and all(out.stat().st_mtime >= d.stat().st_mtime for d in deps)


def _link(out: Path, sources: list[Path], extra: list[str], deps: list[Path],
          shared: bool = True) -> None:
    if _newer(out, sources + deps):
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    # link beside it, then rename: a process running the old library keeps
    # its file (writing into a mapped library in place kills it with SIGBUS)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [cc, *CFLAGS, f"-I{HERE}", f"-I{PROTO}", f"-I{cuda_home() / 'include'}",
           *(["-shared"] if shared else []), "-o", str(tmp), *map(str, sources), *extra]
    print(" ".join(cmd), file=sys.stderr)
    try:
        subprocess.run(cmd, check=True)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _version_script(path: Path, node: str | None, names: list[str]) -> Path:
    body = "".join(f"    {n};\n" for n in names)
    text = f"{node or ''} {{\n  global:\n{body}  local: *;\n}};\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def exported_names() -> list[str]:
    """The symbols libcolocate.so exports, one per line in shim/exports.txt."""
    lines = (HERE / "exports.txt").read_text().splitlines()
    return [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()]


def build_native() -> None:
    LIB.mkdir(exist_ok=True)
    headers = sorted(HERE.glob("*.h")) + sorted(PROTO.glob("*.h")) + sorted((HERE / "simgpu").glob("*.h"))
    handoff_h = [h for h in headers if h.name.startswith("handoff")]
    headers = [h for h in headers if h not in handoff_h]     # only libcolocate_handoff.so uses them

    # libcolocate.so: plain C, no Python, every symbol resolved at link time.
    shim_src = (sorted(HERE.glob("hook_*.c")) + sorted(HERE.glob("shim_*.c"))
                + [HERE / "ctlblock.c", HERE / "ledger.c", HERE / "shmfile.c", HERE / "zmqdl.c",
                   HERE / "unixutil.c"])
    vs = _version_script(LIB / "libcolocate.map", None, exported_names())
    _link(LIB / "libcolocate.so", shim_src,
          ["-Wl,-z,defs", f"-Wl,--version-script={vs}", "-Wl,-soname,libcolocate.so", "-ldl", "-lpthread"],
          headers + [HERE / "exports.txt"])

    # libcolocate_handoff.so: the pipeline hand-off API (include/colocate_handoff.h,
    # shim/handoff.py over it).  A library of its own, not part of
    # libcolocate.so: the preloaded shim goes into every app and must not
    # change (no service thread, socket or exported name appears in an app
    # that does not ask for hand-offs), and a stage may use hand-offs
    # without the shim (natively, or Python with CuPy).  It finds
    # libcudart at run time (handoff_cuda.c), so it links nothing of CUDA.
    _link(LIB / "libcolocate_handoff.so", sorted(HERE.glob("handoff*.c")),
          ["-Wl,-z,defs", "-Wl,-soname,libcolocate_handoff.so", "-ldl", "-lpthread"],
          headers + handoff_h + [HERE / "include" / "colocate_handoff.h"])

    # the process-pool worker: linked against the toolkit's libcudart without
    # an rpath, so LD_LIBRARY_PATH picks simgpu's libcudart.so.13 or the real one.
    worker_src = sorted(WORKER_SRC.glob("*.c"))
    if worker_src:
        _link(LIB / "colocate-worker", worker_src + [HERE / "zmqdl.c", HERE / "unixutil.c"],
              [f"-L{cuda_home() / 'lib64'}", "-lcudart", "-ldl", "-lpthread"],
              headers + sorted(WORKER_SRC.glob("*.h")), shared=False)

    # simgpu: the CPU test device, installed as libcudart.so.13 with its version node.
    # (unixutil.c: its process probe, as libcolocate.so and the worker use it)
    sim_src = sorted((HERE / "simgpu").glob("*.c"))
    if sim_src:
        sim_src.append(HERE / "unixutil.c")
        vs = _version_script(LIB / "simgpu.map", "libcudart.so.13", ["*"])
        out = LIB / "simgpu" / "libcudart.so.13"
        _link(out, sim_src, ["-Wl,-z,defs", f"-Wl,--version-script={vs}", "-Wl,-soname,libcudart.so.13",
                             "-ldl", "-lpthread", "-lm", "-lrt"], headers)
        link = out.parent / "libcudart.so"
        if not link.exists():
            link.symlink_to(out.name)

    # simgpu's driver, libcuda.so.1, over the same device as its libcudart.
    build_driver(headers)

    # simgpu's CPU cuDNN and cuBLAS, next to its libcudart.so.13.
    build_dnn(headers)


def build_driver(headers: list[Path]) -> None:
    """simgpu's libcuda.so.1 (shim/simgpu/driver/*.c): the CUDA driver API
    over the device of simgpu's libcudart.so.13, which it links against
    (the private simgpu_drv_* entry points of drvglue.c; no rpath, so
    LD_LIBRARY_PATH picks the libcudart beside it), plus a libcuda.so link
    for `-L shim/lib/simgpu -lcuda`.

    No version script: the driver's symbols are unversioned, as NVIDIA's.
    -Bsymbolic: like the real driver, its own calls between entry points
    stay inside it instead of landing in a preloaded hook."""
    src = sorted((HERE / "simgpu" / "driver").glob("*.c"))
    sim = LIB / "simgpu"
    cudart = sim / "libcudart.so.13"
    if not src or not cudart.exists():
        return
    out = sim / "libcuda.so.1"
    _link(out, src,
          ["-Wl,-z,defs", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1",
           f"-L{sim}", "-l:libcudart.so.13", "-ldl", "-lpthread"],
          headers + sorted((HERE / "simgpu" / "driver").glob("*.h")) + [cudart])
    link = sim / "libcuda.so"
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        link.symlink_to(out.name)


def build_dnn(headers: list[Path]) -> None:
    """simgpu's CPU cuDNN (libcudnn.so.9) and cuBLAS (libcublas.so.13), plus
    libcudnn.so/libcublas.so links so `-L shim/lib/simgpu -lcudnn -lcublas`
    works, and shim/lib/dnncheck, the C driver the tests run under the shim.

    No version script: the libraries export unversioned symbols.  A program
    linked against them then records no version requirement for these
    names, and on a GPU machine glibc binds each unversioned reference to
    the real library's default (or only) version of the symbol; a version
    node of ours that NVIDIA's libraries lack would instead make the loader
    refuse the program there.  -Bsymbolic-functions keeps calls between
    our own entry points inside the library (they never reach a preloaded
    hook, like the real libraries' internal calls); cudaLaunchKernel, in
    libcudart, still does."""
    src = HERE / "simgpu" / "dnn"
    sim = LIB / "simgpu"
    cudart = sim / "libcudart.so.13"
    if not (src / "launch.c").exists() or not cudart.exists():
        return
    deps = headers + sorted(src.glob("*.h")) + [HERE / "include" / "colocate_dnn.h", cudart]
    common = [src / "launch.c", src / "gemm.c"]
    libs = {"libcudnn.so.9": [src / "cudnn_desc.c", src / "cudnn_conv.c", src / "cudnn_ops.c"],
            "libcublas.so.13": [src / "cublas.c"]}
    for soname, files in libs.items():
        out = sim / soname
        _link(out, common + files,
              ["-O3", "-Wl,-z,defs", "-Wl,-Bsymbolic-functions", f"-Wl,-soname,{soname}",
               f"-L{sim}", "-l:libcudart.so.13", "-ldl", "-lpthread", "-lm"], deps)
        link = sim / soname[:soname.index(".so") + 3]
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(out.name)
    # no rpath: LD_LIBRARY_PATH picks simgpu's libraries or NVIDIA's
    _link(LIB / "dnncheck", [src / "dnncheck.c"],
          [f"-L{sim}", "-lcudnn", "-lcublas", "-l:libcudart.so.13", "-lm"],
          deps + [sim / name for name in libs], shared=False)


def cffi_inplace(make: Callable[[Path], FFI], here: Path, stem: str, deps: list[Path],
                 force: bool = False) -> Path:
    """Compile the cffi module <here>/<stem>*.so when it is missing or any
    copy of it is older than deps (an editable install leaves <stem>.abi3.so,
    this builds <stem>.cpython-*.so, which Python loads first).  make(base)
    returns the FFI with its sources under base."""
    targets = sorted(here.glob(f"{stem}*.so"))
    if targets and not force:
        newest = max(d.stat().st_mtime for d in deps)
        if all(t.stat().st_mtime >= newest for t in targets):
            return targets[0]
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(make(here).compile(tmpdir=tmp, verbose=False))
        for old in here.glob(f"{stem}*.so"):
            old.unlink()
        shutil.copy(so, here / so.name)
    print(f"built {here / so.name}", file=sys.stderr)
    return here / so.name


def build_inplace() -> None:
    """Build the cffi module next to its package and the native libraries."""
    build_native()
    deps = [HERE / f for f in ("ctlblock.c", "ledger.c", "shmfile.c", "shmfile.h")]
    cffi_inplace(make_ffi, HERE, "_proto", deps + [PROTO / h for h in CFFI_HEADERS] + [Path(__file__)])
    cffi_inplace(make_devmodel_ffi, HERE, "_devmodel",
                 [SIMGPU_SRC / "engine.c"] + [SIMGPU_SRC / h for h in DEVMODEL_HEADERS] + [Path(__file__)])


if __name__ == "__main__":
    build_inplace()

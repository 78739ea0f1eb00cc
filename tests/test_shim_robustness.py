"""The shim must be invisible to programs that do not use CUDA: its dlsym
override answers exactly as glibc would, for any caller."""
from __future__ import annotations

import os
import subprocess

import pytest

from shim import paths

MAIN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    void *p = dlsym(RTLD_NEXT, "puts");          /* from the executable */
    void *h = dlopen(LIB, RTLD_NOW | RTLD_LOCAL);
    const char *(*home)(void) = h ? (const char *(*)(void))dlsym(h, "wrapped_home") : NULL;
    printf("puts=%s home=%s\n", p ? "found" : "null", home ? home() : "nolib");
    return 0;
}
"""
LIB = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
/* a wrapper library loaded with dlopen, looking up the next getenv */
const char *wrapped_home(void) {
    char *(*next)(const char *) = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    return next ? next("HOME") : "(no next getenv)";
}
"""


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    d = tmp_path_factory.mktemp("rtld")
    (d / "lib.c").write_text(LIB)
    (d / "main.c").write_text(MAIN)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", d / "libwrap.so", d / "lib.c"], check=True)
    subprocess.run(["cc", f'-DLIB="{d / "libwrap.so"}"', "-o", d / "main", d / "main.c", "-ldl"],
                   check=True)
    return d / "main"


def test_rtld_next_lookups_are_unchanged_by_the_shim(prog, tmp_path):
    env = {**os.environ, "HOME": "/home/someone", "COLOCATE_RUNTIME_DIR": str(tmp_path)}
    native = subprocess.run([prog], env=env, capture_output=True, text=True, check=True)
    shimmed = subprocess.run([prog], env={**env, "LD_PRELOAD": str(paths.LIBCOLOCATE)},
                             capture_output=True, text=True, timeout=30)
    assert native.stdout == "puts=found home=/home/someone\n"
    assert shimmed.returncode == 0, shimmed.stderr
    assert shimmed.stdout == native.stdout


# A wheel's vendored runtime under another name (PyTorch ships
# libcudart-<hash>.so.13), reached through a library loaded RTLD_LOCAL: the
# user library's cudaMalloc binds to our hook, which must still find it.
FAKE_RT = r"""
#include <stddef.h>
int cudaMalloc(void **p, size_t n) { *p = (void *)0x1234; return n == 16 ? 0 : 1; }
"""
USER_LIB = r"""
#include <stddef.h>
int cudaMalloc(void **p, size_t n);
int user_alloc(void **p) { return cudaMalloc(p, 16); }
"""
USER_MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen(USERLIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
    int (*alloc)(void **) = (int (*)(void **))dlsym(h, "user_alloc");
    void *p = NULL;
    int rc = alloc(&p);
    printf("rc=%d p=%p\n", rc, p);
    return 0;
}
"""


def private_library_run(d, lib_name: str, lib_src: str, user_src: str, main_src: str) -> tuple[str, str]:
    """Build lib_name (its soname), a user library that needs it, and a main
    that dlopen()s the user library RTLD_LOCAL; run main natively and under
    the shim.  Returns (native stdout, shimmed stdout + stderr)."""
    (d / "lib.c").write_text(lib_src)
    (d / "user.c").write_text(user_src)
    (d / "main.c").write_text(main_src)
    lib = d / lib_name
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{lib_name}", "-o", lib, d / "lib.c"],
                   check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", d / "libuser.so", d / "user.c", str(lib),
                    f"-Wl,-rpath,{d}"], check=True)
    subprocess.run(["cc", f'-DUSERLIB="{d / "libuser.so"}"', "-o", d / "main", d / "main.c", "-ldl"],
                   check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "SIMGPU_"))}
    env.update(COLOCATE_RUNTIME_DIR=str(d / "run"), COLOCATE_QUIET="1")
    native = subprocess.run([d / "main"], env=env, capture_output=True, text=True, timeout=30)
    shimmed = subprocess.run([d / "main"], env={**env, "LD_PRELOAD": str(paths.LIBCOLOCATE)},
                             capture_output=True, text=True, timeout=30)
    return native.stdout + native.stderr, shimmed.stdout + shimmed.stderr


def test_privately_loaded_renamed_runtime_is_found(tmp_path):
    native, shimmed = private_library_run(tmp_path, "libcudart-0a1b2c3d.so.13", FAKE_RT, USER_LIB,
                                          USER_MAIN)
    assert native == "rc=0 p=0x1234\n", native
    # without the fallback the hook found no runtime and returned 302
    assert shimmed == native


# cuBLAS of another major version, a dependency of a library loaded
# RTLD_LOCAL (as a framework's extension module loads it): the call binds to
# our exported hook, which must still reach it.
FAKE_BLAS = r"""
typedef struct ctx *cublasHandle_t;
int cublasSgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *al,
                   const float *a, int lda, const float *b, int ldb, const float *be, float *c,
                   int ldc) { (void)h; (void)ta; (void)tb; (void)n; (void)k; (void)al; (void)a;
                   (void)lda; (void)b; (void)ldb; (void)be; (void)ldc; c[0] = 42.0f; return m == 1 ? 0 : 7; }
int cublasGetStream_v2(cublasHandle_t h, void **s) { (void)h; *s = 0; return 0; }
"""
BLAS_USER = r"""
typedef struct ctx *cublasHandle_t;
int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float *, const float *, int,
                   const float *, int, const float *, float *, int);
int user_gemm(float *c) { float one = 1; return cublasSgemm_v2(0, 0, 0, 1, 1, 1, &one, &one, 1, &one, 1, &one, c, 1); }
"""
BLAS_MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen(USERLIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
    int (*gemm)(float *) = (int (*)(float *))dlsym(h, "user_gemm");
    float c = 0;
    int rc = gemm(&c);
    printf("rc=%d c=%g\n", rc, c);
    return 0;
}
"""


def test_privately_loaded_other_major_cublas_is_found(tmp_path):
    native, shimmed = private_library_run(tmp_path, "libcublas.so.12", FAKE_BLAS, BLAS_USER, BLAS_MAIN)
    assert native == "rc=0 c=42\n", native
    assert shimmed == native

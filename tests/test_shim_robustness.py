"""The shim must be invisible to programs that do not use CUDA: its dlsym
override answers exactly as glibc would, for any caller."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

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

"""simgpu's CUDA arrays, texture objects and surface objects
(shim/simgpu/array.c, texture.c; the twins' sampling API in simgpu_twin.h).

bench/progs/texture is a plain CUDA program that checks its own samples
against the CUDA Programming Guide's rules computed on the host; here it
runs on simgpu, and a few of its samples are compared with values worked
out by hand, so a rule broken the same way in simgpu and in the program's
reference still fails.  A second part drives simgpu through ctypes in a
child process: hand-computed 1D/3D samples, the 9-bit filtering weights,
bad handles and bad arguments (error codes, never a crash).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ensure_simgpu, simgpu_env

from shim import paths

ROOT = Path(__file__).resolve().parent.parent
NVCC = shutil.which("nvcc")
PROG = ROOT / "bench" / "bin" / "texture"


@pytest.fixture(scope="module")
def prog() -> Path:
    if NVCC is None:
        pytest.skip("nvcc (CUDA 13 toolkit) not installed")
    ensure_simgpu()
    targets = ["bench/bin/texture", "bench/bin/texture.twins.so"]
    r = subprocess.run(["make", "-s", *targets], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"make {' '.join(targets)} failed:\n{r.stdout}\n{r.stderr}"
    return PROG


# ---------------------------------------------------------------- the program

def test_texture_program_passes_its_checks(prog, simdir):
    r = subprocess.run([str(prog)], env=simgpu_env(simdir), capture_output=True, text=True, timeout=60)
    line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout}\n{r.stderr}"
    out = json.loads(line)
    assert out["failed"] == 0 and out["failures"] == [], out["failures"]
    assert out["checks"] == out["passed"] >= 200
    s = out["samples"]
    # 8x4 texture T[y][x] = x + 10 y; coordinates are the program's NC table
    # (normalized; times 8 and 4 where the texture is unnormalized)
    assert s["point_clamp"][4] == 10        # (-2, 1.5): x clamps to 0
    assert s["point_clamp"][5] == 37        # (9.6, 3.88): clamps to (7, 3)
    assert s["linear_clamp"][1] == 23       # a texel centre is the texel
    assert s["linear_clamp"][2] == 12.75    # (3.25, 1.5): alpha 0.75 between x = 2 and 3
    # (3.28, 1.72): alpha = 0.78 -> 200/256, beta = 0.22 -> 56/256 (exact: 14.98)
    assert s["linear_clamp"][3] == 14.96875
    assert s["linear_clamp"][4] == 10       # beyond the edge: the edge texel
    assert s["point_wrap_norm"][11] == 10   # (-0.9, 2.3) wraps to (0.1, 0.3) -> (0, 1)
    assert s["linear_wrap_norm"][4] == 15.5 # x -0.25 wraps to 0.75 -> 5.5
    # (0.99, -1.25): x 7.92 -> between x = 7 and (wrapped) 0 with alpha 108/256;
    # y wraps to 0.75 -> 2.5 between rows 2 and 3
    assert s["linear_wrap_norm"][6] == 7 * (1 - 108 / 256) + 25
    assert s["linear_mirror_norm"][4] == 11.5   # -0.25 mirrors to 0.25 -> 1.5
    assert s["linear_border_norm"][4] == -1     # all four texels are border
    assert s["linear_border_norm"][7] == -0.75  # (0, 0): three of four texels border
    assert s["point_border"][5] == -1 and s["point_border"][1] == 23
    # pitch2D 5x3, P[y][x] = 100 + x + 7 y with P[1][0..1] zeroed by cudaMemset2D
    assert s["pitch2d_point"][4] == 0 and s["pitch2d_point"][1] == 109
    # 8-bit 16x2, U = (17 x + 100 y) & 255 read as normalized float: (7, 1) = 219
    assert abs(s["u8_point_norm"][1] - 219 / 255) < 1e-7


# ---------------------------------------------------------------- ctypes

CTYPES_SCRIPT = r'''
import ctypes as C, json, sys
rt = C.CDLL("libcudart.so.13")

class ChanDesc(C.Structure):
    _fields_ = [("x", C.c_int), ("y", C.c_int), ("z", C.c_int), ("w", C.c_int), ("f", C.c_int)]
class Extent(C.Structure):
    _fields_ = [("width", C.c_size_t), ("height", C.c_size_t), ("depth", C.c_size_t)]
class Pos(C.Structure):
    _fields_ = [("x", C.c_size_t), ("y", C.c_size_t), ("z", C.c_size_t)]
class PitchedPtr(C.Structure):
    _fields_ = [("ptr", C.c_void_p), ("pitch", C.c_size_t), ("xsize", C.c_size_t), ("ysize", C.c_size_t)]
class Copy3D(C.Structure):
    _fields_ = [("srcArray", C.c_void_p), ("srcPos", Pos), ("srcPtr", PitchedPtr),
                ("dstArray", C.c_void_p), ("dstPos", Pos), ("dstPtr", PitchedPtr),
                ("extent", Extent), ("kind", C.c_int)]
class ResUnion(C.Union):
    _fields_ = [("array", C.c_void_p), ("reserved", C.c_int * 32)]
class ResDesc(C.Structure):
    _fields_ = [("resType", C.c_int), ("res", ResUnion), ("flags", C.c_uint)]
class TexDesc(C.Structure):
    _fields_ = [("addressMode", C.c_int * 3), ("filterMode", C.c_int), ("readMode", C.c_int),
                ("sRGB", C.c_int), ("borderColor", C.c_float * 4), ("normalizedCoords", C.c_int),
                ("maxAnisotropy", C.c_uint), ("mipmapFilterMode", C.c_int),
                ("mipmapLevelBias", C.c_float), ("minMipmapLevelClamp", C.c_float),
                ("maxMipmapLevelClamp", C.c_float), ("disableTrilinearOptimization", C.c_int),
                ("seamlessCubemap", C.c_int)]

ULL = C.c_ulonglong
F4 = C.c_float * 4
I4 = C.c_int * 4
rt.cudaDestroyTextureObject.argtypes = [ULL]
rt.cudaDestroySurfaceObject.argtypes = [ULL]
rt.cudaGetTextureObjectResourceDesc.argtypes = [C.c_void_p, ULL]
rt.cudaMalloc3DArray.argtypes = [C.c_void_p, C.c_void_p, Extent, C.c_uint]
rt.cudaMallocArray.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_size_t, C.c_uint]
rt.cudaMemcpy2DToArray.argtypes = [C.c_void_p, C.c_size_t, C.c_size_t, C.c_void_p, C.c_size_t,
                                   C.c_size_t, C.c_size_t, C.c_int]
rt.cudaMemcpy2DFromArray.argtypes = [C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t, C.c_size_t,
                                     C.c_size_t, C.c_size_t, C.c_int]
rt.cudaMemset3D.argtypes = [PitchedPtr, C.c_int, Extent]
rt.cudaMemcpy.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int]
rt.cudaMalloc.argtypes = [C.c_void_p, C.c_size_t]
for n in ("simgpu_tex1D", "simgpu_tex1D_i"):
    getattr(rt, n).argtypes = [ULL, C.c_float, C.c_void_p]
rt.simgpu_tex2D.argtypes = [ULL, C.c_float, C.c_float, C.c_void_p]
rt.simgpu_tex3D.argtypes = [ULL, C.c_float, C.c_float, C.c_float, C.c_void_p]
rt.simgpu_tex1Dfetch.argtypes = [ULL, C.c_int, C.c_void_p]
rt.simgpu_surf2Dread.argtypes = [ULL, C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int]
rt.simgpu_surf2Dwrite.argtypes = [ULL, C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int]

FLOAT, SIGNED, UNSIGNED = 2, 0, 1
H2D, D2H = 1, 2
CLAMP_, WRAP, MIRROR, BORDER = 1, 0, 2, 3
out = {}

def farray(vals, w, h=0, flags=0):
    a = C.c_void_p()
    d = ChanDesc(32, 0, 0, 0, FLOAT)
    assert rt.cudaMallocArray(C.byref(a), C.byref(d), w, h, flags) == 0
    buf = (C.c_float * len(vals))(*vals)
    assert rt.cudaMemcpy2DToArray(a, 0, 0, buf, 4 * w, 4 * w, max(h, 1), H2D) == 0
    return a

def tex(a, mode, linear, norm, border=0.0, read_norm=0):
    rd = ResDesc(); rd.resType = 0; rd.res.array = a
    td = TexDesc(); td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = mode
    td.filterMode = linear; td.normalizedCoords = norm; td.readMode = read_norm
    for c in range(4): td.borderColor[c] = border
    t = ULL()
    rc = rt.cudaCreateTextureObject(C.byref(t), C.byref(rd), C.byref(td), None)
    assert rc == 0, rc
    return t.value

def s1(t, x):
    v = F4(); rc = rt.simgpu_tex1D(t, x, v); return [rc] + list(v)

# --- hand-computed 1D samples of T = [0, 10, 20, 30]
a1 = farray([0, 10, 20, 30], 4)
for name, mode in (("clamp", CLAMP_), ("wrap", WRAP), ("mirror", MIRROR), ("border", BORDER)):
    t = tex(a1, mode, 1, 1, border=-1.0)
    out["lin_norm_" + name + "_0"] = s1(t, 0.0)[1]       # u = 0: between texel -1 and 0
    out["lin_norm_" + name + "_m.1"] = s1(t, -0.1)[1]
    assert rt.cudaDestroyTextureObject(C.c_ulonglong(t)) == 0
t = tex(a1, CLAMP_, 1, 0)
out["lin_quant_1.8"] = s1(t, 1.8)[1]                    # alpha 0.3 -> 77/256
out["lin_exact_2.0"] = s1(t, 2.0)[1]
t_pt = tex(a1, WRAP, 0, 0)                               # wrap without normalized: clamp
out["pt_unnorm_wrap_5"] = s1(t_pt, 5.0)[1]
t_keep = tex(a1, CLAMP_, 0, 0)
# the array freed under a live texture: the texture keeps it
out["free_array_rc"] = rt.cudaFreeArray(a1)
out["after_free"] = s1(t_keep, 2.5)[1]
out["free_again_rc"] = rt.cudaFreeArray(a1)

# --- 8-bit signed, normalized float read: -128 reads as -1
a8 = C.c_void_p()
assert rt.cudaMallocArray(C.byref(a8), C.byref(ChanDesc(8, 0, 0, 0, SIGNED)), 3, 0, 0) == 0
b8 = (C.c_byte * 3)(-128, -127, 127)
assert rt.cudaMemcpy2DToArray(a8, 0, 0, b8, 3, 3, 1, H2D) == 0
t8 = tex(a8, CLAMP_, 0, 0, read_norm=1)
out["s8_norm"] = [s1(t8, 0.5)[1], s1(t8, 1.5)[1], s1(t8, 2.5)[1]]
t8e = tex(a8, CLAMP_, 0, 0, read_norm=0)
v = I4(); rt.simgpu_tex1D_i(t8e, 0.5, v); out["s8_elem"] = v[0]

# --- a 3D array through cudaMemcpy3D (host -> array at an offset, and back)
a3 = C.c_void_p()
assert rt.cudaMalloc3DArray(C.byref(a3), C.byref(ChanDesc(32, 0, 0, 0, FLOAT)), Extent(3, 2, 2), 0) == 0
host = (C.c_float * 12)(*[float(i) for i in range(12)])
p = Copy3D(); p.srcPtr = PitchedPtr(C.cast(host, C.c_void_p), 12, 3, 2); p.dstArray = a3
p.extent = Extent(3, 2, 2); p.kind = H2D
out["memcpy3d_to"] = rt.cudaMemcpy3D(C.byref(p))
t3 = tex(a3, CLAMP_, 0, 0)
v = F4(); rt.simgpu_tex3D(t3, 1.5, 0.5, 1.5, v); out["tex3d_point"] = v[0]   # (1, 0, 1) = 7
v = F4(); rt.simgpu_tex2D(t3, 2.5, 1.5, v); out["tex3d_as_2d"] = v[0]      # slice 0: (2, 1) = 5
back = (C.c_float * 2)()
q = Copy3D(); q.srcArray = a3; q.srcPos = Pos(1, 1, 1); q.dstPtr = PitchedPtr(C.cast(back, C.c_void_p), 8, 2, 1)
q.extent = Extent(2, 1, 1); q.kind = D2H
out["memcpy3d_from"] = rt.cudaMemcpy3D(C.byref(q))
out["memcpy3d_back"] = list(back)                         # (1,1,1), (2,1,1) = 10, 11
bad = Copy3D(); bad.srcArray = a3; bad.srcPtr = PitchedPtr(C.cast(host, C.c_void_p), 12, 3, 2)
bad.dstArray = a3; bad.extent = Extent(1, 1, 1)
out["memcpy3d_two_sources"] = rt.cudaMemcpy3D(C.byref(bad))
q.srcPos = Pos(2, 1, 1)                                   # 2 + 2 > 3: outside
out["memcpy3d_outside"] = rt.cudaMemcpy3D(C.byref(q))

# --- cudaMemset3D on linear memory
dptr = C.c_void_p()
assert rt.cudaMalloc(C.byref(dptr), 4 * 4 * 2) == 0
assert rt.cudaMemcpy(dptr, (C.c_ubyte * 32)(*([7] * 32)), 32, H2D) == 0
out["memset3d"] = rt.cudaMemset3D(PitchedPtr(dptr, 4, 4, 4), 0, Extent(2, 2, 2))
m = (C.c_ubyte * 32)(); rt.cudaMemcpy(m, dptr, 32, D2H)
out["memset3d_bytes"] = list(m)

# --- bad handles and arguments
f4 = F4(1, 2, 3, 4)
out["tex_bad_handle"] = [rt.simgpu_tex2D(0xdeadbeef, 0.5, 0.5, f4)] + list(f4)
f4b = F4(1, 2, 3, 4)
out["tex_zero_handle"] = [rt.simgpu_tex1Dfetch(0, 0, f4b)] + list(f4b)
stale = tex(a3, CLAMP_, 0, 0)
assert rt.cudaDestroyTextureObject(C.c_ulonglong(stale)) == 0
out["tex_stale"] = s1(stale, 0.5)[0]
out["destroy_stale"] = rt.cudaDestroyTextureObject(C.c_ulonglong(stale))
out["destroy_bogus_surf"] = rt.cudaDestroySurfaceObject(C.c_ulonglong(12345))
out["destroy_tex_as_surf"] = rt.cudaDestroySurfaceObject(C.c_ulonglong(t3))
rd = ResDesc()
out["get_res_bogus"] = rt.cudaGetTextureObjectResourceDesc(C.byref(rd), C.c_ulonglong(77))
tt = ULL()
out["create_null"] = rt.cudaCreateTextureObject(C.byref(tt), None, None, None)
rdb = ResDesc(); rdb.resType = 0; rdb.res.array = 0x1234
tdb = TexDesc()
out["create_bogus_array"] = rt.cudaCreateTextureObject(C.byref(tt), C.byref(rdb), C.byref(tdb), None)
rdg = ResDesc(); rdg.resType = 0; rdg.res.array = a3
tdg = TexDesc(); tdg.addressMode[0] = 7
out["create_bad_mode"] = rt.cudaCreateTextureObject(C.byref(tt), C.byref(rdg), C.byref(tdg), None)
rdl = ResDesc(); rdl.resType = 2
# res.linear: devPtr 0x1000 (not device memory), desc float (ints 2..6), sizeInBytes 64
rdl.res.reserved[0] = 0x1000; rdl.res.reserved[2] = 32; rdl.res.reserved[6] = FLOAT; rdl.res.reserved[8] = 64
out["create_linear_host_ptr"] = rt.cudaCreateTextureObject(C.byref(tt), C.byref(rdl), C.byref(tdb), None)
so = ULL()
out["surf_without_flag"] = rt.cudaCreateSurfaceObject(C.byref(so), C.byref(rdg))
out["surf_bogus_array"] = rt.cudaCreateSurfaceObject(C.byref(so), C.byref(rdb))
aa = C.c_void_p()
out["free_bogus"] = rt.cudaFreeArray(C.c_void_p(0x1234))
out["free_null"] = rt.cudaFreeArray(None)
out["info_bogus"] = rt.cudaArrayGetInfo(None, None, None, C.c_void_p(0x1234))
out["malloc_24bit"] = rt.cudaMallocArray(C.byref(aa), C.byref(ChanDesc(24, 0, 0, 0, FLOAT)), 4, 0, 0)
out["malloc_3ch"] = rt.cudaMallocArray(C.byref(aa), C.byref(ChanDesc(32, 32, 32, 0, FLOAT)), 4, 0, 0)
out["malloc_w0"] = rt.cudaMallocArray(C.byref(aa), C.byref(ChanDesc(32, 0, 0, 0, FLOAT)), 0, 0, 0)
out["malloc_null_desc"] = rt.cudaMallocArray(C.byref(aa), None, 4, 0, 0)
out["malloc_layered"] = rt.cudaMalloc3DArray(C.byref(aa), C.byref(ChanDesc(32, 0, 0, 0, FLOAT)), Extent(4, 4, 2), 1)
a2 = farray([float(i) for i in range(16)], 4, 4)
hb = (C.c_float * 32)()
out["to_array_too_wide"] = rt.cudaMemcpy2DToArray(a2, 4, 0, hb, 16, 16, 1, H2D)
out["to_array_too_tall"] = rt.cudaMemcpy2DToArray(a2, 0, 1, hb, 16, 16, 4, H2D)
out["to_array_small_pitch"] = rt.cudaMemcpy2DToArray(a2, 0, 0, hb, 8, 16, 2, H2D)
out["to_array_bad_kind"] = rt.cudaMemcpy2DToArray(a2, 0, 0, hb, 16, 16, 1, 17)
out["to_array_bogus"] = rt.cudaMemcpy2DToArray(C.c_void_p(0x1234), 0, 0, hb, 16, 16, 1, H2D)
out["from_array_ok"] = rt.cudaMemcpy2DFromArray(hb, 8, a2, 8, 2, 8, 2, D2H)
out["from_array_vals"] = list(hb)[:4]                      # (2,2) (3,2) (2,3) (3,3)

# --- surfaces: boundary modes
asf = farray([float(i) for i in range(8)], 4, 2, flags=2)
rds = ResDesc(); rds.resType = 0; rds.res.array = asf
out["surf_create"] = rt.cudaCreateSurfaceObject(C.byref(so), C.byref(rds))
val = C.c_float(0)
out["surf_read"] = [rt.simgpu_surf2Dread(so.value, C.byref(val), 4, 12, 1, 2), val.value]  # (3,1) = 7
val.value = -5
out["surf_zero_write"] = rt.simgpu_surf2Dwrite(so.value, C.byref(val), 4, 16, 0, 0)  # dropped
out["surf_clamp_read"] = [rt.simgpu_surf2Dread(so.value, C.byref(val), 4, 400, 9, 1), val.value]
out["surf_bad_size"] = rt.simgpu_surf2Dread(so.value, C.byref(val), 3, 0, 0, 2)
out["surf_bogus"] = rt.simgpu_surf2Dread(0x4242, C.byref(val), 4, 0, 0, 2)
out["err_before_trap"] = rt.cudaDeviceSynchronize()
out["surf_trap"] = rt.simgpu_surf2Dwrite(so.value, C.byref(val), 4, -4, 0, 2)
out["err_after_trap"] = rt.cudaDeviceSynchronize()        # sticky illegal address
print(json.dumps(out))
'''


def test_sampling_rules_and_errors_through_ctypes(simdir):
    ensure_simgpu()
    r = subprocess.run([sys.executable, "-c", CTYPES_SCRIPT], env=simgpu_env(simdir),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout}\n{r.stderr}"
    o = json.loads(r.stdout.strip().splitlines()[-1])
    # 1D [0, 10, 20, 30], linear, normalized: u = 0 sits between texels -1 and 0
    assert o["lin_norm_clamp_0"] == 0
    assert o["lin_norm_wrap_0"] == 15           # texel -1 wraps to 30
    assert o["lin_norm_mirror_0"] == 0          # texel -1 mirrors to texel 0
    assert o["lin_norm_border_0"] == -0.5       # half border (-1), half 0
    # -0.1: clamp -> 0; wrap -> 0.9 -> 3.6 -> xB 3.1: 30 and (wrapped) 0, alpha 26/256
    assert o["lin_norm_clamp_m.1"] == 0
    assert o["lin_norm_wrap_m.1"] == pytest.approx(30 * (1 - 26 / 256), abs=1e-5)
    # mirror -> 0.1 -> 0.4 -> xB -0.1: texels -1 (-> 0) and 0, both 0
    assert o["lin_norm_mirror_m.1"] == 0
    # border: u -0.4 -> xB -0.9: texel -1 is border (-1), texel 0 is 0, alpha 26/256
    assert o["lin_norm_border_m.1"] == pytest.approx(-(1 - 26 / 256), abs=1e-6)
    assert o["lin_quant_1.8"] == 10 + 10 * 77 / 256     # 9-bit weights, not 13.0
    assert o["lin_exact_2.0"] == 15
    assert o["pt_unnorm_wrap_5"] == 30                  # wrap needs normalized coords
    assert o["free_array_rc"] == 0 and o["after_free"] == 20
    assert o["free_again_rc"] == 1                      # cudaErrorInvalidValue
    assert o["s8_norm"] == [-1.0, -1.0, 1.0]
    assert o["s8_elem"] == -128
    assert o["memcpy3d_to"] == 0 and o["tex3d_point"] == 7 and o["tex3d_as_2d"] == 5
    assert o["memcpy3d_from"] == 0 and o["memcpy3d_back"] == [10, 11]
    assert o["memcpy3d_two_sources"] == 1 and o["memcpy3d_outside"] == 1
    # 2 bytes x 2 rows (pitch 4) x 2 slices (4 rows each) zeroed in 7s
    b = o["memset3d_bytes"]
    zero = {0, 1, 4, 5, 16, 17, 20, 21}
    assert o["memset3d"] == 0 and all((b[i] == 0) == (i in zero) for i in range(32)), b
    # bad handles: -1 and zeros, never a crash
    assert o["tex_bad_handle"] == [-1, 0, 0, 0, 0]
    assert o["tex_zero_handle"] == [-1, 0, 0, 0, 0]
    assert o["tex_stale"] == -1
    INVALID_VALUE, INVALID_PITCH, INVALID_DIRECTION = 1, 12, 21
    INVALID_HANDLE, NOT_SUPPORTED, ILLEGAL_ADDRESS = 400, 801, 700
    for k in ("destroy_stale", "destroy_bogus_surf", "destroy_tex_as_surf", "get_res_bogus",
              "create_null", "create_bogus_array", "create_bad_mode", "create_linear_host_ptr",
              "surf_without_flag", "free_bogus", "info_bogus", "malloc_24bit", "malloc_3ch",
              "malloc_w0", "malloc_null_desc", "to_array_too_wide", "to_array_too_tall",
              "to_array_bogus"):
        assert o[k] == INVALID_VALUE, (k, o[k])
    assert o["surf_bogus_array"] == INVALID_HANDLE
    assert o["free_null"] == 0
    assert o["malloc_layered"] == NOT_SUPPORTED
    assert o["to_array_small_pitch"] == INVALID_PITCH
    assert o["to_array_bad_kind"] == INVALID_DIRECTION
    assert o["from_array_ok"] == 0 and o["from_array_vals"] == [10, 11, 14, 15]
    # surfaces: trap (CUDA's default) fails the "kernel", zero drops, clamp clamps
    assert o["surf_create"] == 0 and o["surf_read"] == [0, 7]
    assert o["surf_zero_write"] == 1
    assert o["surf_clamp_read"] == [1, 7]           # (x 400, y 9) -> (3, 1)
    assert o["surf_bad_size"] == -1 and o["surf_bogus"] == -1
    assert o["err_before_trap"] == 0
    assert o["surf_trap"] == 1 and o["err_after_trap"] == ILLEGAL_ADDRESS


# The shim counts the bytes of array copies like any other copy: the array
# is device memory, so host->array is H2D and array->host D2H.
ARRAYCOPY_C = r"""
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("FAIL %s: %d\n", #x, e_); return 1; } } while (0)
int main(void)
{
	static float h[32][64], back[32][64];
	struct cudaChannelFormatDesc d = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
	struct cudaMemcpy3DParms p;
	cudaArray_t a;
	int i, j;

	for (i = 0; i < 32; i++)
		for (j = 0; j < 64; j++)
			h[i][j] = (float)(i * 64 + j);
	CK(cudaMallocArray(&a, &d, 64, 32, 0));
	CK(cudaMemcpy2DToArray(a, 0, 0, h, sizeof(h[0]), sizeof(h[0]), 32, cudaMemcpyHostToDevice));
	CK(cudaMemcpy2DFromArray(back, sizeof(back[0]), a, 0, 0, sizeof(back[0]), 32, cudaMemcpyDefault));
	memset(&p, 0, sizeof(p));
	p.srcPtr.ptr = h;
	p.srcPtr.pitch = sizeof(h[0]);
	p.srcPtr.xsize = 64;
	p.srcPtr.ysize = 32;
	p.dstArray = a;
	p.extent.width = 64;    /* elements: an array takes part */
	p.extent.height = 32;
	p.extent.depth = 1;
	p.kind = cudaMemcpyHostToDevice;
	CK(cudaMemcpy3D(&p));
	CK(cudaDeviceSynchronize());
	if (memcmp(h, back, sizeof(h)))
		return 1;
	printf("PASS bytes=%zu\n", sizeof(h));
	return 0;
}
"""


def test_the_shim_counts_array_copies(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import Controller, clean_env, colocate, new_rundir, wait_for
    ensure_simgpu()
    src, exe = tmp_path / "arraycopy.c", tmp_path / "arraycopy"
    src.write_text(ARRAYCOPY_C)
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    subprocess.run(["cc", "-O1", "-I", str(inc), "-o", str(exe), str(src), f"-L{paths.SIMGPU_DIR}",
                    "-l:libcudart.so.13"], check=True, capture_output=True, text=True)
    ctl = Controller(new_rundir())
    try:
        r = colocate("run", "--runtime-dir", ctl.rundir, "--device", "sim", "--name", "arraycopy", "--", exe,
                     env=clean_env(SIMGPU_TIMESCALE="0", SIMGPU_DIR=str(tmp_path)))
        assert r.returncode == 0 and "PASS bytes=8192" in r.stdout, r.stdout + r.stderr
        rec = wait_for(lambda: next((a for a in ctl.call("list", all=True)["apps"]
                                     if a["state"] == "exited"), None), timeout=10)
        assert rec, ctl.call("list", all=True)
        assert (rec["h2d_bytes"], rec["d2h_bytes"]) == (2 * 8192, 8192), rec
    finally:
        ctl.stop()
        shutil.rmtree(ctl.rundir, ignore_errors=True)

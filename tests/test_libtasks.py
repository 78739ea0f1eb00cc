"""simgpu's CPU cuDNN/cuBLAS (shim/simgpu/dnn) against numpy references, and
the shim's library-task hooks (shim/hook_lib.c) under `colocate run`.

The math runs in one child process (ctypes on shim/lib/simgpu, the libraries
opened RTLD_LOCAL as a plugin loader would): it prints, per case, the largest
error relative to the reference's magnitude, the statuses of calls that must
fail, and how many kernels it expects of each name; simgpu's per-kernel
report (SIMGPU_REPORT) says what really ran, with a twin and a modelled time.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import simgpu_env, stop, wait_until

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
DNNCHECK = paths.LIB_DIR / "dnncheck"
LIBS = [paths.SIMGPU_DIR / n for n in ("libcudnn.so.9", "libcublas.so.13")]

pytestmark = pytest.mark.skipif(not all(p.exists() for p in [*LIBS, DNNCHECK, paths.SIMGPU_CUDART]),
                                reason="simgpu cuDNN/cuBLAS not built (make build)")

CHILD = textwrap.dedent(r'''
    import ctypes as C, json, sys
    import numpy as np

    SIM = sys.argv[1]
    rt = C.CDLL(SIM + "/libcudart.so.13", mode=C.RTLD_GLOBAL)
    dnn = C.CDLL(SIM + "/libcudnn.so.9")      # RTLD_LOCAL, on purpose
    blas = C.CDLL(SIM + "/libcublas.so.13")
    vp, f32 = C.c_void_p, np.float32
    rng = np.random.default_rng(7)
    errs, statuses, kernels = {}, {}, {}

    def ok(st, what="call"):
        assert st == 0, f"{what}: status {st}"

    def count(name, n=1):
        kernels[name] = kernels.get(name, 0) + n

    def dev(a):
        a = np.ascontiguousarray(a, dtype=f32)
        p = vp()
        ok(rt.cudaMalloc(C.byref(p), C.c_size_t(max(a.nbytes, 4))), "cudaMalloc")
        ok(rt.cudaMemcpy(p, a.ctypes.data_as(vp), C.c_size_t(a.nbytes), 1), "h2d")
        return p

    def host(p, shape):
        out = np.empty(shape, f32)
        ok(rt.cudaDeviceSynchronize(), "sync")
        ok(rt.cudaMemcpy(out.ctypes.data_as(vp), p, C.c_size_t(out.nbytes), 2), "d2h")
        return out

    def err(got, ref):
        ref = np.asarray(ref, np.float64)
        return float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))

    def fp(v):
        return C.byref(C.c_float(v))

    h = vp(); ok(dnn.cudnnCreate(C.byref(h)))
    bh = vp(); ok(blas.cublasCreate_v2(C.byref(bh)))

    def tdesc(shape, fmt=0, dtype=0):
        d = vp(); ok(dnn.cudnnCreateTensorDescriptor(C.byref(d)))
        ok(dnn.cudnnSetTensor4dDescriptor(d, fmt, dtype, *shape))
        return d

    # ---- convolution -----------------------------------------------------
    def conv_ref(x, w, pad, st, dil, groups, flip):
        N, Cc, H, W = x.shape; K, Cg, R, S = w.shape; Kg = K // groups
        if flip:
            w = w[:, :, ::-1, ::-1]
        P = (H + 2 * pad[0] - ((R - 1) * dil[0] + 1)) // st[0] + 1
        Q = (W + 2 * pad[1] - ((S - 1) * dil[1] + 1)) // st[1] + 1
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2))
        y = np.zeros((N, K, P, Q))
        for g in range(groups):
            for r in range(R):
                for s in range(S):
                    r0, s0 = r * dil[0], s * dil[1]
                    patch = xp[:, g * Cg:(g + 1) * Cg, r0:r0 + (P - 1) * st[0] + 1:st[0],
                               s0:s0 + (Q - 1) * st[1] + 1:st[1]]
                    y[:, g * Kg:(g + 1) * Kg] += np.einsum("ncpq,kc->nkpq", patch,
                                                            w[g * Kg:(g + 1) * Kg, :, r, s])
        return y

    CONVS = {
        "conv_implicit": dict(x=(2, 3, 7, 6), w=(4, 3, 3, 2), pad=(1, 0), st=(2, 1), dil=(1, 1), g=1, flip=0, algo=0),
        "conv_precomp": dict(x=(2, 3, 7, 6), w=(4, 3, 3, 2), pad=(1, 0), st=(2, 1), dil=(1, 1), g=1, flip=0, algo=1),
        "conv_gemm": dict(x=(2, 3, 7, 6), w=(4, 3, 3, 2), pad=(1, 0), st=(2, 1), dil=(1, 1), g=1, flip=0, algo=2),
        "conv_grouped_dilated_flip": dict(x=(2, 4, 9, 8), w=(6, 2, 3, 3), pad=(2, 1), st=(1, 2), dil=(2, 1), g=2,
                                          flip=1, algo=0, alpha=0.5, beta=0.25),
        "conv_grouped_dilated_flip_gemm": dict(x=(2, 4, 9, 8), w=(6, 2, 3, 3), pad=(2, 1), st=(1, 2), dil=(2, 1),
                                               g=2, flip=1, algo=2, alpha=0.5, beta=0.25),
        "conv_nhwc_input": dict(x=(1, 3, 5, 5), w=(2, 3, 3, 3), pad=(1, 1), st=(1, 1), dil=(1, 1), g=1, flip=0,
                                algo=0, nhwc=1),
        "conv_gemm_beta0_ignores_nan": dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), pad=(0, 0), st=(1, 1), dil=(1, 1), g=1,
                                            flip=0, algo=2, nan=1),
    }
    for name, c in CONVS.items():
        x = rng.uniform(-1, 1, c["x"]).astype(f32)
        w = rng.uniform(-1, 1, c["w"]).astype(f32)
        alpha, beta = c.get("alpha", 1.0), c.get("beta", 0.0)
        ref = conv_ref(x, w, c["pad"], c["st"], c["dil"], c["g"], c["flip"])
        y0 = np.full(ref.shape, np.nan, f32) if c.get("nan") else rng.uniform(-1, 1, ref.shape).astype(f32)
        xd = tdesc(c["x"], fmt=c.get("nhwc", 0))
        xdev = dev(x.transpose(0, 2, 3, 1) if c.get("nhwc") else x)
        fd = vp(); ok(dnn.cudnnCreateFilterDescriptor(C.byref(fd)))
        ok(dnn.cudnnSetFilter4dDescriptor(fd, 0, 0, *c["w"]))
        cd = vp(); ok(dnn.cudnnCreateConvolutionDescriptor(C.byref(cd)))
        ok(dnn.cudnnSetConvolution2dDescriptor(cd, *c["pad"], *c["st"], *c["dil"], 0 if c["flip"] else 1, 0))
        ok(dnn.cudnnSetConvolutionGroupCount(cd, c["g"]))
        dims = (C.c_int * 4)()
        ok(dnn.cudnnGetConvolution2dForwardOutputDim(cd, xd, fd, *[C.byref(dims, 4 * i) for i in range(4)]))
        assert tuple(dims) == ref.shape, (name, tuple(dims), ref.shape)
        yd = tdesc(ref.shape)
        ws = C.c_size_t()
        ok(dnn.cudnnGetConvolutionForwardWorkspaceSize(h, xd, fd, cd, yd, c["algo"], C.byref(ws)))
        want_ws = c["x"][1] * c["w"][2] * c["w"][3] * ref.shape[2] * ref.shape[3] * 4 if c["algo"] == 2 else 0
        assert ws.value == want_ws, (name, ws.value, want_ws)
        wsp = vp()
        if ws.value:
            ok(rt.cudaMalloc(C.byref(wsp), ws))
        ydev = dev(y0)
        ok(dnn.cudnnConvolutionForward(h, fp(alpha), xd, xdev, fd, dev(w), cd, c["algo"], wsp, ws,
                                       fp(beta), yd, ydev), name)
        if c["algo"] == 2:
            count("sgpu_cudnn_im2col", c["x"][0]); count("sgpu_cudnn_conv_gemm", c["x"][0])
        else:
            count("sgpu_cudnn_conv_fwd")
        expect = alpha * ref + (beta * y0 if beta else 0.0)
        errs[name] = err(host(ydev, ref.shape), expect)

    # statuses that must come back: unsupported type, unsupported algorithm
    xd, yd = tdesc((1, 2, 5, 5), dtype=2), tdesc((1, 3, 3, 3), dtype=2)      # CUDNN_DATA_HALF
    fd = vp(); ok(dnn.cudnnCreateFilterDescriptor(C.byref(fd))); ok(dnn.cudnnSetFilter4dDescriptor(fd, 2, 0, 3, 2, 3, 3))
    cd = vp(); ok(dnn.cudnnCreateConvolutionDescriptor(C.byref(cd)))
    ok(dnn.cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, 1, 0))
    buf = dev(np.zeros(64, f32))
    statuses["conv_half"] = dnn.cudnnConvolutionForward(h, fp(1), xd, buf, fd, buf, cd, 0, None, C.c_size_t(0),
                                                        fp(0), yd, buf)
    xd, yd = tdesc((1, 2, 5, 5)), tdesc((1, 3, 3, 3))
    ok(dnn.cudnnSetFilter4dDescriptor(fd, 0, 0, 3, 2, 3, 3))
    statuses["conv_fft"] = dnn.cudnnConvolutionForward(h, fp(1), xd, buf, fd, buf, cd, 4, None, C.c_size_t(0),
                                                       fp(0), yd, buf)
    statuses["conv_wrong_output_shape"] = dnn.cudnnConvolutionForward(h, fp(1), xd, buf, fd, buf, cd, 0, None,
                                                                      C.c_size_t(0), fp(0), tdesc((1, 3, 4, 4)), buf)

    # ---- activation ------------------------------------------------------------
    def sigmoid(v):
        return 1 / (1 + np.exp(-v))
    ACTS = {"sigmoid": (0, 0.0, sigmoid), "relu": (1, 0.0, lambda v: np.maximum(v, 0)), "tanh": (2, 0.0, np.tanh),
            "clipped_relu": (3, 0.5, lambda v: np.clip(v, 0, 0.5)),
            "elu": (4, 0.3, lambda v: np.where(v >= 0, v, 0.3 * (np.exp(v) - 1))),
            "identity": (5, 0.0, lambda v: v), "swish": (6, 0.0, lambda v: v * sigmoid(v))}
    x = rng.uniform(-3, 3, (2, 3, 4, 5)).astype(f32)
    xd = tdesc(x.shape)
    for name, (mode, coef, fn) in ACTS.items():
        ad = vp(); ok(dnn.cudnnCreateActivationDescriptor(C.byref(ad)))
        ok(dnn.cudnnSetActivationDescriptor(ad, mode, 0, C.c_double(coef)))
        y0 = rng.uniform(-1, 1, x.shape).astype(f32)
        alpha, beta = (2.0, 0.5) if name == "relu" else (1.0, 0.0)
        ydev = dev(y0)
        ok(dnn.cudnnActivationForward(h, ad, fp(alpha), xd, dev(x), fp(beta), xd, ydev), name)
        count("sgpu_cudnn_activation_fwd")
        errs["act_" + name] = err(host(ydev, x.shape), alpha * fn(x.astype(np.float64)) + beta * y0)
    ok(dnn.cudnnSetActivationDescriptor(ad, 2, 0, C.c_double(0)))
    inplace = dev(x)
    ok(dnn.cudnnActivationForward(h, ad, fp(1), xd, inplace, fp(0), xd, inplace))
    count("sgpu_cudnn_activation_fwd")
    errs["act_tanh_in_place"] = err(host(inplace, x.shape), np.tanh(x.astype(np.float64)))

    # ---- pooling ----------------------------------------------------------------
    def pool_ref(x, mode, win, pad, st):
        N, Cc, H, W = x.shape
        P, Q = (H + 2 * pad[0] - win[0]) // st[0] + 1, (W + 2 * pad[1] - win[1]) // st[1] + 1
        padw = ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2)
        xp = np.pad(x.astype(np.float64), padw, constant_values=-np.inf if mode == 0 else 0.0)
        inside = np.pad(np.ones((H, W)), padw[2:])
        y = np.zeros((N, Cc, P, Q))
        for p in range(P):
            for q in range(Q):
                sl = (slice(p * st[0], p * st[0] + win[0]), slice(q * st[1], q * st[1] + win[1]))
                win_x = xp[:, :, sl[0], sl[1]]
                if mode == 0:
                    y[:, :, p, q] = win_x.max(axis=(2, 3))
                elif mode == 1:
                    y[:, :, p, q] = win_x.sum(axis=(2, 3)) / (win[0] * win[1])
                else:
                    y[:, :, p, q] = win_x.sum(axis=(2, 3)) / inside[sl].sum()
        return y
    POOLS = {"pool_max": (0, (3, 3), (1, 1), (2, 2)), "pool_avg_include_pad": (1, (2, 3), (1, 1), (2, 2)),
             "pool_avg_exclude_pad": (2, (3, 2), (1, 1), (2, 1))}
    x = rng.uniform(-2, 2, (2, 3, 7, 6)).astype(f32)
    xd = tdesc(x.shape)
    for name, (mode, win, pad, st) in POOLS.items():
        pd = vp(); ok(dnn.cudnnCreatePoolingDescriptor(C.byref(pd)))
        ok(dnn.cudnnSetPooling2dDescriptor(pd, mode, 0, *win, *pad, *st))
        ref = pool_ref(x, mode, win, pad, st)
        dims = (C.c_int * 4)()
        ok(dnn.cudnnGetPooling2dForwardOutputDim(pd, xd, *[C.byref(dims, 4 * i) for i in range(4)]))
        assert tuple(dims) == ref.shape, (name, tuple(dims), ref.shape)
        ydev = dev(np.zeros(ref.shape, f32))
        ok(dnn.cudnnPoolingForward(h, pd, fp(1), xd, dev(x), fp(0), tdesc(ref.shape), ydev), name)
        count("sgpu_cudnn_pooling_fwd")
        errs[name] = err(host(ydev, ref.shape), ref)

    # ---- softmax ----------------------------------------------------------------
    def softmax_ref(x, algo, mode):
        axes = (1, 2, 3) if mode == 0 else (1,)
        x = x.astype(np.float64)
        z = x - x.max(axis=axes, keepdims=True)
        if algo == 2:
            return z - np.log(np.exp(z).sum(axis=axes, keepdims=True))
        return np.exp(z) / np.exp(z).sum(axis=axes, keepdims=True)
    x = rng.uniform(-4, 4, (2, 5, 3, 4)).astype(f32)
    xd = tdesc(x.shape)
    for name, algo, mode in (("softmax_instance_accurate", 1, 0), ("softmax_channel_accurate", 1, 1),
                             ("softmax_channel_fast", 0, 1), ("softmax_instance_log", 2, 0),
                             ("softmax_channel_log", 2, 1)):
        ydev = dev(np.zeros(x.shape, f32))
        ok(dnn.cudnnSoftmaxForward(h, algo, mode, fp(1), xd, dev(x), fp(0), xd, ydev), name)
        count("sgpu_cudnn_softmax_fwd")
        errs[name] = err(host(ydev, x.shape), softmax_ref(x, algo, mode))

    # ---- add tensor ----------------------------------------------------------------
    c0 = rng.uniform(-1, 1, (2, 4, 3, 5)).astype(f32)
    cd_ = tdesc(c0.shape)
    for name, shape, alpha, beta in (("add_bias_broadcast", (1, 4, 1, 1), 1.0, 1.0),
                                     ("add_full_scaled", (2, 4, 3, 5), 2.0, 0.5),
                                     ("add_spatial_broadcast", (2, 1, 3, 5), 1.0, 0.0)):
        a = rng.uniform(-1, 1, shape).astype(f32)
        cdev = dev(c0)
        ok(dnn.cudnnAddTensor(h, fp(alpha), tdesc(shape), dev(a), fp(beta), cd_, cdev), name)
        count("sgpu_cudnn_add_tensor")
        errs[name] = err(host(cdev, c0.shape), alpha * np.broadcast_to(a, c0.shape) + beta * c0)
    statuses["add_bad_broadcast"] = dnn.cudnnAddTensor(h, fp(1), tdesc((1, 3, 1, 1)), buf, fp(1), cd_, buf)

    # ---- cuBLAS: column-major, leading dims larger than the rows, junk in the padding ---
    JUNK = 77.0
    def cm(mat, ld):
        """mat (rows x cols) stored column-major with leading dim ld"""
        buf = np.full((mat.shape[1], ld), JUNK, f32)
        buf[:, :mat.shape[0]] = mat.T
        return buf
    def uncm(buf, rows):
        return buf[:, :rows].T
    def gemm_case(name, ta, tb, m, n, k, alpha, beta, call, batch=1, nan_c=False):
        ops = []
        ab, bb, cb, refs = [], [], [], []
        for _ in range(batch):
            A = rng.uniform(-1, 1, (m, k) if ta == 0 else (k, m)).astype(f32)
            B = rng.uniform(-1, 1, (k, n) if tb == 0 else (n, k)).astype(f32)
            C0 = np.full((m, n), np.nan, f32) if nan_c else rng.uniform(-1, 1, (m, n)).astype(f32)
            opA = A if ta == 0 else A.T
            opB = B if tb == 0 else B.T
            refs.append(alpha * opA.astype(np.float64) @ opB + (beta * C0 if beta else 0.0))
            ab.append(A); bb.append(B); cb.append(C0)
        lda, ldb, ldc = ab[0].shape[0] + 2, bb[0].shape[0] + 1, m + 3
        As = np.stack([cm(a, lda) for a in ab]); Bs = np.stack([cm(b, ldb) for b in bb])
        Cs = np.stack([cm(c, ldc) for c in cb])
        Cdev = dev(Cs)
        ok(call(ta, tb, m, n, k, alpha, dev(As), lda, As[0].size, dev(Bs), ldb, Bs[0].size, beta, Cdev, ldc,
                Cs[0].size, batch), name)
        count("sgpu_sgemm")
        out = host(Cdev, Cs.shape)
        assert np.all(out[:, :, m:] == JUNK), name + ": wrote outside the matrix"
        errs[name] = max(err(uncm(out[i], m), refs[i]) for i in range(batch))

    def sgemm(ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, Cp, ldc, sc, batch):
        return blas.cublasSgemm_v2(bh, ta, tb, m, n, k, fp(alpha), A, lda, B, ldb, fp(beta), Cp, ldc)
    def gemmex(ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, Cp, ldc, sc, batch):
        return blas.cublasGemmEx(bh, ta, tb, m, n, k, fp(alpha), A, 0, lda, B, 0, ldb, fp(beta), Cp, 0, ldc,
                                 68, -1)                          # CUDA_R_32F, CUBLAS_COMPUTE_32F, DEFAULT
    def strided(ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, Cp, ldc, sc, batch):
        return blas.cublasSgemmStridedBatched(bh, ta, tb, m, n, k, fp(alpha), A, lda, C.c_longlong(sa), B, ldb,
                                              C.c_longlong(sb), fp(beta), Cp, ldc, C.c_longlong(sc), batch)
    for ta, tb, tag in ((0, 0, "nn"), (0, 1, "nt"), (1, 0, "tn"), (1, 1, "tt")):
        gemm_case("sgemm_" + tag, ta, tb, 5, 4, 3, 1.5, 0.5, sgemm)
    gemm_case("sgemm_beta0_ignores_nan", 0, 0, 6, 3, 7, 1.0, 0.0, sgemm, nan_c=True)
    gemm_case("gemmex_fp32_tn", 1, 0, 4, 6, 5, 0.75, 0.25, gemmex)
    gemm_case("sgemm_strided_batched_nt", 0, 1, 4, 3, 5, 1.0, 2.0, strided, batch=3)

    # device pointer mode: alpha and beta live in device memory
    ok(blas.cublasSetPointerMode_v2(bh, 1))
    dalpha, dbeta = dev(np.array([2.0], f32)), dev(np.array([-1.0], f32))
    def sgemm_dev(ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, Cp, ldc, sc, batch):
        return blas.cublasSgemm_v2(bh, ta, tb, m, n, k, dalpha, A, lda, B, ldb, dbeta, Cp, ldc)
    gemm_case("sgemm_device_scalars", 0, 0, 3, 3, 3, 2.0, -1.0, sgemm_dev)
    ok(blas.cublasSetPointerMode_v2(bh, 0))

    statuses["gemmex_half"] = blas.cublasGemmEx(bh, 0, 0, 2, 2, 2, fp(1), buf, 2, 2, buf, 2, 2, fp(0), buf, 2, 2,
                                                68, -1)           # CUDA_R_16F
    statuses["sgemm_bad_lda"] = blas.cublasSgemm_v2(bh, 0, 0, 4, 2, 2, fp(1), buf, 3, buf, 2, fp(0), buf, 4)

    # the stream a handle was given is the one it reports
    s = vp(); ok(rt.cudaStreamCreate(C.byref(s)))
    got = vp(); ok(dnn.cudnnSetStream(h, s)); ok(dnn.cudnnGetStream(h, C.byref(got)))
    bgot = vp(); ok(blas.cublasSetStream_v2(bh, s)); ok(blas.cublasGetStream_v2(bh, C.byref(bgot)))
    statuses["streams_kept"] = 0 if got.value == s.value == bgot.value else -1
    ok(rt.cudaDeviceSynchronize())
    print(json.dumps({"errs": errs, "statuses": statuses, "kernels": kernels}))
''')


@pytest.fixture(scope="module")
def math_run():
    """One child runs every case; returns its JSON and simgpu's kernel report."""
    tmp = Path(tempfile.mkdtemp(prefix="libtasks-"))
    report = tmp / "report.jsonl"
    try:
        res = subprocess.run([sys.executable, "-c", CHILD, str(paths.SIMGPU_DIR)], capture_output=True,
                             text=True, timeout=120,
                             env=simgpu_env(tmp / "dev", SIMGPU_REPORT=str(report)))
        assert res.returncode == 0, res.stdout + res.stderr
        out = json.loads(res.stdout.strip().splitlines()[-1])
        out["report"] = [json.loads(ln) for ln in report.read_text().splitlines()]
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CASES = ["conv_implicit", "conv_precomp", "conv_gemm", "conv_grouped_dilated_flip",
         "conv_grouped_dilated_flip_gemm", "conv_nhwc_input", "conv_gemm_beta0_ignores_nan",
         *[f"act_{m}" for m in ("sigmoid", "relu", "tanh", "clipped_relu", "elu", "identity", "swish",
                                "tanh_in_place")],
         "pool_max", "pool_avg_include_pad", "pool_avg_exclude_pad",
         "softmax_instance_accurate", "softmax_channel_accurate", "softmax_channel_fast",
         "softmax_instance_log", "softmax_channel_log",
         "add_bias_broadcast", "add_full_scaled", "add_spatial_broadcast",
         "sgemm_nn", "sgemm_nt", "sgemm_tn", "sgemm_tt", "sgemm_beta0_ignores_nan", "gemmex_fp32_tn",
         "sgemm_strided_batched_nt", "sgemm_device_scalars"]


@pytest.mark.parametrize("case", CASES)
def test_math_matches_numpy_reference(math_run, case):
    # float32 accumulation against a float64 reference; a wrong index, tap,
    # transpose or scale factor is off by O(1)
    assert case in math_run["errs"], sorted(math_run["errs"])
    assert math_run["errs"][case] < 2e-5, (case, math_run["errs"][case])


@pytest.mark.parametrize("case,status", [
    ("conv_half", 3000),                 # CUDNN_STATUS_NOT_SUPPORTED
    ("conv_fft", 3000),
    ("conv_wrong_output_shape", 2000),   # CUDNN_STATUS_BAD_PARAM
    ("add_bad_broadcast", 2000),
    ("gemmex_half", 15),                 # CUBLAS_STATUS_NOT_SUPPORTED
    ("sgemm_bad_lda", 7),                # CUBLAS_STATUS_INVALID_VALUE
    ("streams_kept", 0),
])
def test_statuses(math_run, case, status):
    assert math_run["statuses"][case] == status


def test_every_call_ran_as_timed_kernels_with_twins(math_run):
    """Each library call became the expected kernels on simgpu, found their
    twins although the libraries were opened RTLD_LOCAL, and were timed."""
    ran = {r["name"]: r for r in math_run["report"]}
    assert {n: ran.get(n, {}).get("launches") for n in math_run["kernels"]} == math_run["kernels"]
    assert set(ran) == set(math_run["kernels"])
    assert all(r["twin"] is True and r["modelled_us"] > 0 for r in ran.values())


def test_cost_model_scales_with_the_work(tmp_path):
    """The same GEMM grid with 4x the depth k is modelled about 4x longer
    (compute-bound), not charged a flat per-launch cost."""
    script = textwrap.dedent(r'''
        import ctypes as C, sys
        SIM, k = sys.argv[1], int(sys.argv[2])
        rt = C.CDLL(SIM + "/libcudart.so.13", mode=C.RTLD_GLOBAL); blas = C.CDLL(SIM + "/libcublas.so.13")
        vp, m = C.c_void_p, 512
        h = vp(); assert blas.cublasCreate_v2(C.byref(h)) == 0
        bufs = []
        for n in (m * k, k * m, m * m):
            p = vp(); assert rt.cudaMalloc(C.byref(p), C.c_size_t(4 * n)) == 0; bufs.append(p)
            assert rt.cudaMemset(p, 0, C.c_size_t(4 * n)) == 0
        one, zero = C.c_float(1), C.c_float(0)
        assert blas.cublasSgemm_v2(h, 0, 0, m, m, k, C.byref(one), bufs[0], m, bufs[1], k, C.byref(zero),
                                   bufs[2], m) == 0
        assert rt.cudaDeviceSynchronize() == 0
    ''')
    times = {}
    for k in (256, 1024):
        report = tmp_path / f"r{k}.jsonl"
        res = subprocess.run([sys.executable, "-c", script, str(paths.SIMGPU_DIR), str(k)], capture_output=True,
                             text=True, timeout=120,
                             env=simgpu_env(tmp_path / f"dev{k}", SIMGPU_REPORT=str(report),
                                         SIMGPU_MODEL="fluid"))   # the cost function, in closed form
        assert res.returncode == 0, res.stderr
        (row,) = [json.loads(ln) for ln in report.read_text().splitlines()]
        assert row["name"] == "sgpu_sgemm"
        times[k] = row["modelled_us"]
    assert 3.0 < times[1024] / times[256] < 4.5, times


# ---- the hooks: under the shim, results unchanged and launches counted -----------

COLOCATE = [sys.executable, "-m", "controlplane.cli"]


def cli(*args: str, rundir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*COLOCATE, args[0], "--runtime-dir", str(rundir), *args[1:]],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.fixture()
def controller():
    rundir = Path(tempfile.mkdtemp(prefix="cl-lib-", dir="/tmp"))   # short: socket paths
    proc = subprocess.Popen([*COLOCATE, "serve", "--runtime-dir", str(rundir), "--device", "sim",
                             "--pool", "none"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: cli("ping", rundir=rundir).returncode == 0, what="controller")
        yield rundir
    finally:
        stop(proc)
        shutil.rmtree(rundir, ignore_errors=True)


def checksums(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if re.match(r"^\w+ sum=", ln)]


def test_hooks_pass_results_through_and_library_kernels_are_counted(controller, tmp_path):
    native = subprocess.run([str(DNNCHECK), "2"], capture_output=True, text=True, timeout=120,
                            env=simgpu_env(tmp_path / "dev"))
    assert native.returncode == 0 and "PASS dnncheck" in native.stdout, native.stdout + native.stderr
    res = cli("run", "--device", "sim", "--name", "dnn", "--", str(DNNCHECK), "2", rundir=controller)
    assert res.returncode == 0 and "PASS dnncheck" in res.stdout, res.stdout + res.stderr
    assert checksums(res.stdout) == checksums(native.stdout) and len(checksums(res.stdout)) == 7
    want = int(re.search(r"STATS launches=(\d+)", res.stdout).group(1))

    def final():
        apps = json.loads(cli("quotas", "--json", "--all", rundir=controller).stdout)
        recs = [a for a in apps if a["name"] == "dnn" and a["state"] == "exited"]
        return recs and recs[0]
    rec = wait_until(final, what="final record")
    # every kernel the libraries launched went through the shim's launch hook
    assert rec["launches"] == want == 24


def test_hook_without_the_real_library_returns_not_initialized():
    """libcolocate.so loaded into a process that has no cuDNN/cuBLAS: the
    hooks answer NOT_INITIALIZED (and say so once), never crash."""
    script = textwrap.dedent(r'''
        import ctypes as C, sys
        lib = C.CDLL(sys.argv[1])
        st = [lib.cudnnConvolutionForward(*([None] * 9), C.c_size_t(0), None, None, None) for _ in range(3)]
        st.append(lib.cublasSgemm_v2(None, 0, 0, 1, 1, 1, None, None, 1, None, 1, None, None, 1))
        st.append(lib.cudnnSoftmaxForward(None, 0, 0, None, None, None, None, None, None))
        print(st)
    ''')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "SIMGPU_"))}
    env["COLOCATE_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="cl-none-", dir="/tmp")   # no controller there
    res = subprocess.run([sys.executable, "-c", script, str(paths.LIBCOLOCATE)], capture_output=True,
                         text=True, timeout=60, env=env)
    shutil.rmtree(env["COLOCATE_RUNTIME_DIR"], ignore_errors=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[1001, 1001, 1001, 1, 1001]"
    assert res.stderr.count("cudnnConvolutionForward: the real libcudnn.so.9 is not loaded") == 1

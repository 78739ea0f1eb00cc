"""simgpu, the CPU test device: programs built with `nvcc -cudart shared` run
on shim/lib/simgpu/libcudart.so.13, kernels run through their host twins, and
the device model times them (quota, DRAM's limit, sharing between
processes).

The test programs are compiled once per module into a temporary directory
(nvcc takes ~2 s each).  Every test gets its own SIMGPU_DIR, so device
memory and the shared device model never leak between tests.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ensure_simgpu, simgpu_env

ROOT = Path(__file__).resolve().parent.parent
SIMGPU_LIB = ROOT / "shim" / "lib" / "simgpu"
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 13 toolkit) not installed")

# ---------------------------------------------------------------- programs

FUNC_CU = r'''// simgpu functional test program (tests/test_simgpu.py builds it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <unistd.h>
#include <time.h>
#include <atomic>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

struct Params { float a; float *x; float *y; int n; };

__global__ void add_one(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }
__global__ void scale(float *p, float f, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] *= f; }
__global__ void saxpy(Params q) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < q.n) q.y[i] += q.a * q.x[i]; }
__global__ void set_val(float *p, float v, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v; }
__global__ void slow(double flops) { }
__global__ void notwin(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = -1; }
__global__ void empty() { }
__global__ void poke(float *p) { p[0] = 1; }
__device__ float dsym[4] = {1, 2, 3, 4};
__managed__ int mcount = 5;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); exit(1); } } while (0)
#define EXPECT(c) do { if (!(c)) { printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

static int has_twin(const char *name)
{
	int (*f)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "simgpu_kernel_has_twin");
	return f ? f(name) : -2;
}

static int basic(void)
{
	const int n = 1000;
	float h[n], *d, *x;
	for (int i = 0; i < n; i++) h[i] = i;
	CK(cudaMalloc(&d, n * sizeof(float)));
	CK(cudaMalloc(&x, n * sizeof(float)));
	CK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice));
	add_one<<<(n + 255) / 256, 256>>>(d, n);
	scale<<<(n + 255) / 256, 256>>>(d, 2.0f, n);
	CK(cudaGetLastError());
	CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	for (int i = 0; i < n; i++) EXPECT(h[i] == 2.0f * (i + 1));
	/* struct argument: the layout comes from the cubin */
	CK(cudaMemset(x, 0, n * sizeof(float)));
	set_val<<<4, 256>>>(x, 3.0f, n);
	Params q = { 0.5f, x, d, n };
	saxpy<<<4, 256>>>(q);
	CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	for (int i = 0; i < n; i++) EXPECT(h[i] == 2.0f * (i + 1) + 1.5f);
	/* a kernel without a twin is a timed no-op */
	notwin<<<4, 256>>>(d, n);
	CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	EXPECT(h[0] == 3.5f);
	/* __device__ variable: initial value from the cubin, symbol copies */
	float s[4];
	CK(cudaMemcpyFromSymbol(s, dsym, sizeof(s)));
	EXPECT(s[0] == 1 && s[3] == 4);
	s[2] = 30;
	CK(cudaMemcpyToSymbol(dsym, s, sizeof(s)));
	void *sp; CK(cudaGetSymbolAddress(&sp, dsym));
	float t[4]; CK(cudaMemcpy(t, sp, sizeof(t), cudaMemcpyDeviceToHost));
	EXPECT(t[2] == 30);
	/* device queries */
	cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
	int sms, mps, warp, v; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	CK(cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, 0));
	CK(cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, 0));
	EXPECT(sms == p.multiProcessorCount && warp == 32);
	CK(cudaRuntimeGetVersion(&v)); EXPECT(v == 13000);
	CK(cudaDriverGetVersion(&v)); EXPECT(v == 13000);
	size_t fr, tot; CK(cudaMemGetInfo(&fr, &tot)); EXPECT(fr < tot);
	cudaPointerAttributes a; CK(cudaPointerGetAttributes(&a, d)); EXPECT(a.type == cudaMemoryTypeDevice);
	cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, (const void *)add_one)); EXPECT(fa.maxThreadsPerBlock == 1024);
	int (*quota)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "simgpu_quota_pct");
	/* under MPS with a percentage, a coresident grid past the share is refused */
	int cn = n; void *cargs[] = { &d, &cn };
	cudaError_t big = cudaLaunchCooperativeKernel((const void *)add_one, dim3(8 * sms + 1), dim3(256), cargs, 0, 0);
	cudaGetLastError();
	cudaError_t fits = cudaLaunchCooperativeKernel((const void *)add_one, dim3(8 * sms), dim3(256), cargs, 0, 0);
	CK(cudaDeviceSynchronize());
	printf("name=%s sms=%d quota=%d mps=%d coop_past_share=%d coop_share=%d\n", p.name, sms,
	       quota ? quota() : -1, mps, big == cudaErrorCooperativeLaunchTooLarge, fits == cudaSuccess);
	printf("twin add_one=%d notwin=%d unknown=%d\n", has_twin("_Z7add_onePfi"), has_twin("_Z6notwinPfi"), has_twin("_Z7nothingv"));
	CK(cudaFree(d));
	CK(cudaFree(x));
	printf("BASIC PASS\n");
	return 0;
}

static int errors(void)
{
	float *d;
	int x;
	cudaStream_t bogus = (cudaStream_t)&x;
	CK(cudaMalloc(&d, 1024));
	EXPECT(cudaFree((void *)0x1234) == cudaErrorInvalidValue);
	EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
	EXPECT(cudaGetLastError() == cudaSuccess);
	CK(cudaFree(d));
	EXPECT(cudaFree(d) == cudaErrorInvalidValue);            /* double free */
	EXPECT(cudaFreeHost(&x) == cudaErrorInvalidValue);
	EXPECT(cudaMalloc(NULL, 16) == cudaErrorInvalidValue);
	EXPECT(cudaMemcpy(NULL, &x, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
	EXPECT(cudaMemcpy(&x, &x, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); /* not device memory */
	EXPECT(cudaMemcpy(d, &x, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  /* freed */
	EXPECT(cudaMemset(d, 0, 4) == cudaErrorInvalidValue);
	EXPECT(cudaStreamSynchronize(bogus) == cudaErrorInvalidResourceHandle);
	EXPECT(cudaStreamDestroy(bogus) == cudaErrorInvalidResourceHandle);
	EXPECT(cudaEventRecord((cudaEvent_t)&x, 0) == cudaErrorInvalidResourceHandle);
	EXPECT(cudaLaunchKernel((const void *)&x, dim3(1), dim3(1), NULL, 0, 0) == cudaErrorInvalidDeviceFunction);
	add_one<<<1, 2048>>>(d, 1);                                /* too many threads */
	EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
	add_one<<<1, 1, 0, bogus>>>(d, 1);
	EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle);
	cudaEvent_t e1, e2; float ms;
	CK(cudaEventCreate(&e1)); CK(cudaEventCreate(&e2));
	EXPECT(cudaEventElapsedTime(&ms, e1, e2) == cudaErrorInvalidResourceHandle);
	EXPECT(cudaSetDevice(1) == cudaErrorInvalidDevice);
	EXPECT(cudaGraphLaunch(NULL, 0) == cudaErrorInvalidValue);      /* no such graph exec */
	EXPECT(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0);
	EXPECT(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
	void *big; EXPECT(cudaMalloc(&big, (size_t)1 << 50) == cudaErrorMemoryAllocation);
	CK(cudaDeviceSynchronize());
	/* a kernel that touches a bad address: a sticky illegal-address error */
	poke<<<1, 1>>>((float *)0x10);
	EXPECT(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
	EXPECT(cudaMalloc(&big, 16) == cudaSuccess || 1);
	EXPECT(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
	CK(cudaDeviceReset());
	CK(cudaDeviceSynchronize());
	printf("ERRORS PASS\n");
	return 0;
}

static int streams(void)
{
	const int n = 4096;
	float *a, *b, h[n], *pin;
	cudaStream_t s1, s2, nb;
	cudaEvent_t e;
	CK(cudaMalloc(&a, n * sizeof(float)));
	CK(cudaMalloc(&b, n * sizeof(float)));
	CK(cudaStreamCreate(&s1));
	CK(cudaStreamCreate(&s2));
	CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	CK(cudaEventCreate(&e));
	/* pageable async H2D snapshots the source at enqueue */
	for (int i = 0; i < n; i++) h[i] = 1;
	slow<<<1, 512, 0, s1>>>(5e10);                         /* 100 ms: 1 block of 16 warps fills 1 SM */
	CK(cudaMemcpyAsync(a, h, sizeof(h), cudaMemcpyHostToDevice, s1));
	for (int i = 0; i < n; i++) h[i] = 100;              /* must not be seen */
	add_one<<<n / 256, 256, 0, s1>>>(a, n);              /* a = 2 */
	CK(cudaEventRecord(e, s1));
	CK(cudaStreamWaitEvent(s2, e, 0));
	scale<<<n / 256, 256, 0, s2>>>(a, 3.0f, n);          /* a = 6, after the event */
	CK(cudaStreamSynchronize(s2));
	CK(cudaMemcpy(h, a, sizeof(h), cudaMemcpyDeviceToHost));
	EXPECT(h[0] == 6.0f && h[n - 1] == 6.0f);
	/* legacy stream: NULL-stream work waits for blocking streams and vice versa */
	slow<<<1, 512, 0, s1>>>(5e10);
	set_val<<<n / 256, 256, 0, s1>>>(b, 5.0f, n);
	add_one<<<n / 256, 256>>>(b, n);                     /* NULL stream: after set_val */
	scale<<<n / 256, 256, 0, s2>>>(b, 2.0f, n);          /* s2: after the NULL-stream kernel */
	CK(cudaStreamSynchronize(s2));
	CK(cudaMemcpyAsync(h, b, sizeof(h), cudaMemcpyDeviceToHost, s2)); /* pageable: returns when done */
	EXPECT(h[0] == 12.0f && h[n - 1] == 12.0f);
	/* a non-blocking stream does not wait for the NULL stream */
	CK(cudaMallocHost(&pin, sizeof(float)));
	slow<<<1, 512>>>(5e11);                                /* 1 s modelled, on the NULL stream */
	set_val<<<1, 1, 0, nb>>>(b, 7.0f, 1);
	CK(cudaMemcpyAsync(pin, b, sizeof(float), cudaMemcpyDeviceToHost, nb));
	CK(cudaStreamSynchronize(nb));
	EXPECT(*pin == 7.0f);
	EXPECT(cudaStreamQuery(0) == cudaErrorNotReady);     /* the slow kernel still runs */
	CK(cudaDeviceSynchronize());
	CK(cudaStreamQuery(0));
	/* event timing is modelled device time */
	cudaEvent_t t0, t1; float ms;
	CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
	slow<<<1, 512, 0, s1>>>(5e9);                          /* busy stream: host gaps do not count */
	CK(cudaEventRecord(t0, s1));
	slow<<<1, 512, 0, s1>>>(5e10);
	CK(cudaEventRecord(t1, s1));
	CK(cudaEventSynchronize(t1));
	CK(cudaEventElapsedTime(&ms, t0, t1));
	printf("slow ms=%.3f\n", ms);
	CK(cudaStreamDestroy(s1)); CK(cudaStreamDestroy(s2)); CK(cudaStreamDestroy(nb));
	CK(cudaFreeHost(pin));
	printf("STREAMS PASS\n");
	return 0;
}

static int ipc_owner(void)
{
	const int n = 1024;
	float *d, h[n];
	cudaIpcMemHandle_t hd;
	CK(cudaMalloc(&d, n * sizeof(float)));
	set_val<<<n / 256, 256>>>(d, 42.0f, n);
	CK(cudaDeviceSynchronize());
	CK(cudaIpcGetMemHandle(&hd, d));
	printf("PTR %p\nHANDLE ", (void *)d);
	for (size_t i = 0; i < sizeof(hd); i++) printf("%02x", (unsigned char)hd.reserved[i]);
	printf("\n");
	fflush(stdout);
	char line[64];
	if (!fgets(line, sizeof(line), stdin)) return 1;     /* the peer is done */
	CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	printf("OWNER SEES %.1f %.1f\n", h[0], h[n - 1]);
	return 0;
}

static int ipc_peer(const char *hex)
{
	const int n = 1024;
	cudaIpcMemHandle_t hd;
	float *d, h[n];
	for (size_t i = 0; i < sizeof(hd); i++) { unsigned v; sscanf(hex + 2 * i, "%2x", &v); hd.reserved[i] = (char)v; }
	CK(cudaIpcOpenMemHandle((void **)&d, hd, cudaIpcMemLazyEnablePeerAccess));
	printf("PTR %p\n", (void *)d);
	CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	printf("PEER SEES %.1f %.1f\n", h[0], h[n - 1]);
	add_one<<<n / 256, 256>>>(d, n);                      /* a twin writes the owner's memory */
	CK(cudaDeviceSynchronize());
	CK(cudaIpcCloseMemHandle(d));
	return 0;
}

/* a raw pointer of another process, no IPC handle: twins and copies map it */
static int raw_peer(const char *hex)
{
	const int n = 1024;
	float *d = (float *)strtoull(hex, NULL, 16), h[n];
	add_one<<<n / 256, 256>>>(d, n);
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	printf("RAW SEES %.1f %.1f\n", h[0], h[n - 1]);
	return 0;
}

static std::atomic<int> hostfn_calls;
static void hostfn(void *) { hostfn_calls++; }

/* threads on their own streams and a shared one, stream-ordered allocation,
 * host functions, the launch entry points, managed variables, and an exit
 * with work still queued */
static int extra(int iters)
{
	const int n = 256, T = 4;
	EXPECT(mcount == 5);
	mcount = 7;
	float *shared;
	CK(cudaMalloc(&shared, n * sizeof(float)));
	CK(cudaMemset(shared, 0, n * sizeof(float)));
	cudaStream_t ss;
	CK(cudaStreamCreate(&ss));
	std::vector<std::thread> th;
	for (int t = 0; t < T; t++) th.emplace_back([=] {
		cudaStream_t s;
		CK(cudaStreamCreate(&s));
		float *d, h[n];
		CK(cudaMallocAsync((void **)&d, n * sizeof(float), s));
		CK(cudaMemsetAsync(d, 0, n * sizeof(float), s));
		for (int i = 0; i < iters; i++) {
			add_one<<<1, n, 0, s>>>(d, n);
			if (i % 100 == 0) add_one<<<1, n, 0, ss>>>(shared, n);
			if (i % 1000 == 0) CK(cudaLaunchHostFunc(s, hostfn, NULL));
		}
		CK(cudaMemcpyAsync(h, d, sizeof(h), cudaMemcpyDeviceToHost, s));
		for (int i = 0; i < n; i++) EXPECT(h[i] == iters);
		CK(cudaFreeAsync(d, s));
		CK(cudaStreamSynchronize(s));
		CK(cudaStreamDestroy(s));
	});
	for (auto &x : th) x.join();
	float h[n];
	CK(cudaMemcpy(h, shared, sizeof(h), cudaMemcpyDeviceToHost));
	int expect = T * ((iters + 99) / 100);
	EXPECT(h[0] == expect && h[n - 1] == expect);
	EXPECT(hostfn_calls == T * ((iters + 999) / 1000));
	void *args[] = { &shared, (void *)&n };
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = dim3(1);
	cfg.blockDim = dim3(n);
	CK(cudaLaunchKernelExC(&cfg, (const void *)add_one, args));
	CK(cudaLaunchKernel((const void *)add_one, dim3(1), dim3(n), args, 0, 0));
	CK(cudaLaunchCooperativeKernel((const void *)add_one, dim3(1), dim3(n), args, 0, 0));
	cudaKernel_t k;
	CK(cudaGetKernel(&k, (const void *)add_one));
	CK(cudaLaunchKernel((const void *)k, dim3(1), dim3(n), args, 0, 0));
	EXPECT(cudaLaunchCooperativeKernel((const void *)add_one, dim3(100000), dim3(n), args, 0, 0) ==
	       cudaErrorCooperativeLaunchTooLarge);
	EXPECT(cudaGetLastError() == cudaErrorCooperativeLaunchTooLarge);
	CK(cudaMemcpy(h, shared, sizeof(h), cudaMemcpyDeviceToHost));
	EXPECT(h[5] == expect + 4);
	const char *name;
	CK(cudaFuncGetName(&name, (const void *)add_one));
	EXPECT(strcmp(name, "_Z7add_onePfi") == 0);
	/* what a hook ships, and how a worker launches a kernel it only knows by name */
	size_t off, size;
	if (!getenv("SIMGPU_IGNORE_CUBIN")) {                /* else: no layout known */
		CK(cudaFuncGetParamInfo((const void *)add_one, 1, &off, &size));
		EXPECT(off == 8 && size == 4);
	}
	EXPECT(cudaFuncGetParamInfo((const void *)add_one, 2, &off, &size) == cudaErrorInvalidValue);
	cudaGetLastError();
	void *(*by_name)(const char *) = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "simgpu_kernel_by_name");
	EXPECT(by_name && by_name("_Z7add_onePfi") == (void *)k);
	void *remote = by_name("_Z9remote_opPfi");           /* twin only, in func.twins.so */
	EXPECT(remote && has_twin("_Z9remote_opPfi") == 1);
	CK(cudaLaunchKernel(remote, dim3(1), dim3(n), args, 0, 0));
	CK(cudaMemcpy(h, shared, sizeof(h), cudaMemcpyDeviceToHost));
	EXPECT(h[0] == 9.0f && h[n - 1] == 9.0f);
	CK(cudaDeviceSynchronize());
	EXPECT(mcount == 7);
	for (int i = 0; i < 1000; i++)       /* exit with work queued: no hang, no crash */
		add_one<<<1, n>>>(shared, n);
	printf("EXTRA PASS\n");
	return 0;
}

static int rate(int n)
{
	struct timespec a, b;
	empty<<<1, 32>>>();
	CK(cudaDeviceSynchronize());
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++)
		empty<<<1, 32>>>();
	clock_gettime(CLOCK_MONOTONIC, &b);
	CK(cudaDeviceSynchronize());
	double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
	printf("RATE %.0f launches/s\n", n / s);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "basic";
	if (!strcmp(mode, "basic")) return basic();
	if (!strcmp(mode, "errors")) return errors();
	if (!strcmp(mode, "streams")) return streams();
	if (!strcmp(mode, "ipc_owner")) return ipc_owner();
	if (!strcmp(mode, "ipc_peer") && argc > 2) return ipc_peer(argv[2]);
	if (!strcmp(mode, "raw_peer") && argc > 2) return raw_peer(argv[2]);
	if (!strcmp(mode, "extra")) return extra(argc > 2 ? atoi(argv[2]) : 2000);
	if (!strcmp(mode, "rate")) return rate(argc > 2 ? atoi(argv[2]) : 200000);
	printf("unknown mode\n");
	return 2;
}
'''

FUNC_TWINS = r'''/* Host twins of func.cu's kernels (notwin and empty have none on purpose). */
#include "simgpu_twin.h"

struct Params { float a; float *x; float *y; int n; };

#define IDX(l, bx, tx) ((bx) * (l)->block.x + (tx))

void simgpu_twin__Z7add_onePfi(const simgpu_launch *l)
{
	float *p = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		unsigned i = IDX(l, bx, tx);
		if (i < (unsigned)n) p[i] += 1;
	}
}

void simgpu_twin__Z5scalePffi(const simgpu_launch *l)
{
	float *p = SIMGPU_ARG(l, 0, float *);
	float f = SIMGPU_ARG(l, 1, float);
	int n = SIMGPU_ARG(l, 2, int);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		unsigned i = IDX(l, bx, tx);
		if (i < (unsigned)n) p[i] *= f;
	}
}

void simgpu_twin__Z7set_valPffi(const simgpu_launch *l)
{
	float *p = SIMGPU_ARG(l, 0, float *);
	float v = SIMGPU_ARG(l, 1, float);
	int n = SIMGPU_ARG(l, 2, int);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		unsigned i = IDX(l, bx, tx);
		if (i < (unsigned)n) p[i] = v;
	}
}

void simgpu_twin__Z5saxpy6Params(const simgpu_launch *l)
{
	struct Params q = SIMGPU_ARG(l, 0, struct Params);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		unsigned i = IDX(l, bx, tx);
		if (i < (unsigned)q.n) q.y[i] += q.a * q.x[i];
	}
}

void simgpu_twin__Z4pokePf(const simgpu_launch *l)
{
	SIMGPU_ARG(l, 0, float *)[0] = 1;
}

/* slow(double flops): does nothing, costs what it is told */
void simgpu_twin__Z4slowd(const simgpu_launch *l) { (void)l; }
void simgpu_cost__Z4slowd(const simgpu_launch *l, double *flops, double *bytes)
{
	*flops = SIMGPU_ARG(l, 0, double);
	*bytes = 0;
}

/* a kernel this program does not contain: launched by name, as a worker would */
void simgpu_twin__Z9remote_opPfi(const simgpu_launch *l)
{
	float *p = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		unsigned i = IDX(l, bx, tx);
		if (i < (unsigned)n) p[i] = 9;
	}
}
'''

MODEL_CU = r'''// simgpu device-model test program: back-to-back kernels of a given cost,
// each bracketed by events; prints the median modelled ms per kernel.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <time.h>
#include <vector>
#include <cuda_runtime.h>

__global__ void compute_k(double flops) { }
__global__ void memory_k(double bytes) { }

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s -> %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)

int main(int argc, char **argv)
{
	if (argc < 5) { printf("usage: model compute|memory work reps blocks [start_at]\n"); return 2; }
	int mem = !strcmp(argv[1], "memory");
	double work = atof(argv[2]);
	int reps = atoi(argv[3]), blocks = atoi(argv[4]);
	std::vector<cudaEvent_t> ev(reps + 1);
	for (auto &e : ev) CK(cudaEventCreate(&e));
	compute_k<<<1, 1>>>(0);                      /* warm up: executor, twins */
	CK(cudaDeviceSynchronize());
	if (argc > 5) {                              /* start together with another process */
		double at = atof(argv[5]);
		struct timespec ts;
		for (;;) {
			clock_gettime(CLOCK_REALTIME, &ts);
			double now = ts.tv_sec + ts.tv_nsec * 1e-9;
			if (now >= at) break;
			struct timespec d = { 0, (long)((at - now) * 1e9) };
			nanosleep(&d, NULL);
		}
	}
	for (int i = 0; i < reps; i++) {
		CK(cudaEventRecord(ev[i], 0));
		if (mem) memory_k<<<blocks, 256>>>(work);
		else compute_k<<<blocks, 256>>>(work);
	}
	CK(cudaEventRecord(ev[reps], 0));
	CK(cudaEventSynchronize(ev[reps]));
	std::vector<float> ms(reps);
	for (int i = 0; i < reps; i++) CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
	float total; CK(cudaEventElapsedTime(&total, ev[0], ev[reps]));
	std::sort(ms.begin(), ms.end());
	printf("MEDIAN_MS %.4f TOTAL_MS %.4f MIN_MS %.4f MAX_MS %.4f\n", ms[reps / 2], total, ms[0], ms[reps - 1]);
	return 0;
}
'''

MODEL_TWINS = r'''#include "simgpu_twin.h"
void simgpu_twin__Z9compute_kd(const simgpu_launch *l) { (void)l; }
void simgpu_cost__Z9compute_kd(const simgpu_launch *l, double *flops, double *bytes)
{ *flops = SIMGPU_ARG(l, 0, double); *bytes = 0; }
void simgpu_twin__Z8memory_kd(const simgpu_launch *l) { (void)l; }
void simgpu_cost__Z8memory_kd(const simgpu_launch *l, double *flops, double *bytes)
{ *flops = 0; *bytes = SIMGPU_ARG(l, 0, double); }
'''

# ---------------------------------------------------------------- fixtures


class Progs:
    def __init__(self, d: Path):
        self.dir = d
        self.func = d / "func"           # legacy default stream
        self.funcp = d / "funcp"         # --default-stream per-thread
        self.model = d / "model"


def sim_env(simdir: str, **extra: object) -> dict[str, str]:
    """simgpu_env with a little modelled time (0.05) unless extra says."""
    return simgpu_env(simdir, **{"SIMGPU_TIMESCALE": 0.05, **extra})


@pytest.fixture(scope="module")
def progs(tmp_path_factory) -> Progs:
    ensure_simgpu()
    d = tmp_path_factory.mktemp("simgpu-progs")
    (d / "func.cu").write_text(FUNC_CU)
    (d / "func_twins.c").write_text(FUNC_TWINS)
    (d / "model.cu").write_text(MODEL_CU)
    (d / "model_twins.c").write_text(MODEL_TWINS)
    inc = str(ROOT / "shim" / "simgpu")
    jobs = [
        [NVCC, "-cudart", "shared", "-o", "func", "func.cu"],
        [NVCC, "-cudart", "shared", "--default-stream", "per-thread", "-o", "funcp", "func.cu"],
        [NVCC, "-cudart", "shared", "-o", "model", "model.cu"],
        ["cc", "-O2", "-shared", "-fPIC", "-Wall", "-I", inc, "-o", "func.twins.so", "func_twins.c"],
        ["cc", "-O2", "-shared", "-fPIC", "-Wall", "-I", inc, "-o", "model.twins.so", "model_twins.c"],
    ]
    running = [(cmd, subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
               for cmd in jobs]
    for cmd, p in running:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{out}"
    # "<exe>.twins.so" next to the executable is where simgpu looks
    shutil.copy(d / "func.twins.so", d / "funcp.twins.so")
    return Progs(d)


def run(prog: Path, *args, env: dict[str, str], timeout: float = 30) -> str:
    r = subprocess.run([str(prog), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{prog.name} {args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def median_ms(out: str) -> float:
    m = re.search(r"MEDIAN_MS ([0-9.]+)", out)
    assert m, out
    return float(m.group(1))


# 1056 blocks of 256 threads fill all 132 SMs (8 blocks per SM)
FULL_GRID = 1056
COMPUTE_2MS = 132 * 500e9 * 2e-3    # flops: 2 ms on the whole default device
MEMORY_2MS = 3350e9 * 2e-3          # bytes: 2 ms at full device bandwidth


def model_run(progs: Progs, simdir: str, kind: str, quota: int = 100, reps: int = 20,
              timescale: float = 0.05, start_at: float | None = None) -> subprocess.Popen:
    work = COMPUTE_2MS if kind == "compute" else MEMORY_2MS
    env = sim_env(simdir, SIMGPU_TIMESCALE=timescale, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=quota)
    args = [str(progs.model), kind, repr(work), str(reps), str(FULL_GRID)]
    if start_at is not None:
        args.append(repr(start_at))
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def model_ms(progs: Progs, simdir: str, kind: str, quota: int = 100, **kw) -> float:
    p = model_run(progs, simdir, kind, quota, **kw)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    return median_ms(out)


# ---------------------------------------------------------------- functional

def test_twins_compute_results(progs, simdir):
    out = run(progs.func, "basic", env=sim_env(simdir))
    assert "BASIC PASS" in out
    # add_one has a twin, notwin has none, an unknown name is unknown
    assert "twin add_one=1 notwin=0 unknown=-1" in out
    assert "sms=132 quota=100 mps=1 coop_past_share=1 coop_share=1" in out


def test_device_reports_an_mps_clients_share_as_the_gpus_did(progs, simdir):
    """Under an MPS percentage the SM-count attribute (and the properties)
    is the client's share, whole TPCs: the H100 and H200 calibration runs
    read 52 at 40 % and 12 at 10 % (tests/test_devmodel.py checks every
    count); cudaDevAttrMpsEnabled is 1 under MPS and 0 without.  A
    cooperative grid must fit the share."""
    for pct, sms in (("40", 52), ("10", 12)):
        out = run(progs.func, "basic", env=sim_env(simdir, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=pct))
        assert f"sms={sms} quota={pct} mps=1 coop_past_share=1 coop_share=1" in out, out
    out = run(progs.func, "basic", env=sim_env(simdir, SIMGPU_MPS="0"))
    assert "sms=132 quota=100 mps=0" in out, out


def test_per_thread_default_stream_build(progs, simdir):
    imports = subprocess.run(["nm", "-D", "--undefined-only", str(progs.funcp)],
                             capture_output=True, text=True).stdout
    assert "__cudaLaunchKernel_ptsz" in imports
    env = sim_env(simdir)
    assert "BASIC PASS" in run(progs.funcp, "basic", env=env)
    assert "ERRORS PASS" in run(progs.funcp, "errors", env=env)


def test_report_lists_kernels_and_twins(progs, simdir, tmp_path):
    report = tmp_path / "report.jsonl"
    run(progs.func, "basic", env=sim_env(simdir, SIMGPU_REPORT=report))
    rows = {r["name"]: r for r in map(json.loads, report.read_text().splitlines())}
    assert rows["_Z7add_onePfi"]["twin"] is True
    assert rows["_Z6notwinPfi"]["twin"] is False
    assert rows["_Z6notwinPfi"]["launches"] == 1
    assert all(r["modelled_us"] > 0 and r["pid"] > 0 for r in rows.values())
    assert "_Z5emptyv" not in rows          # never launched


def test_errors_are_returned_not_crashes(progs, simdir):
    # bad frees, freed and foreign pointers, bogus handles, unknown kernels,
    # bad launch configurations, a faulting twin (sticky illegal address)
    assert "ERRORS PASS" in run(progs.func, "errors", env=sim_env(simdir))


def test_streams_events_and_legacy_ordering(progs, simdir):
    out = run(progs.func, "streams", env=sim_env(simdir))
    assert "STREAMS PASS" in out
    # slow(5e10 flops) on 1 block of 16 warps = 1 SM at 500 GFLOP/s: 100 ms + 3 us,
    # reported as modelled device time (the wall time was 20x shorter)
    ms = float(re.search(r"slow ms=([0-9.]+)", out).group(1))
    assert ms == pytest.approx(100.003, rel=0.001)


def test_threads_streams_and_launch_variants(progs, simdir):
    # 4 threads on their own streams plus a shared one, cudaMallocAsync,
    # host functions, cudaLaunchKernelExC / cooperative / cudaKernel_t,
    # __managed__ variables, cudaFuncGetParamInfo, simgpu_kernel_by_name (a
    # kernel known only by name and twin), and an exit with 1000 kernels queued
    out = run(progs.func, "extra", 3000, env=sim_env(simdir, SIMGPU_TIMESCALE=0.01))
    assert "EXTRA PASS" in out


def test_unknown_parameter_layout_lends_arguments(progs, simdir):
    # without the cubin's layout a launch waits until the twin has read its
    # arguments; results must be the same
    env = sim_env(simdir, SIMGPU_IGNORE_CUBIN=1)
    assert "BASIC PASS" in run(progs.func, "basic", env=env)
    assert "EXTRA PASS" in run(progs.func, "extra", 500, env=env)


def test_synchronous_debug_mode(progs, simdir):
    # SIMGPU_SYNC=1: no executor threads, every operation runs when enqueued
    env = sim_env(simdir, SIMGPU_SYNC=1, SIMGPU_TIMESCALE=0.01)
    assert "BASIC PASS" in run(progs.func, "basic", env=env)
    assert "ERRORS PASS" in run(progs.func, "errors", env=env)
    assert "EXTRA PASS" in run(progs.func, "extra", 500, env=env)


# ---------------------------------------------------------------- shared memory

def _start_owner(progs: Progs, env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    owner = subprocess.Popen([str(progs.func), "ipc_owner"], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ptr = owner.stdout.readline().split()
    handle = owner.stdout.readline().split()
    assert ptr and ptr[0] == "PTR" and handle and handle[0] == "HANDLE", owner.stderr.read()
    return owner, ptr[1], handle[1]


def _finish_owner(owner: subprocess.Popen) -> str:
    out, err = owner.communicate("done\n", timeout=30)
    assert owner.returncode == 0, out + err
    return out


def test_ipc_handle_same_address_in_peer(progs, simdir):
    env = sim_env(simdir)
    owner, ptr, handle = _start_owner(progs, env)
    try:
        out = run(progs.func, "ipc_peer", handle, env=env)
    finally:
        owner_out = _finish_owner(owner)
    assert f"PTR {ptr}" in out                 # the very same device address
    assert "PEER SEES 42.0 42.0" in out        # the owner's data
    assert "OWNER SEES 43.0 43.0" in owner_out  # and the peer's twin wrote it


def test_raw_device_pointer_of_another_process(progs, simdir):
    # no IPC handle: a worker just dereferences the app's pointer
    env = sim_env(simdir)
    owner, ptr, _ = _start_owner(progs, env)
    try:
        out = run(progs.func, "raw_peer", ptr, env=env)
    finally:
        owner_out = _finish_owner(owner)
    assert "RAW SEES 43.0 43.0" in out
    assert "OWNER SEES 43.0 43.0" in owner_out


def test_dead_process_arena_is_reclaimed(progs, simdir):
    env = sim_env(simdir)
    owner, _, _ = _start_owner(progs, env)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdin.close()
    owner.stdout.close()
    owner.stderr.close()
    assert list(Path(simdir).glob("arena-*")), "a killed owner leaves its arena behind"
    run(progs.func, "basic", env=env)          # claims a slot: reclaims the dead one
    assert not list(Path(simdir).glob("arena-*"))


# ---------------------------------------------------------------- device model

@pytest.mark.serial      # modelled or wall time that other tests' load would move
def test_compute_bound_scales_with_quota(progs, simdir):
    full = model_ms(progs, simdir, "compute", 100)
    half = model_ms(progs, simdir, "compute", 50)
    assert full == pytest.approx(2.0, rel=0.05)
    assert half / full == pytest.approx(2.0, rel=0.2)


def dram_gbs(sms: int) -> float:
    """What a memory-bound kernel on `sms` SMs gets of simgpu's default DRAM
    (simgpu_model.h, bwq): the SMs' pull, 101.3 GB/s each, against DRAM's
    limit, 3350 / 1.179 GB/s, as a soft minimum (k = 2.32)."""
    pull = 101.3 * sms
    return pull / (1 + (pull * 1.179 / 3350) ** 2.32) ** (1 / 2.32)


@pytest.mark.serial      # modelled or wall time that other tests' load would move
def test_memory_bound_saturates_dram_smoothly(progs, simdir):
    # 10, 25, 50 and 100 % are 12, 32, 66 and 132 SMs (whole TPCs)
    t = {q: model_ms(progs, simdir, "memory", q) for q in (10, 25, 50, 100)}
    for q, sms in ((10, 12), (25, 32), (50, 66), (100, 132)):
        assert t[q] == pytest.approx(MEMORY_2MS / dram_gbs(sms) / 1e6, rel=0.03), (q, t)
    # more SMs help less and less, as on an H100 (1.72x, 1.20x, 1.04x from
    # 12 to 26 to 38 to 66 SMs): no knee
    assert t[10] / t[25] > 1.8 and 1.1 < t[25] / t[50] < 1.3 and 1.02 < t[50] / t[100] < 1.08, t


def _together(progs: Progs, simdir: str, kind: str, quota: int) -> list[float]:
    at = time.time() + 0.6       # both start their loops at the same moment
    ps = [model_run(progs, simdir, kind, quota, reps=100, timescale=0.25, start_at=at) for _ in range(2)]
    res = []
    for p in ps:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, out + err
        res.append(median_ms(out))
    return res


@pytest.mark.serial      # modelled or wall time that other tests' load would move
def test_concurrent_memory_bound_processes_slow_each_other(progs, simdir):
    solo = model_ms(progs, simdir, "memory", 100, reps=100, timescale=0.25)
    both = _together(progs, simdir, "memory", 100)
    assert solo == pytest.approx(MEMORY_2MS / dram_gbs(132) / 1e6, rel=0.03)     # 2.39 ms
    # two kernels that each want the whole memory bandwidth: about 2x each
    assert min(both) > 1.5 * solo, (solo, both)


@pytest.mark.serial      # modelled or wall time that other tests' load would move
def test_mps_quota_is_a_cap_not_a_reservation(progs, simdir):
    # two compute-bound halves fit side by side: no slowdown ...
    halves = _together(progs, simdir, "compute", 50)
    assert max(halves) == pytest.approx(4.0, rel=0.1)
    # ... two full-quota kernels share the SMs: each takes twice as long
    fulls = _together(progs, simdir, "compute", 100)
    assert min(fulls) > 1.5 * 2.0, fulls


DEFINE_PY = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
define = lib.simgpu_kernel_define_layout
define.restype = ctypes.c_void_p
define.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)]
nat = lib.simgpu_kernel_define
nat.restype = ctypes.c_void_p
nat.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]
U = lambda *v: (ctypes.c_uint * len(v))(*v)
a = define(b"_Z1kPfi", 2, U(0, 8), U(8, 4))
print("first", bool(a))
print("same", define(b"_Z1kPfi", 2, U(0, 8), U(8, 4)) == a)
print("other", define(b"_Z1kPfi", 2, U(0, 8), U(8, 8)))
print("overlap", define(b"_Z2k2v", 2, U(0, 4), U(8, 4)))
print("natural", nat(b"_Z1kPfi", 2, U(8, 4)) == a)
print("natural_mismatch", nat(b"_Z1kPfi", 2, U(4, 8)))
"""


def test_kernel_define_layout_is_kept_and_conflicts_refused(simdir):
    """The worker's by-name kernels get a layout (launches copy their
    arguments): a second definition must agree, or be refused (NULL)."""
    ensure_simgpu()
    r = subprocess.run([sys.executable, "-c", DEFINE_PY, str(SIMGPU_LIB / "libcudart.so.13")],
                       env=sim_env(simdir), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    got = dict(ln.split(" ", 1) for ln in r.stdout.splitlines())
    assert got == {"first": "True", "same": "True", "other": "None", "overlap": "None",
                   "natural": "True", "natural_mismatch": "None"}, r.stdout


def test_launch_log_has_one_line_per_kernel_with_its_work(simdir, tmp_path):
    """SIMGPU_LAUNCH_LOG: what the model knew of each kernel (for profilers)."""
    log = tmp_path / "launches.jsonl"
    hot = ROOT / "bench" / "bin" / "hotspot"
    if not hot.exists():
        pytest.skip("bench programs not built")
    out = run(hot, "--size", "64", "--iters", "6", "--pyramid", "1",
              env=sim_env(simdir, SIMGPU_TIMESCALE="0", SIMGPU_LAUNCH_LOG=str(log),
                             CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="30"))
    assert "STATS launches=6" in out
    recs = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [r["seq"] for r in recs] == list(range(1, 7))
    for r in recs:
        assert r["name"] == "_Z12hotspot_stepPKfS0_Pfiifffff" and r["quota"] == 30
        assert r["grid"] == [4, 4, 1] and r["block"] == [16, 16, 1]
        # hotspot's cost function: 14 flops per cell, 18x18 tile + 2 floats per cell
        assert r["flops"] == 64 * 64 * 14 and r["bytes"] == 16 * 18 * 18 * 4 + 64 * 64 * 8
        assert r["dur_us"] > 0 and 0 < r["sms"] <= 132 * 0.3


def test_a_twin_reads_its_kernels_start_on_the_device_clock(simdir, tmp_path):
    """simgpu_globaltimer (the twin's %globaltimer) is the kernel's modelled
    start: at SIMGPU_TIMESCALE=1 its readings differ by exactly what the
    launch log's start_us do, and each lies between its launch call and the
    host seeing it done, however late the stream thread ran the twin; at 0
    it is the host's clock when the twin ran; outside a twin it is 0."""
    probe = ROOT / "bench" / "bin" / "fwdprobe"
    if not probe.exists():
        pytest.skip("bench programs not built")
    log = tmp_path / "launches.jsonl"
    out = run(probe, "--n", "300", "--interval-us", "200", "--dump",
              env=sim_env(simdir, SIMGPU_TIMESCALE="1", SIMGPU_LAUNCH_LOG=str(log), SIMGPU_LAUNCH_US="50"))
    recs = [tuple(map(int, ln.split()[1:5])) for ln in out.splitlines() if ln.startswith("I ")]
    rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    assert len(recs) == len(rows) == 300
    g0, s0 = recs[0][3], rows[0]["start_us"]
    for (_i, t_launch, t_done, g), row in zip(recs, rows):
        assert abs((g - g0) - (row["start_us"] - s0) * 1e3) <= 2, (g - g0, row["start_us"] - s0)
        # 50 us of modelled launch latency after the call, before the sync saw it
        assert t_launch + 50_000 <= g <= t_done
    out = run(probe, "--n", "50", "--dump", env=sim_env(simdir, SIMGPU_TIMESCALE="0"))
    recs = [tuple(map(int, ln.split()[1:5])) for ln in out.splitlines() if ln.startswith("I ")]
    assert len(recs) == 50 and all(t_launch <= g <= t_done for _i, t_launch, t_done, g in recs)
    code = ("import ctypes; rt = ctypes.CDLL('libcudart.so.13'); "
            "rt.simgpu_globaltimer.restype = ctypes.c_ulonglong; print(rt.simgpu_globaltimer())")
    r = subprocess.run([sys.executable, "-c", code], env=sim_env(simdir), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr

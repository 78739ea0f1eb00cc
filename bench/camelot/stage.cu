// libcamelot-stage.so: the device work of Camelot's artifact stages
// (§III-B): c1-c3 compute-intensive (multiply-add loops), m1-m3
// memory-intensive (a workspace streamed out and back in), p1-p3
// PCIe-intensive (a host-to-device copy per query, then a light kernel).
// bench/camelot/stage_worker.py loads it with ctypes and sizes every call
// from bench/camelot/suite.py (ARTIFACT), so these are the simulator's stages.
//
// Layout: a batch of B queries is B consecutive slices of floats, query q's
// input at in + q * in_n, its output at out + q * out_n.  Every output
// element depends only on its own query's input, so a query's result does
// not depend on how queries were batched.  Arithmetic is explicitly rounded
// (__fmul_rn / __fadd_rn: no contraction into FMA), in a fixed order, so the
// host twins (stage_twins.c) and a GPU give the same bits.
//
// Plain CUDA, built with nvcc -shared -cudart shared: on simgpu,
// LD_LIBRARY_PATH resolves libcudart.so.13 to simgpu's and the twins come
// from $SIMGPU_TWINS (this is a library, not the executable).
#include <cuda_runtime.h>
#include <stddef.h>

#define CAMELOT_STAGE_ABI 1
#define THREADS 256
#define MAX_BLOCKS 16384           // grid-stride loops beyond this

// the multiply-add chain of the compute stages: v <- v * A + B (converges to 0.5)
#define FMA_A 0.999f
#define FMA_B 0.0005f

static unsigned blocks_for(long long total)
{
	long long b = (total + THREADS - 1) / THREADS;
	return (unsigned)(b < 1 ? 1 : (b > MAX_BLOCKS ? MAX_BLOCKS : b));
}

// c_i: out = x + chain(x, iters), x the query's input element
extern "C" __global__ void camelot_fma(const float *in, long long in_n, float *out, long long out_n,
				       int batch, int iters)
{
	long long total = (long long)batch * out_n;
	for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
	     t += (long long)gridDim.x * blockDim.x) {
		long long q = t / out_n, j = t % out_n;
		float x = in[q * in_n + j % in_n], v = x;
		for (int k = 0; k < iters; k++)
			v = __fadd_rn(__fmul_rn(v, FMA_A), FMA_B);
		out[t] = __fadd_rn(v, x);
	}
}

// m_i, first half: stream the input out into a workspace of ws_n floats per query
extern "C" __global__ void camelot_fill(const float *in, long long in_n, float *ws, long long ws_n, int batch)
{
	long long total = (long long)batch * ws_n;
	for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
	     t += (long long)gridDim.x * blockDim.x) {
		long long q = t / ws_n, i = t % ws_n;
		ws[t] = __fadd_rn(__fmul_rn(in[q * in_n + i % in_n], 0.5f), (float)(i & 1023) * (1.0f / 1024));
	}
}

// m_i second half, and p_i's light kernel: out[j] = x + aux[j % aux_n] / 8 +
// the sum of aux[j + k * out_n] / 8, k >= 1, in order: every aux element read once
extern "C" __global__ void camelot_scan(const float *in, long long in_n, const float *aux, long long aux_n,
					float *out, long long out_n, int batch)
{
	long long total = (long long)batch * out_n;
	for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
	     t += (long long)gridDim.x * blockDim.x) {
		long long q = t / out_n, j = t % out_n;
		const float *a = aux + q * aux_n;
		float acc = __fadd_rn(in[q * in_n + j % in_n], __fmul_rn(a[j % aux_n], 0.125f));
		for (long long i = j + out_n; i < aux_n; i += out_n)
			acc = __fadd_rn(acc, __fmul_rn(a[i], 0.125f));
		out[t] = acc;
	}
}

// --- host API (ctypes): 0 or a cudaError_t ----------------------------------
// A launch's status is cudaGetLastError() after it, so each run_* clears
// the error a call made elsewhere in the process may have left behind
// (shim.handoff's first allocation leaves cudaErrorSymbolNotFound on simgpu).

extern "C" int camelot_stage_abi(void)
{
	return CAMELOT_STAGE_ABI;
}

extern "C" const char *camelot_strerror(int code)
{
	return cudaGetErrorString((cudaError_t)code);
}

extern "C" int camelot_malloc(void **p, size_t n)
{
	return (int)cudaMalloc(p, n);
}

extern "C" int camelot_free(void *p)
{
	return (int)cudaFree(p);
}

extern "C" int camelot_h2d(void *dst, const void *src, size_t n)
{
	return (int)cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
}

extern "C" int camelot_d2h(void *dst, const void *src, size_t n)
{
	return (int)cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
}

extern "C" int camelot_sync(void)
{
	return (int)cudaDeviceSynchronize();
}

extern "C" int camelot_run_fma(const float *in, long long in_n, float *out, long long out_n, int batch, int iters)
{
	(void)cudaGetLastError();
	camelot_fma<<<blocks_for(batch * out_n), THREADS>>>(in, in_n, out, out_n, batch, iters);
	return (int)cudaGetLastError();
}

extern "C" int camelot_run_stream(const float *in, long long in_n, float *ws, long long ws_n, float *out,
				  long long out_n, int batch)
{
	(void)cudaGetLastError();
	camelot_fill<<<blocks_for(batch * ws_n), THREADS>>>(in, in_n, ws, ws_n, batch);
	int rc = (int)cudaGetLastError();
	if (rc)
		return rc;
	camelot_scan<<<blocks_for(batch * out_n), THREADS>>>(in, in_n, ws, ws_n, out, out_n, batch);
	return (int)cudaGetLastError();
}

// the PCIe stage: copy batch * aux_n floats host-to-device, then scan them
extern "C" int camelot_run_pcie(const float *in, long long in_n, float *aux_dev, const float *aux_host,
				long long aux_n, float *out, long long out_n, int batch)
{
	(void)cudaGetLastError();
	int rc = (int)cudaMemcpy(aux_dev, aux_host, (size_t)batch * aux_n * sizeof(float), cudaMemcpyHostToDevice);
	if (rc)
		return rc;
	camelot_scan<<<blocks_for(batch * out_n), THREADS>>>(in, in_n, aux_dev, aux_n, out, out_n, batch);
	return (int)cudaGetLastError();
}

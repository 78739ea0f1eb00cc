// graphs: stream capture and CUDA graphs, checked on the host.
//
//   graphs [--n N] [--launches L]
//
// 1. Captures on a stream s, with a fork into a second stream s2 and a join
//    back through events (the pattern of NVIDIA's samples):
//        s : H2D copy x -> inc(acc += x) ---------------+-> combine -> D2H out
//        s2:                 \-> count(cnt += 1) ------/
//    three kernels and two async copies (the records and waits are edges,
//    not nodes), instantiates it and launches it L times.  Afterwards
//    acc = L*x, cnt = L and out = acc*K + cnt, checked exactly (ints).
// 2. Builds a small graph by hand (cudaGraphAdd*Node): memset m, then
//    addto(m += x) and bump(c += 1) side by side, an empty join node, a
//    D2H copy of m (its last edge added with cudaGraphAddDependencies);
//    launched 3 times: m = x, c = 3.
// 3. Calls that are illegal during a capture, and the errors CUDA gives:
//    beginning a capture on the legacy stream, synchronising a capturing
//    stream (then its end reports the capture invalidated), work on the
//    legacy stream while a blocking stream captures; and what is legal: a
//    synchronous cudaMemcpy D2H into pinned memory in global mode, and into
//    pageable memory (on an H200 and an H100, CUDA 13.0: cudaSuccess, the
//    capture stays valid; simgpu once called both illegal), the same once
//    the thread is relaxed.
// One kernel is launched directly (iota), once.
//
// Prints one JSON line and `PASS graphs ...` (exit 0), or `FAIL graphs
// <reason>` (exit 1).  Plain CUDA: runs on a real GPU and on simgpu.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "graphs";

#include "progutil.h"

#define K 3

__global__ void iota(int *v, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		v[i] = i % 97 - 40;
}

__global__ void inc(int *acc, const int *x, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		acc[i] += x[i];
}

__global__ void count(int *cnt, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		cnt[i] += 1;
}

__global__ void combine(int *out, const int *acc, const int *cnt, int k, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		out[i] = acc[i] * k + cnt[i];
}

__global__ void addto(int *m, const int *x, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		m[i] += x[i];
}

__global__ void bump(int *c, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		c[i] += 1;
}

static size_t node_count(cudaGraph_t g)
{
	size_t n = 0;
	CK(cudaGraphGetNodes(g, NULL, &n));
	return n;
}

int main(int argc, char **argv)
{
	long long n = 1 << 16, launches = 100;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--n"))
			n = arg_int(argc, argv, &i, 1, 1 << 26);
		else if (!strcmp(argv[i], "--launches"))
			launches = arg_int(argc, argv, &i, 1, 1 << 20);
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: graphs [--n N] [--launches L]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	int ni = (int)n;
	size_t bytes = (size_t)n * sizeof(int);
	unsigned block = 256, grid = (unsigned)((n + block - 1) / block);

	int *hx, *hout, *hm;
	CK(cudaMallocHost((void **)&hx, bytes));
	CK(cudaMallocHost((void **)&hout, bytes));
	CK(cudaMallocHost((void **)&hm, bytes));
	int *dx, *acc, *cnt, *out, *m, *c, *scratch;
	CK(cudaMalloc((void **)&dx, bytes));
	CK(cudaMalloc((void **)&acc, bytes));
	CK(cudaMalloc((void **)&cnt, bytes));
	CK(cudaMalloc((void **)&out, bytes));
	CK(cudaMalloc((void **)&m, bytes));
	CK(cudaMalloc((void **)&c, bytes));
	CK(cudaMalloc((void **)&scratch, bytes));
	CK(cudaMemset(acc, 0, bytes));
	CK(cudaMemset(cnt, 0, bytes));
	CK(cudaMemset(c, 0, bytes));

	// the input, made on the device by the one direct launch
	iota<<<grid, block>>>(scratch, ni);
	CK(cudaGetLastError());
	CK(cudaMemcpy(hx, scratch, bytes, cudaMemcpyDeviceToHost));
	for (long long i = 0; i < n; i++)
		if (hx[i] != (int)(i % 97) - 40)
			fail("iota wrote a wrong value%s%s", "", "");

	// ---- 1. capture with a fork and a join
	cudaStream_t s, s2;
	cudaEvent_t fork, join;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

	cudaGraph_t graph;
	cudaStreamCaptureStatus st;
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	CK(cudaStreamIsCapturing(s, &st));
	if (st != cudaStreamCaptureStatusActive)
		fail("cudaStreamIsCapturing: not active during the capture%s%s", "", "");
	CK(cudaMemcpyAsync(dx, hx, bytes, cudaMemcpyHostToDevice, s));
	CK(cudaEventRecord(fork, s));
	CK(cudaStreamWaitEvent(s2, fork, 0));            // s2 joins the capture
	inc<<<grid, block, 0, s>>>(acc, dx, ni);
	CK(cudaGetLastError());
	count<<<grid, block, 0, s2>>>(cnt, ni);
	CK(cudaGetLastError());
	CK(cudaStreamIsCapturing(s2, &st));
	if (st != cudaStreamCaptureStatusActive)
		fail("the forked stream is not capturing%s%s", "", "");
	CK(cudaEventRecord(join, s2));
	CK(cudaStreamWaitEvent(s, join, 0));             // and is joined back
	combine<<<grid, block, 0, s>>>(out, acc, cnt, K, ni);
	CK(cudaGetLastError());
	CK(cudaMemcpyAsync(hout, out, bytes, cudaMemcpyDeviceToHost, s));
	unsigned long long cap_id = 0;
	size_t ndeps = 0;
	CK(cudaStreamGetCaptureInfo(s, &st, &cap_id, NULL, NULL, NULL, &ndeps));
	if (st != cudaStreamCaptureStatusActive || ndeps != 1)
		fail("cudaStreamGetCaptureInfo: unexpected state%s%s", "", "");
	CK(cudaStreamEndCapture(s, &graph));
	CK(cudaStreamIsCapturing(s, &st));
	if (st != cudaStreamCaptureStatusNone)
		fail("still capturing after cudaStreamEndCapture%s%s", "", "");

	size_t captured_nodes = node_count(graph);
	size_t nkern = 0;
	{
		cudaGraphNode_t nodes[16];
		size_t nn = 16;
		CK(cudaGraphGetNodes(graph, nodes, &nn));
		for (size_t i = 0; i < nn; i++) {
			cudaGraphNodeType t;
			CK(cudaGraphNodeGetType(nodes[i], &t));
			if (t == cudaGraphNodeTypeKernel) {
				cudaKernelNodeParams p;
				CK(cudaGraphKernelNodeGetParams(nodes[i], &p));
				if (p.gridDim.x != grid || p.blockDim.x != block || !p.kernelParams)
					fail("kernel node with wrong parameters%s%s", "", "");
				if (p.func == (void *)combine && *(int *)p.kernelParams[3] != K)
					fail("combine's node did not copy its arguments%s%s", "", "");
				nkern++;
			}
		}
	}
	if (captured_nodes != 5 || nkern != 3)
		fail("the captured graph should have 5 nodes, 3 of them kernels%s%s", "", "");

	cudaGraphExec_t exec;
	CK(cudaGraphInstantiate(&exec, graph, 0));
	CK(cudaGraphUpload(exec, s));
	for (long long r = 0; r < launches; r++)
		CK(cudaGraphLaunch(exec, s));
	CK(cudaStreamSynchronize(s));
	long long bad = 0;
	for (long long i = 0; i < n; i++)
		if (hout[i] != (int)launches * hx[i] * K + (int)launches)
			bad++;
	if (bad) {
		printf("FAIL %s captured graph: %lld of %lld outputs wrong (out[1]=%d want %d)\n",
		       NAME, bad, n, hout[1], (int)launches * hx[1] * K + (int)launches);
		return 1;
	}

	// ---- 2. a graph built by hand
	cudaGraph_t hand;
	cudaGraphNode_t nset, na, nb, nempty, ncopy;
	CK(cudaGraphCreate(&hand, 0));
	cudaMemsetParams mp;
	memset(&mp, 0, sizeof(mp));
	mp.dst = m;
	mp.value = 0;
	mp.elementSize = 4;
	mp.width = (size_t)n;
	mp.height = 1;
	CK(cudaGraphAddMemsetNode(&nset, hand, NULL, 0, &mp));
	void *args_a[] = { &m, &dx, &ni };
	cudaKernelNodeParams kp;
	memset(&kp, 0, sizeof(kp));
	kp.func = (void *)addto;
	kp.gridDim = dim3(grid);
	kp.blockDim = dim3(block);
	kp.kernelParams = args_a;
	CK(cudaGraphAddKernelNode(&na, hand, &nset, 1, &kp));
	void *args_b[] = { &c, &ni };
	kp.func = (void *)bump;
	kp.kernelParams = args_b;
	CK(cudaGraphAddKernelNode(&nb, hand, &nset, 1, &kp));
	cudaGraphNode_t both[2] = { na, nb };
	CK(cudaGraphAddEmptyNode(&nempty, hand, both, 2));
	CK(cudaGraphAddMemcpyNode1D(&ncopy, hand, NULL, 0, hm, m, bytes,
				    cudaMemcpyDeviceToHost));
	CK(cudaGraphAddDependencies(hand, &nempty, &ncopy, NULL, 1));
	size_t manual_nodes = node_count(hand);
	cudaGraphExec_t hexec;
	CK(cudaGraphInstantiateWithFlags(&hexec, hand, 0));
	CK(cudaGraphDestroy(hand));        // the exec does not need it any more
	for (int r = 0; r < 3; r++)
		CK(cudaGraphLaunch(hexec, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(hout, c, bytes, cudaMemcpyDeviceToHost));
	bad = 0;
	for (long long i = 0; i < n; i++)
		if (hm[i] != hx[i] || hout[i] != 3)
			bad++;
	if (bad)
		fail("the hand-built graph gave wrong results%s%s", "", "");
	if (manual_nodes != 5)
		fail("the hand-built graph should have 5 nodes%s%s", "", "");

	// ---- 3. what a capture forbids
	cudaGraph_t g2 = NULL;
	cudaError_t e_legacy = cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal);
	cudaGetLastError();

	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	inc<<<grid, block, 0, s>>>(acc, dx, ni);
	cudaError_t e_sync = cudaStreamSynchronize(s);
	cudaError_t e_end = cudaStreamEndCapture(s, &g2);
	cudaGetLastError();
	if (g2)
		fail("an invalidated capture returned a graph%s%s", "", "");

	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	cudaError_t e_memcpy = cudaMemcpy(hm, m, bytes, cudaMemcpyDeviceToHost);
	cudaError_t e_end2 = cudaStreamEndCapture(s, &g2);
	cudaGetLastError();
	size_t pinned_nodes = g2 ? node_count(g2) : 0;
	if (g2)
		CK(cudaGraphDestroy(g2));
	g2 = NULL;

	int *hp = (int *)malloc(bytes);            // pageable
	if (!hp)
		fail("out of host memory%s%s", "", "");
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	cudaError_t e_memcpy_pg = cudaMemcpy(hp, m, bytes, cudaMemcpyDeviceToHost);
	cudaError_t e_end2_pg = cudaStreamEndCapture(s, &g2);
	cudaGetLastError();
	if (g2)
		CK(cudaGraphDestroy(g2));
	g2 = NULL;
	free(hp);

	cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	CK(cudaThreadExchangeStreamCaptureMode(&mode));
	cudaError_t e_relaxed = cudaMemcpy(hm, m, bytes, cudaMemcpyDeviceToHost);
	CK(cudaThreadExchangeStreamCaptureMode(&mode));
	if (mode != cudaStreamCaptureModeRelaxed)
		fail("cudaThreadExchangeStreamCaptureMode did not swap%s%s", "", "");
	CK(cudaStreamEndCapture(s, &g2));
	size_t empty_nodes = node_count(g2);
	CK(cudaGraphDestroy(g2));

	cudaStream_t sb;      // a blocking stream: the legacy stream syncs with it
	CK(cudaStreamCreate(&sb));
	CK(cudaStreamBeginCapture(sb, cudaStreamCaptureModeRelaxed));
	bump<<<grid, block>>>(c, ni);          // on the legacy stream
	cudaError_t e_implicit = cudaGetLastError();
	cudaError_t e_end3 = cudaStreamEndCapture(sb, &g2);
	cudaGetLastError();
	CK(cudaStreamDestroy(sb));

	// what each call returned, so that a failure below says which rule broke
	fprintf(stderr, "graphs capture rules: legacy %d, sync %d, end %d, memcpy %d, end2 %d, "
		"memcpy_pageable %d, end2_pageable %d, relaxed %d, implicit %d, end3 %d, "
		"empty_nodes %zu, pinned_nodes %zu\n", (int)e_legacy, (int)e_sync, (int)e_end,
		(int)e_memcpy, (int)e_end2, (int)e_memcpy_pg, (int)e_end2_pg, (int)e_relaxed,
		(int)e_implicit, (int)e_end3, empty_nodes, pinned_nodes);
	if (e_legacy == cudaSuccess || e_sync == cudaSuccess || e_end == cudaSuccess ||
	    e_memcpy != cudaSuccess || e_end2 != cudaSuccess || pinned_nodes != 0 ||
	    e_memcpy_pg != cudaSuccess || e_end2_pg != cudaSuccess ||
	    e_relaxed != cudaSuccess || e_implicit == cudaSuccess || empty_nodes != 0)
		fail("a call illegal during capture succeeded (or a legal one failed)%s%s", "", "");

	// nothing of the failed captures ran
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(hout, acc, bytes, cudaMemcpyDeviceToHost));
	for (long long i = 0; i < n; i++)
		if (hout[i] != (int)launches * hx[i])
			fail("work of an invalidated capture ran%s%s", "", "");

	CK(cudaGraphExecDestroy(exec));
	CK(cudaGraphExecDestroy(hexec));
	CK(cudaGraphDestroy(graph));
	CK(cudaEventDestroy(fork));
	CK(cudaEventDestroy(join));
	CK(cudaStreamDestroy(s));
	CK(cudaStreamDestroy(s2));
	CK(cudaFree(dx));
	CK(cudaFree(acc));
	CK(cudaFree(cnt));
	CK(cudaFree(out));
	CK(cudaFree(m));
	CK(cudaFree(c));
	CK(cudaFree(scratch));
	CK(cudaFreeHost(hx));
	CK(cudaFreeHost(hout));
	CK(cudaFreeHost(hm));

	printf("{\"prog\":\"graphs\",\"n\":%lld,\"graph_launches\":%lld,\"captured_nodes\":%zu,"
	       "\"captured_kernels\":%zu,\"manual_nodes\":%zu,\"manual_launches\":3,"
	       "\"direct_launches\":1,\"capture_id\":%llu,\"errors\":{\"legacy_begin\":%d,"
	       "\"sync\":%d,\"end_after_sync\":%d,\"memcpy\":%d,\"end_after_memcpy\":%d,"
	       "\"memcpy_pageable\":%d,\"end_after_memcpy_pageable\":%d,"
	       "\"relaxed_memcpy\":%d,\"implicit\":%d,\"end_after_implicit\":%d},\"ok\":true}\n",
	       n, launches, captured_nodes, nkern, manual_nodes, cap_id, (int)e_legacy,
	       (int)e_sync, (int)e_end, (int)e_memcpy, (int)e_end2, (int)e_memcpy_pg,
	       (int)e_end2_pg, (int)e_relaxed, (int)e_implicit, (int)e_end3);
	printf("PASS %s n=%lld launches=%lld\n", NAME, n, launches);
	return 0;
}

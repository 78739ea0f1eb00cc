/*
 * graphapi.c - capture and graph calls on simgpu beyond bench/progs/graphs
 * (tests/test_simgpu_graph.py builds it with cc against simgpu's
 * libcudart.so.13).  Kernels are defined by name (simgpu_kernel_define);
 * their twins live here (found with dlsym: link with -rdynamic).
 * Prints "ok <check>" per check; exits 1 at the first failure.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_twin.h"

#define N 256

#define EXPECT(cond, what)                                                    \
	do {                                                                  \
		if (!(cond)) {                                                \
			printf("FAIL %s (line %d)\n", what, __LINE__);        \
			exit(1);                                              \
		}                                                             \
	} while (0)
#define CK(call) EXPECT((call) == cudaSuccess, #call)
#define ERR(call, want) EXPECT((call) == (want), #call " should be " #want)

/* add(int *v, int k): v[i] += k for i < N */
void simgpu_twin_t_add(const simgpu_launch *l)
{
	int *v = SIMGPU_ARG(l, 0, int *);
	int k = SIMGPU_ARG(l, 1, int);

	for (int i = 0; i < N; i++)
		v[i] += k;
}

static void *k_add;
static const dim3 one = { 1, 1, 1 };
static int host_calls;

static void host_fn(void *arg)
{
	(void)arg;
	__atomic_fetch_add(&host_calls, 1, __ATOMIC_RELAXED);
}

static void add(cudaStream_t s, int *v, int k)
{
	void *args[] = { &v, &k };

	CK(cudaLaunchKernel(k_add, one, one, args, 0, s));
}

static int first(const int *d)
{
	int x = -1;

	CK(cudaMemcpy(&x, d, sizeof(x), cudaMemcpyDeviceToHost));
	return x;
}

static size_t nodes_of(cudaGraph_t g)
{
	size_t n = 0;

	CK(cudaGraphGetNodes(g, NULL, &n));
	return n;
}

static void run(cudaGraph_t g, cudaStream_t s, int times)
{
	cudaGraphExec_t e;

	CK(cudaGraphInstantiate(&e, g, 0));
	for (int i = 0; i < times; i++)
		CK(cudaGraphLaunch(e, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaGraphExecDestroy(e));
}

struct ender {
	cudaStream_t s;
	cudaError_t  r;
};

static void *end_elsewhere(void *arg)
{
	struct ender *e = arg;
	cudaGraph_t g = NULL;

	e->r = cudaStreamEndCapture(e->s, &g);
	return NULL;
}

int main(void)
{
	void *(*define)(const char *, int, const unsigned *) =
		(void *(*)(const char *, int, const unsigned *))dlsym(RTLD_DEFAULT, "simgpu_kernel_define");
	static const unsigned sizes[] = { 8, 4 };
	cudaStream_t s, s2;
	cudaEvent_t ev, outside;
	cudaGraph_t g, g2;
	cudaGraphNode_t nd[8];
	enum cudaStreamCaptureStatus st;
	int *d;

	EXPECT(define, "simgpu_kernel_define exported");
	k_add = define("t_add", 2, sizes);
	EXPECT(k_add, "kernel defined");
	CK(cudaMalloc((void **)&d, N * sizeof(int)));
	CK(cudaMemset(d, 0, N * sizeof(int)));
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaEventCreate(&ev));
	CK(cudaEventCreate(&outside));

	/* arguments are copied at capture; GetCaptureInfo; other streams idle */
	{
		int k = 5;
		void *args[] = { &d, &k };
		unsigned long long id = 0;
		cudaGraph_t cg = NULL;
		const cudaGraphNode_t *deps = NULL;
		size_t ndeps = 9;

		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		CK(cudaLaunchKernel(k_add, one, one, args, 0, s));
		k = 1000;
		CK(cudaStreamGetCaptureInfo(s, &st, &id, &cg, &deps, NULL, &ndeps));
		EXPECT(st == cudaStreamCaptureStatusActive && id && cg && ndeps == 1 && deps[0],
		       "capture info");
		CK(cudaStreamIsCapturing(s2, &st));
		EXPECT(st == cudaStreamCaptureStatusNone, "s2 not capturing");
		CK(cudaStreamEndCapture(s, &g));
		EXPECT(first(d) == 0, "nothing ran during the capture");
		run(g, s, 2);
		EXPECT(first(d) == 10, "replays used the captured argument");
		printf("ok args_copied\n");
	}

	/* a graph launched into a capture; host functions; memsets */
	{
		cudaGraphExec_t e;

		CK(cudaGraphInstantiate(&e, g, 0));
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		CK(cudaMemsetAsync(d, 0, N * sizeof(int), s));
		CK(cudaGraphLaunch(e, s));
		CK(cudaGraphLaunch(e, s));
		CK(cudaLaunchHostFunc(s, host_fn, NULL));
		CK(cudaStreamEndCapture(s, &g2));
		CK(cudaGraphExecDestroy(e));
		EXPECT(nodes_of(g2) == 4, "memset + 2 kernels + host node");
		run(g2, s, 3);
		EXPECT(first(d) == 10 && host_calls == 3, "memset, graph in capture, host node");
		CK(cudaGraphDestroy(g2));
		printf("ok nested_host_memset\n");
	}

	/* fork without join: Unjoined; end from the forked stream: Unmatched */
	{
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		CK(cudaEventRecord(ev, s));
		CK(cudaStreamWaitEvent(s2, ev, 0));
		add(s2, d, 1);
		ERR(cudaStreamEndCapture(s2, &g2), cudaErrorStreamCaptureUnmatched);
		ERR(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
		CK(cudaStreamIsCapturing(s2, &st));
		EXPECT(st == cudaStreamCaptureStatusNone, "the fork ended with its capture");
		cudaGetLastError();

		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		CK(cudaEventRecord(ev, s));
		CK(cudaStreamWaitEvent(s2, ev, 0));
		add(s2, d, 1);
		ERR(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureUnjoined);
		EXPECT(g2 == NULL, "no graph");
		cudaGetLastError();
		EXPECT(first(d) == 10, "nothing of the failed captures ran");
		printf("ok unjoined_unmatched\n");
	}

	/* queries and outside events */
	{
		CK(cudaEventRecord(outside, s2));
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		CK(cudaEventRecord(ev, s));
		ERR(cudaEventQuery(ev), cudaErrorStreamCaptureUnsupported);
		ERR(cudaStreamQuery(s), cudaErrorStreamCaptureUnsupported);
		ERR(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
		cudaGetLastError();

		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		ERR(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation);
		ERR(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
		cudaGetLastError();

		/* as external nodes they are allowed */
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		CK(cudaStreamWaitEvent(s, outside, cudaEventWaitExternal));
		add(s, d, 1);
		CK(cudaEventRecordWithFlags(ev, s, cudaEventRecordExternal));
		CK(cudaStreamEndCapture(s, &g2));
		{
			size_t n = 8;
			enum cudaGraphNodeType t0, t2;

			CK(cudaGraphGetNodes(g2, nd, &n));
			EXPECT(n == 3, "wait, kernel, record");
			CK(cudaGraphNodeGetType(nd[0], &t0));
			CK(cudaGraphNodeGetType(nd[2], &t2));
			EXPECT(t0 == cudaGraphNodeTypeWaitEvent && t2 == cudaGraphNodeTypeEventRecord,
			       "external event nodes");
		}
		run(g2, s, 1);
		CK(cudaEventSynchronize(ev));
		EXPECT(first(d) == 11, "the kernel between the event nodes ran");
		CK(cudaGraphDestroy(g2));
		printf("ok queries_events\n");
	}

	/* the capture belongs to its thread (global mode) */
	{
		struct ender e = { s, cudaSuccess };
		pthread_t t;

		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		pthread_create(&t, NULL, end_elsewhere, &e);
		pthread_join(t, NULL);
		EXPECT(e.r == cudaErrorStreamCaptureWrongThread, "end from another thread");
		CK(cudaStreamEndCapture(s, &g2));
		EXPECT(nodes_of(g2) == 0, "an empty capture");
		CK(cudaGraphDestroy(g2));
		cudaGetLastError();
		printf("ok wrong_thread\n");
	}

	/* hand-built: roots, a cycle refused, capture into an existing graph */
	{
		size_t n = 8;
		cudaGraphNode_t a, b, c;

		CK(cudaGraphCreate(&g2, 0));
		CK(cudaGraphAddEmptyNode(&a, g2, NULL, 0));
		CK(cudaGraphAddEmptyNode(&b, g2, &a, 1));
		ERR(cudaGraphAddDependencies(g2, &b, &a, NULL, 1), cudaErrorInvalidValue);
		cudaGetLastError();
		CK(cudaGraphAddEmptyNode(&c, g2, NULL, 0));
		CK(cudaGraphGetRootNodes(g2, nd, &n));
		EXPECT(n == 2, "two roots");
		CK(cudaStreamBeginCaptureToGraph(s, g2, &b, NULL, 1, cudaStreamCaptureModeGlobal));
		add(s, d, 4);
		CK(cudaStreamEndCapture(s, &g));
		EXPECT(g == g2 && nodes_of(g2) == 4, "captured into the given graph");
		run(g2, s, 1);
		EXPECT(first(d) == 15, "its kernel ran");
		CK(cudaGraphDestroy(g2));
		printf("ok hand_built\n");
	}
	/* the per-thread stream captures; a destroyed capturing stream's
	 * object, reused, does not inherit its capture */
	{
		cudaStream_t s3, s4;

		CK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeGlobal));
		add(cudaStreamPerThread, d, 2);
		CK(cudaStreamEndCapture(cudaStreamPerThread, &g2));
		EXPECT(nodes_of(g2) == 1, "one kernel captured on the per-thread stream");
		run(g2, cudaStreamPerThread, 2);
		EXPECT(first(d) == 19, "its replays ran");
		CK(cudaGraphDestroy(g2));

		CK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
		CK(cudaStreamBeginCapture(s3, cudaStreamCaptureModeGlobal));
		CK(cudaStreamDestroy(s3));
		CK(cudaStreamCreateWithFlags(&s4, cudaStreamNonBlocking));
		CK(cudaStreamIsCapturing(s4, &st));
		EXPECT(st == cudaStreamCaptureStatusNone, "a new stream is not capturing");
		add(s4, d, 1);
		CK(cudaStreamSynchronize(s4));
		EXPECT(first(d) == 20, "and runs its work");
		CK(cudaStreamDestroy(s4));
		printf("ok per_thread_destroyed\n");
	}
	/* child graphs: copied into their node, run in its place; clones */
	{
		cudaGraph_t child, inner, copy;
		cudaGraphNode_t k, c1, c2;
		enum cudaGraphNodeType t;
		struct cudaKernelNodeParams p;
		int *dd = d, three = 3;
		void *args[] = { &dd, &three };
		size_t n = 1;

		memset(&p, 0, sizeof(p));
		p.func = k_add;
		p.gridDim = one;
		p.blockDim = one;
		p.kernelParams = args;
		CK(cudaGraphCreate(&child, 0));
		CK(cudaGraphAddKernelNode(&k, child, NULL, 0, &p));
		CK(cudaGraphCreate(&g2, 0));
		CK(cudaGraphAddChildGraphNode(&c1, g2, NULL, 0, child));
		CK(cudaGraphAddChildGraphNode(&c2, g2, &c1, 1, child));
		CK(cudaGraphDestroy(child));             /* the nodes have copies */
		CK(cudaGraphNodeGetType(c2, &t));
		EXPECT(t == cudaGraphNodeTypeGraph, "a child-graph node");
		CK(cudaGraphChildGraphNodeGetGraph(c2, &inner));
		CK(cudaGraphGetNodes(inner, nd, &n));
		CK(cudaGraphNodeGetType(nd[0], &t));
		EXPECT(n == 1 && t == cudaGraphNodeTypeKernel, "its graph holds the kernel");
		CK(cudaGraphClone(&copy, g2));
		CK(cudaGraphDestroy(g2));
		EXPECT(nodes_of(copy) == 2, "the clone has both child nodes");
		run(copy, s, 2);
		EXPECT(first(d) == 32, "four runs of the child's kernel");
		CK(cudaGraphDestroy(copy));
		printf("ok child_graphs\n");
	}
	/* updates: a new capture of the same shape (as llama.cpp does each
	 * token), a changed topology refused, one node's new parameters */
	{
		cudaGraph_t ga, gb, gc;
		cudaGraphExec_t e;
		cudaGraphExecUpdateResultInfo info;
		cudaGraphNode_t kn;
		struct cudaKernelNodeParams p;
		int *dd = d, seven = 7;
		void *args[] = { &dd, &seven };
		size_t n = 1;

		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		add(s, d, 1);
		CK(cudaStreamEndCapture(s, &ga));
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		add(s, d, 100);
		CK(cudaStreamEndCapture(s, &gb));
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		add(s, d, 1);
		add(s, d, 1);
		CK(cudaStreamEndCapture(s, &gc));
		CK(cudaGraphInstantiate(&e, ga, 0));
		CK(cudaGraphExecUpdate(e, gb, &info));
		EXPECT(info.result == cudaGraphExecUpdateSuccess, "update result");
		CK(cudaGraphLaunch(e, s));
		CK(cudaStreamSynchronize(s));
		EXPECT(first(d) == 132, "the updated exec ran the new arguments");
		ERR(cudaGraphExecUpdate(e, gc, &info), cudaErrorGraphExecUpdateFailure);
		EXPECT(info.result == cudaGraphExecUpdateErrorTopologyChanged, "topology changed");
		cudaGetLastError();

		CK(cudaGraphGetNodes(gb, &kn, &n));
		memset(&p, 0, sizeof(p));
		p.func = k_add;
		p.gridDim = one;
		p.blockDim = one;
		p.kernelParams = args;
		CK(cudaGraphExecKernelNodeSetParams(e, kn, &p));
		CK(cudaGraphLaunch(e, s));
		CK(cudaStreamSynchronize(s));
		EXPECT(first(d) == 139, "the exec's node took its new parameters");
		CK(cudaGraphKernelNodeGetParams(kn, &p));
		EXPECT(*(int *)p.kernelParams[1] == 100, "the graph's node kept its own");
		seven = -139;
		CK(cudaGraphKernelNodeSetParams(kn, &p));   /* p's are the node's: 100 */
		p.kernelParams = args;
		CK(cudaGraphKernelNodeSetParams(kn, &p));
		run(gb, s, 1);
		EXPECT(first(d) == 0, "a graph node's new parameters");
		CK(cudaGraphExecDestroy(e));
		CK(cudaGraphDestroy(ga));
		CK(cudaGraphDestroy(gb));
		CK(cudaGraphDestroy(gc));
		printf("ok updates\n");
	}
	printf("PASS graphapi\n");
	return 0;
}

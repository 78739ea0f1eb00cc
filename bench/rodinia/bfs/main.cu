// bfs: Rodinia-style breadth-first search with frontier masks.
//
//   bfs [--size N] [--degree D] [--seed S] [--repeat R] [--duration SEC] [--check]
//
// A random directed graph of N nodes (default 1,000,000, the size of
// Rodinia's graph1MW_6 input) where node i has 1..2D-1 out-edges (uniform,
// mean D = 6) to uniformly drawn nodes, in CSR form: node i's edges are
// edges[nodes[i].starting .. + nodes[i].no_of_edges).  The generator is a
// seeded splitmix64, so a (size, degree, seed) triple is always one graph.
//
// The search from node 0 is the one of Harish & Narayanan (HiPC 2007) that
// Rodinia ships (Che et al., IISWC 2009): one thread per node, two kernels
// per level, and the host loops until a level adds no node:
//
//   bfs_expand: a node in the frontier (mask) leaves it and, for every
//               neighbour not yet visited, sets cost = own cost + 1 and
//               marks the neighbour in `updating`;
//   bfs_update: a marked node joins the next frontier, becomes visited,
//               clears its mark and sets the `over` flag.
//
// All frontier nodes of a level have the same cost, so the racing writes of
// bfs_expand store equal values: the result (the level of every node, -1
// when unreachable) is deterministic and checked exactly against a
// queue-based BFS on the CPU.
//
// Block of 512 threads (Rodinia's MAX_THREADS_PER_BLOCK), grid ceil(N/512).
//
// One run (repeated --repeat R times, or until --duration SEC passed):
// cudaMemcpy H2D mask, visited, cost (initial state), cudaMemset updating,
// then per level: cudaMemcpy H2D over (1 byte), 2 launches, cudaMemcpy D2H
// over; finally cudaMemcpy D2H cost.  The graph (nodes, edges) is uploaded
// once, before the first run.  --check compares the last run's costs with
// the CPU and prints `CHECK fnv1a64=<hex>` of them.
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "bfs";

#include "progutil.h"

#define MAX_THREADS_PER_BLOCK 512

struct Node {
	int starting;     /* first edge in edges[] */
	int no_of_edges;
};

__global__ void bfs_expand(const Node *nodes, const int *edges, bool *mask, bool *updating,
			   const bool *visited, int *cost, int n)
{
	int tid = blockIdx.x * MAX_THREADS_PER_BLOCK + threadIdx.x;
	if (tid >= n || !mask[tid])
		return;
	mask[tid] = false;
	int end = nodes[tid].starting + nodes[tid].no_of_edges;
	for (int i = nodes[tid].starting; i < end; i++) {
		int id = edges[i];
		if (!visited[id]) {
			cost[id] = cost[tid] + 1;
			updating[id] = true;
		}
	}
}

__global__ void bfs_update(bool *mask, bool *updating, bool *visited, bool *over, int n)
{
	int tid = blockIdx.x * MAX_THREADS_PER_BLOCK + threadIdx.x;
	if (tid >= n || !updating[tid])
		return;
	mask[tid] = true;
	visited[tid] = true;
	*over = true;
	updating[tid] = false;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Node i gets 1..2*degree-1 edges to uniformly drawn nodes. */
static void make_graph(int n, int degree, uint64_t seed, Node *nodes, int **edges_out,
		       long long *nedges_out)
{
	uint64_t s = seed;
	long long total = 0;
	for (int i = 0; i < n; i++) {
		nodes[i].starting = (int)total;
		nodes[i].no_of_edges = 1 + (int)(splitmix64(&s) % (uint64_t)(2 * degree - 1));
		total += nodes[i].no_of_edges;
		if (total > INT_MAX)     /* edge offsets are ints, as in Rodinia */
			fail("more than %s edges: lower --size or --degree%s", "2^31", "");
	}
	int *edges = (int *)malloc((size_t)total * sizeof(int));
	if (!edges)
		fail("host malloc of %s%s failed", "edges", "");
	for (long long e = 0; e < total; e++)
		edges[e] = (int)(splitmix64(&s) % (uint64_t)n);
	*edges_out = edges;
	*nedges_out = total;
}

/* The reference: levels by a FIFO queue from node 0. */
static void cpu_bfs(int n, const Node *nodes, const int *edges, int *cost)
{
	int *queue = (int *)malloc((size_t)n * sizeof(int));
	if (!queue)
		fail("host malloc of %s%s failed", "queue", "");
	for (int i = 0; i < n; i++)
		cost[i] = -1;
	int head = 0, tail = 0;
	cost[0] = 0;
	queue[tail++] = 0;
	while (head < tail) {
		int u = queue[head++];
		for (int i = nodes[u].starting; i < nodes[u].starting + nodes[u].no_of_edges; i++) {
			int v = edges[i];
			if (cost[v] < 0) {
				cost[v] = cost[u] + 1;
				queue[tail++] = v;
			}
		}
	}
	free(queue);
}

int main(int argc, char **argv)
{
	long long size = 1000000, degree = 6, seed = 1, repeat = 1;
	double duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--size"))
			size = arg_int(argc, argv, &i, 1, 1LL << 27);
		else if (!strcmp(argv[i], "--degree"))
			degree = arg_int(argc, argv, &i, 1, 64);
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: bfs [--size N] [--degree D] [--seed S] [--repeat R] "
			       "[--duration SEC] [--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	int n = (int)size;
	Node *nodes = (Node *)malloc((size_t)n * sizeof(Node));
	bool *mask0 = (bool *)calloc((size_t)n, 1), *visited0 = (bool *)calloc((size_t)n, 1);
	int *cost0 = (int *)malloc((size_t)n * sizeof(int));
	int *out = (int *)malloc((size_t)n * sizeof(int));
	if (!nodes || !mask0 || !visited0 || !cost0 || !out)
		fail("host malloc of %s%s failed", "node arrays", "");
	int *edges;
	long long nedges;
	make_graph(n, (int)degree, (uint64_t)seed, nodes, &edges, &nedges);
	for (int i = 0; i < n; i++)
		cost0[i] = -1;
	mask0[0] = visited0[0] = true;
	cost0[0] = 0;

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	size_t nb = (size_t)n, ib = (size_t)n * sizeof(int);
	Node *dnodes;
	int *dedges, *dcost;
	bool *dmask, *dupd, *dvis, *dover;
	CK(cudaMalloc((void **)&dnodes, (size_t)n * sizeof(Node)));
	CK(cudaMalloc((void **)&dedges, (size_t)nedges * sizeof(int)));
	CK(cudaMalloc((void **)&dmask, nb));
	CK(cudaMalloc((void **)&dupd, nb));
	CK(cudaMalloc((void **)&dvis, nb));
	CK(cudaMalloc((void **)&dcost, ib));
	CK(cudaMalloc((void **)&dover, sizeof(bool)));
	CK(cudaMemcpy(dnodes, nodes, (size_t)n * sizeof(Node), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dedges, edges, (size_t)nedges * sizeof(int), cudaMemcpyHostToDevice));
	h2d += (size_t)n * sizeof(Node) + (size_t)nedges * sizeof(int);

	dim3 grid((n + MAX_THREADS_PER_BLOCK - 1) / MAX_THREADS_PER_BLOCK);
	dim3 block(n < MAX_THREADS_PER_BLOCK ? n : MAX_THREADS_PER_BLOCK);
	long long runs = 0, levels = 0;
	double t0 = now_s();
	while (runs < repeat || (duration > 0 && now_s() - t0 < duration)) {
		CK(cudaMemcpy(dmask, mask0, nb, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dvis, visited0, nb, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dcost, cost0, ib, cudaMemcpyHostToDevice));
		h2d += 2 * nb + ib;
		CK(cudaMemset(dupd, 0, nb));
		bool over;
		levels = 0;
		do {
			over = false;
			CK(cudaMemcpy(dover, &over, sizeof(bool), cudaMemcpyHostToDevice));
			h2d += sizeof(bool);
			bfs_expand<<<grid, block>>>(dnodes, dedges, dmask, dupd, dvis, dcost, n);
			CK(cudaGetLastError());
			bfs_update<<<grid, block>>>(dmask, dupd, dvis, dover, n);
			CK(cudaGetLastError());
			launches += 2;
			CK(cudaMemcpy(&over, dover, sizeof(bool), cudaMemcpyDeviceToHost));
			d2h += sizeof(bool);
			levels++;
		} while (over);
		CK(cudaMemcpy(out, dcost, ib, cudaMemcpyDeviceToHost));
		d2h += ib;
		runs++;
	}
	double elapsed = now_s() - t0;
	CK(cudaFree(dnodes));
	CK(cudaFree(dedges));
	CK(cudaFree(dmask));
	CK(cudaFree(dupd));
	CK(cudaFree(dvis));
	CK(cudaFree(dcost));
	CK(cudaFree(dover));

	int reached = 0, maxcost = 0;
	for (int i = 0; i < n; i++)
		if (out[i] >= 0) {
			reached++;
			if (out[i] > maxcost)
				maxcost = out[i];
		}
	printf("BFS nodes=%d edges=%lld levels=%lld reached=%d max_cost=%d runs=%lld "
	       "elapsed_s=%.6f\n", n, nedges, levels, reached, maxcost, runs, elapsed);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	int rc = 0;
	if (check) {
		unsigned long long hsh = fnv1a64(FNV1A64_INIT, out, ib);
		printf("CHECK fnv1a64=%016llx\n", hsh);
		int *ref = (int *)malloc(ib);
		if (!ref)
			fail("host malloc of %s%s failed", "reference", "");
		cpu_bfs(n, nodes, edges, ref);
		long long bad = 0, first = -1;
		for (int i = 0; i < n; i++)
			if (out[i] != ref[i] && bad++ == 0)
				first = i;
		if (bad) {
			printf("FAIL %s %lld of %d costs differ (first at node %lld: got %d want %d)\n",
			       NAME, bad, n, first, out[first], ref[first]);
			rc = 1;
		} else {
			printf("PASS %s nodes=%d edges=%lld levels=%lld reached=%d\n", NAME, n,
			       nedges, levels, reached);
		}
		free(ref);
	}
	free(nodes);
	free(edges);
	free(mask0);
	free(visited0);
	free(cost0);
	free(out);
	return rc;
}

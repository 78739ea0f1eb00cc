/* Host twins of bench/rodinia/bfs (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * Both kernels touch only their own node plus, in bfs_expand, neighbours
 * whose `visited` flag no kernel of the launch writes: running the threads
 * one after the other gives exactly the GPU's result.
 *
 * Cost.  What BFS moves depends on the frontier, which the launch shape
 * does not tell and which the twin has changed by the time simgpu asks
 * for the cost (it calls the cost function right after the twin, on the
 * same thread).  So the twin counts the traffic it really causes and
 * leaves it in a thread-local note for the cost function of the same
 * launch; without a note (the twin did not run) the cost falls back to
 * what every thread does, the flag scan.
 *
 * Bytes are the global-memory sectors (32 bytes, the unit L2 and DRAM
 * move) each block requests: a block's repeated touches of a sector count
 * once (coalescing, L1), the same sector requested by two blocks counts
 * twice (the model's bandwidth stands for the whole path between the SMs
 * and memory; L2 hits are not cheaper in it).  So a 1-byte flag at a
 * random neighbour costs a sector.  "Flops" are integer operations.
 */
#include <stdbool.h>
#include <stdlib.h>
#include "simgpu_twin.h"
#include "sectors.h"

#define MAX_THREADS_PER_BLOCK 512   /* the kernels index with this, not blockDim */

struct Node {
	int starting;
	int no_of_edges;
};

static __thread struct {
	const simgpu_launch *l;
	double flops, bytes;
} note;

/* Threads of the grid that have a node (tid < n), as the kernels number them. */
static long threads_in(const simgpu_launch *l, int n)
{
	long t;

	if (l->grid.x == 0 || l->block.x == 0 || n <= 0)
		return 0;
	t = (long)(l->grid.x - 1) * MAX_THREADS_PER_BLOCK + l->block.x;
	return t < n ? t : n;
}

/* A flag scan by a block's consecutive threads: one byte each, whole sectors. */
static double scan_bytes(const simgpu_launch *l, long nt)
{
	double b = 0;

	for (long t0 = 0; t0 < nt; t0 += MAX_THREADS_PER_BLOCK) {
		long k = nt - t0 < (long)l->block.x ? nt - t0 : (long)l->block.x;
		b += (double)((k + SECTOR - 1) / SECTOR) * SECTOR;
	}
	return b;
}

static void take_note(const simgpu_launch *l, double *flops, double *bytes, long nt)
{
	if (note.l == l) {
		*flops = note.flops;
		*bytes = note.bytes;
		note.l = NULL;
		return;
	}
	*flops = (double)nt;         /* one flag test per thread */
	*bytes = scan_bytes(l, nt);
}

/* __global__ void bfs_expand(const Node *nodes, const int *edges, bool *mask,
 *                            bool *updating, const bool *visited, int *cost, int n)
 * Every thread reads its mask byte.  A frontier node clears its mask,
 * reads its Node, its cost and its edge list; per edge it reads the
 * neighbour's visited flag and, when not visited, writes its cost and
 * updating flag. */
void simgpu_twin__Z10bfs_expandPK4NodePKiPbS4_PKbPii(const simgpu_launch *l)
{
	const struct Node *nodes = SIMGPU_ARG(l, 0, const struct Node *);
	const int *edges = SIMGPU_ARG(l, 1, const int *);
	bool *mask = SIMGPU_ARG(l, 2, bool *);
	bool *updating = SIMGPU_ARG(l, 3, bool *);
	const bool *visited = SIMGPU_ARG(l, 4, const bool *);
	int *cost = SIMGPU_ARG(l, 5, int *);
	int n = SIMGPU_ARG(l, 6, int);
	long nt = threads_in(l, n), front = 0, nedge = 0, maxedge = 0;
	struct sectors sec[7];
	enum { MASK_W, NODE_R, COST_R, EDGE_R, VIS_R, COST_W, UPD_W };
	double bytes = 0;

	for (long tid = 0; tid < nt; tid++)
		if (nodes[tid].starting + nodes[tid].no_of_edges > maxedge)
			maxedge = nodes[tid].starting + nodes[tid].no_of_edges;
	sectors_open(&sec[MASK_W], n);
	sectors_open(&sec[NODE_R], (size_t)n * sizeof(struct Node));
	sectors_open(&sec[COST_R], (size_t)n * sizeof(int));
	sectors_open(&sec[EDGE_R], (size_t)maxedge * sizeof(int));
	sectors_open(&sec[VIS_R], n);
	sectors_open(&sec[COST_W], (size_t)n * sizeof(int));
	sectors_open(&sec[UPD_W], n);
	for (long b0 = 0; b0 < nt; b0 += MAX_THREADS_PER_BLOCK) {
		long b1 = b0 + l->block.x < nt ? b0 + l->block.x : nt;
		for (int a = 0; a < 7; a++)
			sectors_next_block(&sec[a]);
		for (long tid = b0; tid < b1; tid++) {
			if (!mask[tid])
				continue;
			mask[tid] = false;
			int s = nodes[tid].starting, e = s + nodes[tid].no_of_edges;
			front++;
			touch(&sec[MASK_W], tid);
			touch(&sec[NODE_R], tid * sizeof(struct Node));
			touch(&sec[COST_R], tid * sizeof(int));
			for (int i = s; i < e; i++) {
				int id = edges[i];
				nedge++;
				touch(&sec[EDGE_R], (size_t)i * sizeof(int));
				touch(&sec[VIS_R], id);
				if (!visited[id]) {
					cost[id] = cost[tid] + 1;
					updating[id] = true;
					touch(&sec[COST_W], (size_t)id * sizeof(int));
					touch(&sec[UPD_W], id);
				}
			}
		}
	}
	for (int a = 0; a < 7; a++)
		bytes += sectors_close(&sec[a]);
	note.l = l;
	note.flops = nt + 2.0 * front + 3.0 * nedge;
	note.bytes = scan_bytes(l, nt) + bytes;
}

void simgpu_cost__Z10bfs_expandPK4NodePKiPbS4_PKbPii(const simgpu_launch *l, double *flops,
						       double *bytes)
{
	take_note(l, flops, bytes, threads_in(l, SIMGPU_ARG(l, 6, int)));
}

/* __global__ void bfs_update(bool *mask, bool *updating, bool *visited, bool *over, int n)
 * Every thread reads its updating byte; a marked node writes its mask,
 * visited and updating flags and the one `over` flag. */
void simgpu_twin__Z10bfs_updatePbS_S_S_i(const simgpu_launch *l)
{
	bool *mask = SIMGPU_ARG(l, 0, bool *);
	bool *updating = SIMGPU_ARG(l, 1, bool *);
	bool *visited = SIMGPU_ARG(l, 2, bool *);
	bool *over = SIMGPU_ARG(l, 3, bool *);
	int n = SIMGPU_ARG(l, 4, int);
	long nt = threads_in(l, n), marked = 0, blocks_marking = 0;
	double flag_bytes = 0;

	/* the marked nodes of a block are consecutive tids: count their
	 * sectors by watching the sector number change */
	for (long b0 = 0; b0 < nt; b0 += MAX_THREADS_PER_BLOCK) {
		long b1 = b0 + l->block.x < nt ? b0 + l->block.x : nt, last = -1;
		int any = 0;
		for (long tid = b0; tid < b1; tid++) {
			if (!updating[tid])
				continue;
			mask[tid] = true;
			visited[tid] = true;
			*over = true;
			updating[tid] = false;
			marked++;
			any = 1;
			if (tid / SECTOR != last) {
				last = tid / SECTOR;
				flag_bytes += SECTOR;
			}
		}
		blocks_marking += any;
	}
	note.l = l;
	note.flops = nt + (double)marked;
	note.bytes = scan_bytes(l, nt) + 3 * flag_bytes + blocks_marking * SECTOR;
}

void simgpu_cost__Z10bfs_updatePbS_S_S_i(const simgpu_launch *l, double *flops, double *bytes)
{
	take_note(l, flops, bytes, threads_in(l, SIMGPU_ARG(l, 4, int)));
}

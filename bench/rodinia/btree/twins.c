/* Host twins of bench/rodinia/btree (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * A block walks the tree for one query; its threads only read the tree and
 * write the query's own answer, so walking query after query gives the
 * GPU's result.  The walk below does what the block's threads t < min(
 * blockDim, ORDER) do together: the one slot with keys[t] <= key <
 * keys[t+1] (and a valid child index) names the next node, none keeps the
 * current one.
 *
 * Cost.  The cost function walks the same paths again without writing
 * (the kernels do not change the tree or the queries, so it sees what the
 * twin saw) and counts the global-memory sectors (32 bytes, the unit L2
 * and DRAM move) each block requests: per node visit the key slots its
 * threads compare (coalesced) and the chosen child index; at the leaf its
 * key count, keys and, for findK, the record.  A block's repeated touches
 * of a sector (the two walks of findRangeK share the upper levels) count
 * once; every query block reads its own path, even the root that all of
 * them read - the model's bandwidth stands for the whole path between the
 * SMs and memory, L2 hits are not cheaper in it.  "Flops" are the
 * integer compares.
 */
#include <limits.h>
#include <stdlib.h>
#include "simgpu_twin.h"
#include "sectors.h"

#define ORDER 256

struct knode {
	int location;
	int indices[ORDER + 1];
	int keys[ORDER + 1];
	int is_leaf;
	int num_keys;
};

/* What a walk needs: the tree, its size, the block's thread count and,
 * when costing, where to count the sectors (NULL: not counting). */
struct walk {
	const struct knode *kn;
	int nelem, nthr;
	struct sectors *sec;
	double ops;
};

static size_t off_in(const struct walk *w, const void *p)
{
	return (size_t)((const char *)p - (const char *)w->kn);
}

/* One level down from node cur towards key. */
static int step(struct walk *w, int cur, int key)
{
	const struct knode *nd = &w->kn[cur];
	int nt = w->nthr < ORDER ? w->nthr : ORDER, next = cur;

	for (int t = 0; t < nt; t++) {
		if (nd->keys[t] > key)
			continue;
		if (nd->keys[t + 1] > key && nd->indices[t] >= 0 && nd->indices[t] < w->nelem) {
			next = nd->indices[t];
			if (w->sec) {
				touch_range(w->sec, off_in(w, &nd->keys[0]), (size_t)(t + 2) * sizeof(int));
				touch(w->sec, off_in(w, &nd->indices[t]));
			}
			break;
		}
	}
	if (w->sec && next == cur)      /* no slot chose: every key was compared */
		touch_range(w->sec, off_in(w, &nd->keys[0]), (size_t)(nt + 1) * sizeof(int));
	w->ops += 2.0 * w->nthr;
	return next;
}

static int descend(struct walk *w, int height, int key)
{
	int cur = 0;

	for (int lvl = 0; lvl < height; lvl++)
		cur = step(w, cur, key);
	return cur;
}

/* The leaf's key count and its first keys: threads t < min(blockDim,
 * num_keys) compare their key. */
static int leaf_keys(struct walk *w, const struct knode *leaf)
{
	int nk = leaf->num_keys < w->nthr ? leaf->num_keys : w->nthr;

	if (nk > ORDER + 1)
		nk = ORDER + 1;
	if (w->sec) {
		touch(w->sec, off_in(w, &leaf->num_keys));
		if (nk > 0)
			touch_range(w->sec, off_in(w, &leaf->keys[0]), (size_t)nk * sizeof(int));
	}
	w->ops += 2.0 * w->nthr;
	return nk;
}

/* Contiguous per-query arrays: one int per block. */
static double per_query(const simgpu_launch *l)
{
	return (double)(((size_t)l->grid.x * sizeof(int) + SECTOR - 1) / SECTOR * SECTOR);
}

/* __global__ void findK(int height, const knode *knodes, int nelem,
 *                       const int *records, const int *keys, int *ans) */
static void find_k(const simgpu_launch *l, struct walk *w, double *records_bytes)
{
	int height = SIMGPU_ARG(l, 0, int);
	const int *records = SIMGPU_ARG(l, 3, const int *);
	const int *keys = SIMGPU_ARG(l, 4, const int *);
	int *ans = SIMGPU_ARG(l, 5, int *);

	for (unsigned q = 0; q < l->grid.x; q++) {
		if (w->sec)
			sectors_next_block(w->sec);
		const struct knode *leaf = &w->kn[descend(w, height, keys[q])];
		int nk = leaf_keys(w, leaf), found = -1;
		for (int t = 0; t < nk; t++)
			if (leaf->keys[t] == keys[q]) {
				found = records[leaf->indices[t]];
				if (w->sec) {
					touch(w->sec, off_in(w, &leaf->indices[t]));
					*records_bytes += SECTOR;
				}
			}
		if (!w->sec)
			ans[q] = found;
	}
}

static void walk_init(struct walk *w, const simgpu_launch *l, struct sectors *sec)
{
	w->kn = SIMGPU_ARG(l, 1, const struct knode *);
	w->nelem = SIMGPU_ARG(l, 2, int);
	w->nthr = (int)(l->block.x * l->block.y * l->block.z);
	w->sec = sec;
	w->ops = 0;
	if (sec)
		sectors_open(sec, (size_t)(w->nelem > 0 ? w->nelem : 0) * sizeof(struct knode));
}

void simgpu_twin__Z5findKiPK5knodeiPKiS3_Pi(const simgpu_launch *l)
{
	struct walk w;
	double unused = 0;

	walk_init(&w, l, NULL);
	find_k(l, &w, &unused);
}

void simgpu_cost__Z5findKiPK5knodeiPKiS3_Pi(const simgpu_launch *l, double *flops, double *bytes)
{
	struct walk w;
	struct sectors tree;
	double records_bytes = 0;

	walk_init(&w, l, &tree);
	find_k(l, &w, &records_bytes);
	*flops = w.ops;
	*bytes = sectors_close(&tree) + records_bytes + 2 * per_query(l);   /* keys in, ans out */
}

/* __global__ void findRangeK(int height, const knode *knodes, int nelem, const int *start,
 *                            const int *end, int *recstart, int *reclength) */
static void find_range(const simgpu_launch *l, struct walk *w)
{
	int height = SIMGPU_ARG(l, 0, int);
	const int *start = SIMGPU_ARG(l, 3, const int *);
	const int *end = SIMGPU_ARG(l, 4, const int *);
	int *recstart = SIMGPU_ARG(l, 5, int *);
	int *reclength = SIMGPU_ARG(l, 6, int *);

	for (unsigned q = 0; q < l->grid.x; q++) {
		int lo = start[q], hi = end[q];
		if (w->sec)
			sectors_next_block(w->sec);
		const struct knode *a = &w->kn[descend(w, height, lo)];
		const struct knode *b = &w->kn[descend(w, height, hi)];
		int na = leaf_keys(w, a), nb = leaf_keys(w, b), below = 0, upto = 0;
		for (int t = 0; t < na; t++)
			below += a->keys[t] < lo;
		for (int t = 0; t < nb; t++)
			upto += b->keys[t] <= hi;
		if (w->sec) {
			touch(w->sec, off_in(w, &a->indices[0]));
			touch(w->sec, off_in(w, &b->indices[0]));
		} else {
			recstart[q] = a->indices[0] + below;
			reclength[q] = b->indices[0] + upto - recstart[q];
		}
	}
}

void simgpu_twin__Z10findRangeKiPK5knodeiPKiS3_PiS4_(const simgpu_launch *l)
{
	struct walk w;

	walk_init(&w, l, NULL);
	find_range(l, &w);
}

void simgpu_cost__Z10findRangeKiPK5knodeiPKiS3_PiS4_(const simgpu_launch *l, double *flops,
						       double *bytes)
{
	struct walk w;
	struct sectors tree;

	walk_init(&w, l, &tree);
	find_range(l, &w);
	*flops = w.ops;
	*bytes = sectors_close(&tree) + 4 * per_query(l);   /* lo, hi in; start, length out */
}

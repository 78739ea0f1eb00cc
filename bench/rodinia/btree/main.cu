// btree: Rodinia-style batched B+tree queries on the GPU.
//
//   btree [--size N] [--queries K] [--ranges J] [--range-size W] [--seed S]
//         [--repeat R] [--duration SEC] [--check]
//
// N records (default 1,000,000, the size of Rodinia's mil.txt) with distinct
// int keys, ascending with random gaps of 1..4 (so about 40 % of the keys a
// query draws are missing), and int values.  The host builds a B+tree of
// order ORDER = 256 over them by bulk loading: leaves hold FILL = 170 keys
// (about the 2/3 occupancy a tree built by random insertions settles at),
// internal nodes FILL children, levels upward until one root.  As in
// Rodinia (Che et al., IISWC 2009; the tree code is Aviram's bpt), the tree
// is then flattened into an array of fixed-size knodes in breadth-first
// order, root first, each with ORDER+1 key and index slots:
//
//   internal: keys[0] = INT_MIN, keys[i] = smallest key under child i,
//             unused keys = INT_MAX; indices[i] = knode of child i;
//   leaf:     keys[i] = record i's key (num_keys of them, then INT_MAX),
//             indices[i] = that record's index in records[].
//
// Two kernels, one block of ORDER threads per query, one thread per key
// slot, walking the tree one level per step with a barrier in between:
//
//   findK       (Rodinia `k 10000`): at each level the one thread t with
//               keys[t] <= key < keys[t+1] names the child; at the leaf the
//               thread holding the key reads the record's value (-1: none);
//   findRangeK  (Rodinia `j 6000 3000`): walks down for both ends of
//               [lo, hi] (hi = lo + W) at once; at the two leaves the block
//               counts keys < lo and keys <= hi (__syncthreads_count) and
//               returns the first record and the number of records in the
//               range.  Rodinia asks for ends that are keys; counting also
//               answers ends that are not.
//
// Results are integers, checked exactly against binary searches on the CPU.
//
// One run (repeated --repeat R times, or until --duration SEC passed):
// cudaMemcpy H2D the K query keys and the J range ends (lo, hi), one findK
// and one findRangeK launch, cudaMemcpy D2H answers, range starts and
// lengths.  The tree (knodes) and the records are uploaded once.
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "btree";

#include "progutil.h"

#define ORDER 256    /* key slots per node, threads per block */
#define FILL  170    /* keys per leaf, children per internal node, when built */

struct knode {
	int location;               /* own index in the knode array */
	int indices[ORDER + 1];
	int keys[ORDER + 1];
	int is_leaf;
	int num_keys;
};

/* The child of node nd that covers key, as thread t sees it: -1 if t is
 * not the one slot with keys[t] <= key < keys[t+1]. */
__device__ static int child_of(const knode *nd, int t, int key, int nelem)
{
	if (t < ORDER && nd->keys[t] <= key && nd->keys[t + 1] > key) {
		int c = nd->indices[t];
		if (c >= 0 && c < nelem)
			return c;
	}
	return -1;
}

__global__ void findK(int height, const knode *knodes, int nelem, const int *records,
		      const int *keys, int *ans)
{
	__shared__ int cur, found;
	int t = threadIdx.x, key = keys[blockIdx.x];
	if (t == 0) {
		cur = 0;
		found = -1;
	}
	__syncthreads();
	for (int lvl = 0; lvl < height; lvl++) {
		int next = child_of(&knodes[cur], t, key, nelem);
		__syncthreads();          /* every thread has read cur */
		if (next >= 0)
			cur = next;
		__syncthreads();
	}
	const knode *leaf = &knodes[cur];
	if (t < leaf->num_keys && leaf->keys[t] == key)
		found = records[leaf->indices[t]];
	__syncthreads();
	if (t == 0)
		ans[blockIdx.x] = found;
}

__global__ void findRangeK(int height, const knode *knodes, int nelem, const int *start,
			   const int *end, int *recstart, int *reclength)
{
	__shared__ int cur_lo, cur_hi;
	int t = threadIdx.x, lo = start[blockIdx.x], hi = end[blockIdx.x];
	if (t == 0)
		cur_lo = cur_hi = 0;
	__syncthreads();
	for (int lvl = 0; lvl < height; lvl++) {
		int next_lo = child_of(&knodes[cur_lo], t, lo, nelem);
		int next_hi = child_of(&knodes[cur_hi], t, hi, nelem);
		__syncthreads();
		if (next_lo >= 0)
			cur_lo = next_lo;
		if (next_hi >= 0)
			cur_hi = next_hi;
		__syncthreads();
	}
	const knode *a = &knodes[cur_lo], *b = &knodes[cur_hi];
	int below = __syncthreads_count(t < a->num_keys && a->keys[t] < lo);
	int upto = __syncthreads_count(t < b->num_keys && b->keys[t] <= hi);
	if (t == 0) {
		int first = a->indices[0] + below;
		recstart[blockIdx.x] = first;
		reclength[blockIdx.x] = b->indices[0] + upto - first;
	}
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/*
 * Bulk-load the tree over the sorted keys[0..n).  Returns the knode array
 * (breadth-first, root at 0) and sets *nelem and *height (internal levels).
 */
static knode *build_tree(const int *keys, int n, int *nelem, int *height)
{
	int count[32], first[32], levels = 0;   /* per level, leaves = level 0 */
	count[0] = (n + FILL - 1) / FILL;
	while (count[levels] > 1) {
		count[levels + 1] = (count[levels] + FILL - 1) / FILL;
		levels++;
	}
	/* breadth-first: the root level first, the leaves last */
	int total = 0;
	for (int lv = levels; lv >= 0; lv--) {
		first[lv] = total;
		total += count[lv];
	}
	knode *kn = (knode *)malloc((size_t)total * sizeof(knode));
	int *minkey = (int *)malloc((size_t)total * sizeof(int));
	if (!kn || !minkey)
		fail("host malloc of %s%s failed", "knodes", "");
	for (int i = 0; i < total; i++) {
		kn[i].location = i;
		for (int s = 0; s <= ORDER; s++) {
			kn[i].keys[s] = INT_MAX;
			kn[i].indices[s] = -1;
		}
	}
	for (int j = 0; j < count[0]; j++) {
		knode *nd = &kn[first[0] + j];
		int r0 = j * FILL, r1 = r0 + FILL < n ? r0 + FILL : n;
		for (int r = r0; r < r1; r++) {
			nd->keys[r - r0] = keys[r];
			nd->indices[r - r0] = r;
		}
		nd->is_leaf = 1;
		nd->num_keys = r1 - r0;
		minkey[first[0] + j] = keys[r0];
	}
	for (int lv = 1; lv <= levels; lv++)
		for (int j = 0; j < count[lv]; j++) {
			knode *nd = &kn[first[lv] + j];
			int c0 = j * FILL, c1 = c0 + FILL < count[lv - 1] ? c0 + FILL : count[lv - 1];
			for (int c = c0; c < c1; c++) {
				nd->keys[c - c0] = c == c0 ? INT_MIN : minkey[first[lv - 1] + c];
				nd->indices[c - c0] = first[lv - 1] + c;
			}
			nd->is_leaf = 0;
			nd->num_keys = c1 - c0;
			minkey[first[lv] + j] = minkey[first[lv - 1] + c0];
		}
	free(minkey);
	*nelem = total;
	*height = levels;
	return kn;
}

/* First index with keys[i] >= k (upper = 0) or > k (upper = 1). */
static int bound(const int *keys, int n, int k, int upper)
{
	int lo = 0, hi = n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (keys[mid] < k || (upper && keys[mid] == k))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int main(int argc, char **argv)
{
	long long size = 1000000, nq = 10000, nr = 6000, width = 3000, seed = 1, repeat = 1;
	double duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--size"))
			size = arg_int(argc, argv, &i, 1, 1LL << 28);
		else if (!strcmp(argv[i], "--queries"))
			nq = arg_int(argc, argv, &i, 1, 1LL << 26);
		else if (!strcmp(argv[i], "--ranges"))
			nr = arg_int(argc, argv, &i, 1, 1LL << 26);
		else if (!strcmp(argv[i], "--range-size"))
			width = arg_int(argc, argv, &i, 0, 1LL << 24);
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: btree [--size N] [--queries K] [--ranges J] [--range-size W] "
			       "[--seed S] [--repeat R] [--duration SEC] [--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	int n = (int)size, K = (int)nq, J = (int)nr;

	/* records: ascending keys with gaps 1..4 (max ~ 2.5 N < 2^30), values */
	uint64_t s = (uint64_t)seed;
	int *keys = (int *)malloc((size_t)n * sizeof(int));
	int *records = (int *)malloc((size_t)n * sizeof(int));
	int *qk = (int *)malloc((size_t)K * sizeof(int)), *ans = (int *)malloc((size_t)K * sizeof(int));
	int *lo = (int *)malloc((size_t)J * sizeof(int)), *hi = (int *)malloc((size_t)J * sizeof(int));
	int *rs = (int *)malloc((size_t)J * sizeof(int)), *rl = (int *)malloc((size_t)J * sizeof(int));
	if (!keys || !records || !qk || !ans || !lo || !hi || !rs || !rl)
		fail("host malloc of %s%s failed", "records and queries", "");
	int k = 0;
	for (int i = 0; i < n; i++) {
		k += 1 + (int)(splitmix64(&s) % 4);
		keys[i] = k;
		records[i] = (int)(splitmix64(&s) & 0x7fffffff);
	}
	int span = keys[n - 1] + 2;
	for (int q = 0; q < K; q++)
		qk[q] = (int)(splitmix64(&s) % (uint64_t)span);
	for (int q = 0; q < J; q++) {
		lo[q] = (int)(splitmix64(&s) % (uint64_t)span);
		hi[q] = lo[q] + (int)width;
	}
	int nelem, height;
	knode *kn = build_tree(keys, n, &nelem, &height);

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	size_t kb = (size_t)K * sizeof(int), jb = (size_t)J * sizeof(int);
	knode *dkn;
	int *drec, *dqk, *dans, *dlo, *dhi, *drs, *drl;
	CK(cudaMalloc((void **)&dkn, (size_t)nelem * sizeof(knode)));
	CK(cudaMalloc((void **)&drec, (size_t)n * sizeof(int)));
	CK(cudaMalloc((void **)&dqk, kb));
	CK(cudaMalloc((void **)&dans, kb));
	CK(cudaMalloc((void **)&dlo, jb));
	CK(cudaMalloc((void **)&dhi, jb));
	CK(cudaMalloc((void **)&drs, jb));
	CK(cudaMalloc((void **)&drl, jb));
	CK(cudaMemcpy(dkn, kn, (size_t)nelem * sizeof(knode), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(drec, records, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
	h2d += (size_t)nelem * sizeof(knode) + (size_t)n * sizeof(int);

	long long runs = 0;
	double t0 = now_s();
	while (runs < repeat || (duration > 0 && now_s() - t0 < duration)) {
		CK(cudaMemcpy(dqk, qk, kb, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dlo, lo, jb, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dhi, hi, jb, cudaMemcpyHostToDevice));
		h2d += kb + 2 * jb;
		findK<<<K, ORDER>>>(height, dkn, nelem, drec, dqk, dans);
		CK(cudaGetLastError());
		findRangeK<<<J, ORDER>>>(height, dkn, nelem, dlo, dhi, drs, drl);
		CK(cudaGetLastError());
		launches += 2;
		CK(cudaMemcpy(ans, dans, kb, cudaMemcpyDeviceToHost));
		CK(cudaMemcpy(rs, drs, jb, cudaMemcpyDeviceToHost));
		CK(cudaMemcpy(rl, drl, jb, cudaMemcpyDeviceToHost));
		d2h += kb + 2 * jb;
		runs++;
	}
	double elapsed = now_s() - t0;
	CK(cudaFree(dkn));
	CK(cudaFree(drec));
	CK(cudaFree(dqk));
	CK(cudaFree(dans));
	CK(cudaFree(dlo));
	CK(cudaFree(dhi));
	CK(cudaFree(drs));
	CK(cudaFree(drl));

	int hits = 0;
	for (int q = 0; q < K; q++)
		hits += ans[q] >= 0;
	printf("BTREE records=%d knodes=%d height=%d queries=%d hits=%d ranges=%d range_size=%lld "
	       "runs=%lld elapsed_s=%.6f\n", n, nelem, height, K, hits, J, width, runs, elapsed);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	int rc = 0;
	if (check) {
		unsigned long long hsh = fnv1a64(FNV1A64_INIT, ans, kb);
		hsh = fnv1a64(hsh, rs, jb);
		hsh = fnv1a64(hsh, rl, jb);
		printf("CHECK fnv1a64=%016llx\n", hsh);
		long long bad = 0;
		char first[160] = "";
		for (int q = 0; q < K; q++) {
			int i = bound(keys, n, qk[q], 0);
			int want = i < n && keys[i] == qk[q] ? records[i] : -1;
			if (ans[q] != want && bad++ == 0)
				snprintf(first, sizeof(first), "findK query %d key %d: got %d want %d", q,
					 qk[q], ans[q], want);
		}
		for (int q = 0; q < J; q++) {
			int a = bound(keys, n, lo[q], 0), b = bound(keys, n, hi[q], 1);
			if ((rs[q] != a || rl[q] != b - a) && bad++ == 0)
				snprintf(first, sizeof(first),
					 "findRangeK query %d [%d, %d]: got start %d len %d want %d %d", q,
					 lo[q], hi[q], rs[q], rl[q], a, b - a);
		}
		if (bad) {
			printf("FAIL %s %lld of %d answers differ (first: %s)\n", NAME, bad, K + J,
			       first);
			rc = 1;
		} else {
			printf("PASS %s records=%d height=%d queries=%d hits=%d ranges=%d\n", NAME, n,
			       height, K, hits, J);
		}
	}
	free(kn);
	free(keys);
	free(records);
	free(qk);
	free(ans);
	free(lo);
	free(hi);
	free(rs);
	free(rl);
	return rc;
}

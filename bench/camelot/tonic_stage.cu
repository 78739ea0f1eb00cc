// libcamelot-tonic.so: the stages of Camelot's four end-to-end services
// (§III-A, Table I) as Tonic networks (bench/tonic: cuDNN and cuBLAS layers),
// for bench/camelot/stage_worker.py to drive one instance of a stage with
// ctypes.  The worker keeps its own device buffers - the input it received
// (a hand-off from the previous stage, or bytes) and the output it hands on
// - and this library runs a batch between them:
//
//   1. ct_adapt turns the previous stage's floats into this net's input
//      units, from a hash of their bits and positions: an image net's pixels
//      in [-0.5, 0.5), a word net's feature indices in its vocabularies.
//      The networks are untrained; what matters is that every query's input
//      comes from its predecessor's output, deterministically, and at a
//      scale the network can tell apart (a predecessor's softmax gives
//      values near 1/classes, which repeated as pixels vanish under the
//      first layer's biases and ReLU: every query would get the same result);
//   2. gpu_net_run_dev runs the forward pass on the units and copies the
//      result to the output buffer, device to device.
//
// A query is `units` units: images of an image net, words of a word net.  A
// batch of image queries is one forward pass of queries x units images
// (every image is computed alone).  A word net runs each query's sentence
// alone: its windows span neighbouring words, so one sentence per pass
// keeps a query's result independent of how queries were batched.
//
// The adapt kernel is integer hashing and exact FP32 steps (tonic_adapt.h,
// shared with its host twin tonic_stage_twins.c): the same bits on both.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tonic/gpu.h"
#include "../tonic/net.h"
#include "../tonic/ref.h"
#include "tonic_adapt.h"

#define CT_ABI 1
#define THREADS 256
#define MAX_BLOCKS 16384

static_assert(CT_MAX_FEATS == NET_MAX_FEATS, "tonic_adapt.h's feature bound is net.h's");

struct ct {
	struct net_plan  p;
	struct gpu_net  *g;
	float           *params;          // host copy: the reference forward pass reads it
	void            *in;              // device: one pass's input units
	int              units;           // units per query
	struct ct_rows   rows;
};

static unsigned blocks_for(long long total)
{
	long long b = (total + THREADS - 1) / THREADS;
	return (unsigned)(b < 1 ? 1 : (b > MAX_BLOCKS ? MAX_BLOCKS : b));
}

// Query q's per_q input values from its in_n floats at in + q * in_n, x =
// in[q * in_n + j % in_n] for value j, h = mix(bits of x, j):
// nfeat == 0: pixels, out_f[q * per_q + j] = ((h >> 8) & 0xffff) / 65536 - 0.5
//             (exact in FP32: the same bits everywhere);
// nfeat > 0:  word features, feature f = j % nfeat of word j / nfeat is
//             1 + h % (rows.n[f] - 1) (0 when the feature has one row).
extern "C" __global__ void camelot_tonic_adapt(const float *in, long long in_n, void *out, long long per_q,
					       int queries, int nfeat, struct ct_rows rows)
{
	long long total = (long long)queries * per_q;

	for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
	     t += (long long)gridDim.x * blockDim.x) {
		long long q = t / per_q, j = t % per_q;

		ct_adapt_one(__float_as_uint(in[q * in_n + j % in_n]), j, t, out, nfeat, &rows);
	}
}

static int fail(char *err, size_t errlen, const char *what, cudaError_t e)
{
	snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
	return -1;
}

extern "C" int camelot_tonic_abi(void)
{
	return CT_ABI;
}

extern "C" void camelot_tonic_close(struct ct *c)
{
	if (!c)
		return;
	gpu_net_close(c->g);
	cudaFree(c->in);
	free(c->params);
	free(c);
}

// A stage instance of net `name` at `width` (res > 0: an image net's input
// side), `units` units per query, at most `queries` queries per batch.
extern "C" struct ct *camelot_tonic_open(const char *name, double width, int res, int units, int queries,
					 unsigned long long seed, char *err, size_t errlen)
{
	const struct net_def *d = net_find(name);
	struct ct *c;
	int max_size;
	cudaError_t e;

	if (!d) {
		snprintf(err, errlen, "unknown net %s (one of: %s)", name, net_names());
		return NULL;
	}
	if (units < 1 || queries < 1 || (long long)units * queries > 65536) {
		snprintf(err, errlen, "units %d and queries %d must be >= 1, at most 65536 units a batch", units,
			 queries);
		return NULL;
	}
	max_size = d->input == TONIC_IMAGES ? units * queries : units;
	c = (struct ct *)calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "out of host memory");
		return NULL;
	}
	c->units = units;
	if (net_plan_make(&c->p, d, width, res, max_size, seed, err, errlen))
		goto out;
	for (int f = 0; f < NET_MAX_FEATS; f++)
		c->rows.n[f] = f < d->nfeat ? d->feat[f].rows : 0;
	c->params = (float *)malloc(c->p.nparams * sizeof(float));
	if (!c->params) {
		snprintf(err, errlen, "cannot allocate %zu parameters", c->p.nparams);
		goto out;
	}
	net_params_fill(&c->p, c->params);
	e = cudaMalloc(&c->in, (size_t)max_size * c->p.unit_bytes);
	if (e != cudaSuccess) {
		fail(err, errlen, "cudaMalloc (input units)", e);
		goto out;
	}
	c->g = gpu_net_open(&c->p, c->params, err, errlen);
	if (!c->g)
		goto out;
	return c;
out:
	camelot_tonic_close(c);
	return NULL;
}

// Floats of one query's output (units x the net's outputs per unit).
extern "C" long long camelot_tonic_out_n(const struct ct *c)
{
	return (long long)c->units * c->p.out_per;
}

// Input values (floats or word features) of one query.
extern "C" long long camelot_tonic_in_units(const struct ct *c)
{
	return (long long)c->units * (long long)c->p.unit_in;
}

static int adapt(struct ct *c, const float *in, long long in_n, int queries, char *err, size_t errlen)
{
	long long per_q = camelot_tonic_in_units(c);
	int nfeat = c->p.def->input == TONIC_WORDS ? c->p.def->nfeat : 0;
	cudaError_t e;

	camelot_tonic_adapt<<<blocks_for(queries * per_q), THREADS>>>(in, in_n, c->in, per_q, queries,
								       nfeat, c->rows);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return fail(err, errlen, "camelot_tonic_adapt launch", e);
	if ((e = cudaDeviceSynchronize()) != cudaSuccess)
		return fail(err, errlen, "camelot_tonic_adapt", e);
	return 0;
}

// A batch: `queries` queries of in_n floats each at `in` (device) -> their
// outputs, camelot_tonic_out_n floats each, at `out` (device).  *device_s:
// the forward passes' device time.  0, or -1 with the reason in err.
extern "C" int camelot_tonic_run(struct ct *c, const float *in, long long in_n, int queries, float *out,
				 double *device_s, char *err, size_t errlen)
{
	long long out_n = camelot_tonic_out_n(c);
	double s = 0;

	*device_s = 0;
	if (in_n < 1 || queries < 1) {
		snprintf(err, errlen, "%d queries of %lld floats", queries, in_n);
		return -1;
	}
	if (c->p.def->input == TONIC_IMAGES) {
		if (queries * c->units > c->p.max_size) {
			snprintf(err, errlen, "%d queries of %d images: more than %d", queries, c->units,
				 c->p.max_size);
			return -1;
		}
		if (adapt(c, in, in_n, queries, err, errlen))
			return -1;
		return gpu_net_run_dev(c->g, queries * c->units, c->in, out, device_s, err, errlen);
	}
	for (int q = 0; q < queries; q++) {
		if (adapt(c, in + (long long)q * in_n, in_n, 1, err, errlen) ||
		    gpu_net_run_dev(c->g, c->units, c->in, out + q * out_n, &s, err, errlen))
			return -1;
		*device_s += s;
	}
	return 0;
}

// The CPU reference (bench/tonic/ref.c) of camelot_tonic_run's result, for
// tests: the same adapt step (host twin arithmetic), then net_ref_forward.
extern "C" int camelot_tonic_reference(struct ct *c, const float *in, long long in_n, int queries, float *out,
				       char *err, size_t errlen)
{
	long long per_q = camelot_tonic_in_units(c), out_n = camelot_tonic_out_n(c);
	int words = c->p.def->input == TONIC_WORDS, nfeat = words ? c->p.def->nfeat : 0;
	int passes = words ? queries : 1, per_pass = words ? 1 : queries;
	void *units;

	if (in_n < 1 || queries < 1 || (!words && (long long)queries * c->units > c->p.max_size) ||
	    (words && c->units > c->p.max_size)) {
		snprintf(err, errlen, "%d queries of %lld floats: not what this stage was opened for", queries, in_n);
		return -1;
	}
	units = malloc((size_t)per_pass * per_q * 4);
	if (!units) {
		snprintf(err, errlen, "out of host memory");
		return -1;
	}
	for (int k = 0; k < passes; k++) {
		const float *qin = in + (long long)k * in_n;

		for (long long t = 0; t < per_pass * per_q; t++) {
			long long q = t / per_q, j = t % per_q;
			float x = qin[q * in_n + j % in_n];
			uint32_t bits;

			memcpy(&bits, &x, sizeof(bits));
			ct_adapt_one(bits, j, t, units, nfeat, &c->rows);
		}
		if (net_ref_forward(&c->p, c->params, per_pass * c->units, units, out + k * out_n)) {
			snprintf(err, errlen, "reference forward pass failed");
			free(units);
			return -1;
		}
	}
	free(units);
	return 0;
}

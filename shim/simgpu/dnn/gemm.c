/*
 * gemm.c - the GEMM core behind sgpu_sgemm (cuBLAS) and
 * sgpu_cudnn_conv_gemm (cuDNN's GEMM convolution): strided views, fp32
 * accumulation, the beta == 0 rule.  Compiled into both libraries.
 *
 * Blocked so that a panel of B stays in cache while every row of A passes
 * over it: op(B) is packed row-major (k x n) once per problem, the output
 * is accumulated NB columns at a time in a scratch panel and written once.
 * When memory for that is short, a plain triple loop does the same math.
 */
#include <stdlib.h>
#include <string.h>

#include "dnn_impl.h"

#define NB 256     /* output columns per panel */
#define KB 256     /* depth per pass over the panel */

/* Without scratch memory: one dot product per output element. */
static void gemm_plain(const float *A, const float *B, float *C, const struct sgpu_gemm_args *g,
		       float alpha, float beta)
{
	for (int i = 0; i < g->m; i++)
		for (int j = 0; j < g->n; j++) {
			float acc = 0.0f, *c = C + i * g->c_rs + j * g->c_cs;

			if (alpha != 0.0f)
				for (int p = 0; p < g->k; p++)
					acc += A[i * g->a_rs + p * g->a_cs] * B[p * g->b_rs + j * g->b_cs];
			*c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
		}
}

static void gemm_one(const float *A, const float *B, float *C, const struct sgpu_gemm_args *g,
		     float alpha, float beta)
{
	int m = g->m, n = g->n, k = g->k;
	float *bp = NULL, *acc = NULL;

	if (m <= 0 || n <= 0)
		return;
	if (k > 0 && alpha != 0.0f) {
		bp = malloc((size_t)k * (size_t)n * sizeof(float));
		acc = malloc((size_t)m * NB * sizeof(float));
		if (!bp || !acc) {
			free(bp);
			free(acc);
			gemm_plain(A, B, C, g, alpha, beta);
			return;
		}
		for (int p = 0; p < k; p++)
			for (int j = 0; j < n; j++)
				bp[(size_t)p * n + j] = B[p * g->b_rs + j * g->b_cs];
	}
	for (int j0 = 0; j0 < n; j0 += NB) {
		int nb = n - j0 < NB ? n - j0 : NB;

		if (acc) {
			memset(acc, 0, (size_t)m * NB * sizeof(float));
			for (int p0 = 0; p0 < k; p0 += KB) {
				int pe = k - p0 < KB ? k : p0 + KB;

				for (int i = 0; i < m; i++) {
					float *crow = acc + (size_t)i * NB;

					for (int p = p0; p < pe; p++) {
						float a = A[i * g->a_rs + p * g->a_cs];
						const float *brow = bp + (size_t)p * n + j0;

						for (int j = 0; j < nb; j++)
							crow[j] += a * brow[j];
					}
				}
			}
		}
		for (int i = 0; i < m; i++)
			for (int j = 0; j < nb; j++) {
				float s = acc ? acc[(size_t)i * NB + j] : 0.0f;
				float *c = C + i * g->c_rs + (long long)(j0 + j) * g->c_cs;

				*c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
			}
	}
	free(bp);
	free(acc);
}

void sgpu_gemm_run(const float *A, const float *B, float *C, const struct sgpu_gemm_args *g)
{
	/* device pointer mode: the scalars are read when the kernel runs */
	float alpha = g->alpha_dev ? *g->alpha_dev : g->alpha;
	float beta = g->beta_dev ? *g->beta_dev : g->beta;

	for (int b = 0; b < g->batch; b++)
		gemm_one(A + b * g->stride_a, B + b * g->stride_b, C + b * g->stride_c, g, alpha,
			 beta);
}

/* 2mnk multiply-adds, plus the epilogue; A, B read once, C written (and
 * read when beta may be non-zero). */
void sgpu_gemm_cost(const struct sgpu_gemm_args *g, double *flops, double *bytes)
{
	double m = g->m, n = g->n, k = g->k, b = g->batch;
	int reads_c = g->beta_dev || g->beta != 0.0f;

	*flops = b * (2.0 * m * n * k + (reads_c ? 2.0 : 1.0) * m * n);
	*bytes = b * sizeof(float) * (m * k + k * n + (reads_c ? 2.0 : 1.0) * m * n);
}

void sgpu_gemm_grid(const struct sgpu_gemm_args *g, unsigned *gx, unsigned *gy, unsigned *gz)
{
	*gx = sgpu_blocks(g->m, 64, 0x7fffffff);
	*gy = sgpu_blocks(g->n, 64, 65535);
	*gz = sgpu_blocks(g->batch, 1, 65535);
}

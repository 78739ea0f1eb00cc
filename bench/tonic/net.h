/*
 * net.h - Tonic networks as plain data, and their instantiated plan.
 *
 * A network definition (nets/<name>.c) lists its layers at the full
 * Tonic/DjiNN shapes.  net_plan_make() instantiates it for one service:
 * channel and unit counts scaled by --width, image side set by --res,
 * activations sized for --max-size, and every parameter given its place
 * in one float blob (weights, then bias, layer after layer).  The GPU path
 * (gpu.cu) and the CPU reference (ref.c) both read only the plan and the
 * blob, so they cannot disagree about shapes.
 *
 * Layouts.  Activations are NCHW float32, one "sample" per image, or per
 * word for word nets.  Weights are row-major: conv K x C x R x S, fully
 * connected out x in, window W x hidden x D (one hidden x D matrix per
 * position in the window), embedding tables rows x dim, row 0 = padding.
 */
#ifndef TONIC_NET_H
#define TONIC_NET_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NET_MAX_LAYERS 24
#define NET_MAX_FEATS  4

enum layer_kind {
	L_CONV,     /* cudnnConvolutionForward + cudnnAddTensor (bias) [+ ReLU]   */
	L_POOL,     /* cudnnPoolingForward, max                                   */
	L_FC,       /* cublasSgemm or cublasGemmEx + cudnnAddTensor [+ ReLU]      */
	L_SOFTMAX,  /* cudnnSoftmaxForward over each sample's channels            */
	L_EMBED,    /* word nets: feature lookup of each word, padded by win / 2
	               words of row 0 at both ends (custom kernel)                */
	L_WINDOW,   /* word nets: linear layer over a window of words
	               (cublasSgemmStridedBatched, one GEMM per window position,
	               then a custom kernel sums the shifted products + bias +
	               activation)                                                */
};

enum act_kind { ACT_NONE, ACT_RELU, ACT_HARDTANH };
enum gemm_kind { GEMM_SGEMM, GEMM_EX };

struct layer_def {
	enum layer_kind kind;
	int             out;     /* CONV filters; FC / WINDOW units            */
	int             win;     /* CONV / POOL square window; EMBED / WINDOW
	                            words in the window                        */
	int             stride;  /* CONV / POOL                                */
	int             pad;     /* CONV                                       */
	enum act_kind   act;     /* CONV / FC / WINDOW                         */
	enum gemm_kind  gemm;    /* FC                                         */
	int             fixed;   /* 1: `out` is a class count, never scaled    */
};

struct feat_def {
	const char *name;
	int         rows;        /* vocabulary, row 0 included (padding)       */
	int         dim;
};

struct net_def {
	const char       *name;
	const char       *about;
	enum tonic_input  input;
	int               c, hw;             /* images: channels, native side  */
	int               nfeat;             /* words: features per word       */
	struct feat_def   feat[NET_MAX_FEATS];
	int               nlayers;
	struct layer_def  layer[NET_MAX_LAYERS];
};

/* One layer, instantiated: per-sample shapes and where its parameters are. */
struct layer_plan {
	const struct layer_def *def;
	int    out;                  /* `out` after --width                    */
	int    in_c, in_h, in_w;     /* per sample                             */
	int    out_c, out_h, out_w;
	size_t w_off, w_len;         /* in the blob, in floats                 */
	size_t b_off, b_len;
	int    fan_in;               /* inputs of one output                   */
};

struct net_plan {
	const struct net_def *def;
	int               nlayers;
	struct layer_plan l[NET_MAX_LAYERS];
	int               max_size;   /* images per batch / words per sentence */
	int               halo;       /* word nets: padding words on each side */
	uint64_t          seed;
	size_t            nparams;    /* floats in the blob                     */
	size_t            unit_in;    /* input elements per image / word        */
	size_t            unit_bytes; /* input bytes per image / word           */
	int               out_per;    /* output floats per image / word         */
	size_t            max_act;    /* floats of the largest activation       */
	size_t            scratch;    /* floats of WINDOW's per-position GEMMs  */
	int               nops;       /* operators of one forward pass          */
};

/* The six Tonic services, and the stages of Camelot's four end-to-end
 * services (Table I) but face recognition, which is face. */
extern const struct net_def net_face, net_dig, net_imc, net_pos, net_chk, net_ner;
extern const struct net_def net_fsr, net_vgg, net_cap, net_sem, net_gan, net_bert, net_nmt;

/* The definition called `name`, or NULL. */
const struct net_def *net_find(const char *name);

/* Names of all nets, space-separated (for --help). */
const char *net_names(void);

/*
 * Instantiate `d`: width scales every non-fixed `out` (at least 1), res > 0
 * replaces an image net's input side.  Returns 0, or -1 with a message in
 * err when a layer's output would be empty or a size is out of range.
 */
int net_plan_make(struct net_plan *p, const struct net_def *d, double width, int res,
		  int max_size, uint64_t seed, char *err, size_t errlen);

/*
 * Operators (Abacus): one per library call or kernel launch of the forward
 * pass, numbered in issue order.  A layer issues its main call(s) - CONV,
 * POOL, FC and SOFTMAX one library call, EMBED one lookup kernel per input
 * feature, WINDOW the strided-batched GEMM and the sum kernel - then, for
 * CONV and FC, cudnnAddTensor (bias) and, with ReLU, cudnnActivationForward.
 * gpu.cu numbers its calls the same way and checks the total.
 */
int net_layer_ops(const struct net_plan *p, int layer);

/* Samples a layer's output holds for an input of `size` (word nets: the
 * EMBED output and the WINDOW GEMMs carry the halo). */
int net_rows_of(const struct net_plan *p, int size, int with_halo);

/* Deterministic parameters (a counter-based generator seeded by p->seed). */
void net_params_fill(const struct net_plan *p, float *blob);

/* The synthetic input of `size`: image i / word i is the same in every
 * size, so a larger input extends a smaller one. */
void net_input_fill(const struct net_plan *p, int size, void *in);

/* Word nets: the table row of a client's id (row 0 is padding). */
static inline int net_word_row(int32_t id, int rows)
{
	return rows > 1 ? 1 + (int)((uint32_t)id % (uint32_t)(rows - 1)) : 0;
}

/* FNV-1a 64 over n bytes. */
uint64_t net_fnv1a64(const void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif

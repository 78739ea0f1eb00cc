/*
 * nmt - text translation (Camelot text-to-text, 2nd stage): an OpenNMT
 * Transformer-base-style translator (d_model 512, 6 encoder and 6 decoder
 * layers of feed-forward 2048, a shared 32000-entry BPE vocabulary), one
 * target word per source word, softmax over the vocabulary.
 *
 * Approximations: attention's token-to-token products, layer normalisation
 * and residuals are omitted; a layer is per-word feed-forward arithmetic,
 * its attention projections (4 of 512 x 512 in the encoder, 8 in the
 * decoder: self and cross) folded into the hidden width, and decoding is
 * one pass over all words (no autoregressive steps, no beam).  To fit
 * NET_MAX_LAYERS, the encoder's 6 layers are 4 WINDOW pairs of one word
 * 512 -> 4608 ReLU -> 512 and the decoder's 6 layers 4 pairs of 512 -> 6144
 * ReLU -> 512 (the same arithmetic), then the vocabulary layer.  About 121
 * MFLOP per word (multiply-add = 2): 3.6 GFLOP for a 30-word query against
 * bench/camelot/suite.py's 4.5.
 */
#include "../net.h"

#define ENC \
	{ .kind = L_WINDOW, .out = 4608, .win = 1, .act = ACT_RELU }, \
	{ .kind = L_WINDOW, .out = 512, .win = 1 }
#define DEC \
	{ .kind = L_WINDOW, .out = 6144, .win = 1, .act = ACT_RELU }, \
	{ .kind = L_WINDOW, .out = 512, .win = 1 }

const struct net_def net_nmt = {
	.name = "nmt",
	.about = "Transformer-style translator (feed-forward only), 1 word -> 32000 words",
	.input = TONIC_WORDS,
	.nfeat = 1,
	.feat = {
		{ .name = "bpe", .rows = 32000, .dim = 512 },
	},
	.nlayers = 19,
	.layer = {
		{ .kind = L_EMBED, .win = 1 },
		ENC, ENC, ENC, ENC,
		DEC, DEC, DEC, DEC,
		{ .kind = L_FC, .out = 32000, .gemm = GEMM_EX, .fixed = 1 },   /* vocabulary */
		{ .kind = L_SOFTMAX },
	},
};

/*
 * pos - part-of-speech tagging (Tonic POS): a SENNA-style window network
 * (Collobert et al., JMLR 2011).  Each word is its word embedding (50),
 * capitalisation feature (5) and suffix feature (5); a window of 5 words
 * (2 padding words beyond the sentence) feeds 300 hardtanh units, then 45
 * Penn Treebank tag scores, normalised per word.
 */
#include "../net.h"

const struct net_def net_pos = {
	.name = "pos",
	.about = "SENNA-style POS tagger, 5-word windows -> 45 tags per word",
	.input = TONIC_WORDS,
	.nfeat = 3,
	.feat = {
		{ .name = "word", .rows = 130000, .dim = 50 },
		{ .name = "caps", .rows = 5, .dim = 5 },
		{ .name = "suffix", .rows = 455, .dim = 5 },
	},
	.nlayers = 4,
	.layer = {
		{ .kind = L_EMBED, .win = 5 },
		{ .kind = L_WINDOW, .out = 300, .win = 5, .act = ACT_HARDTANH },
		{ .kind = L_FC, .out = 45, .gemm = GEMM_EX, .fixed = 1 },
		{ .kind = L_SOFTMAX },
	},
};

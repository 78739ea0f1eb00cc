/*
 * chk - chunking (Tonic CHK): a SENNA-style window network.  Each word is
 * its word embedding (50), capitalisation (5) and part-of-speech tag
 * feature (5); a window of 5 words feeds 300 hardtanh units, then 42 chunk
 * tag scores (IOBES), normalised per word.
 */
#include "../net.h"

const struct net_def net_chk = {
	.name = "chk",
	.about = "SENNA-style chunker, 5-word windows -> 42 tags per word",
	.input = TONIC_WORDS,
	.nfeat = 3,
	.feat = {
		{ .name = "word", .rows = 130000, .dim = 50 },
		{ .name = "caps", .rows = 5, .dim = 5 },
		{ .name = "postag", .rows = 46, .dim = 5 },
	},
	.nlayers = 4,
	.layer = {
		{ .kind = L_EMBED, .win = 5 },
		{ .kind = L_WINDOW, .out = 300, .win = 5, .act = ACT_HARDTANH },
		{ .kind = L_FC, .out = 42, .gemm = GEMM_EX, .fixed = 1 },
		{ .kind = L_SOFTMAX },
	},
};

/*
 * ner - named-entity recognition (Tonic NER): a SENNA-style window network.
 * Each word is its word embedding (50), capitalisation (5) and gazetteer
 * feature (5: person, location, organisation, misc, none); a window of 5
 * words feeds 300 hardtanh units, then 17 entity tag scores (IOBES over
 * four entity types, and O), normalised per word.
 */
#include "../net.h"

const struct net_def net_ner = {
	.name = "ner",
	.about = "SENNA-style entity tagger, 5-word windows -> 17 tags per word",
	.input = TONIC_WORDS,
	.nfeat = 3,
	.feat = {
		{ .name = "word", .rows = 130000, .dim = 50 },
		{ .name = "caps", .rows = 5, .dim = 5 },
		{ .name = "gazetteer", .rows = 6, .dim = 5 },
	},
	.nlayers = 4,
	.layer = {
		{ .kind = L_EMBED, .win = 5 },
		{ .kind = L_WINDOW, .out = 300, .win = 5, .act = ACT_HARDTANH },
		{ .kind = L_FC, .out = 17, .gemm = GEMM_EX, .fixed = 1 },
		{ .kind = L_SOFTMAX },
	},
};

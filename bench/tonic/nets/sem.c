/*
 * sem - semantic understanding (Camelot text-to-img, 1st stage): a 2-layer
 * LSTM of 256 hidden units over a sentence of word embeddings (256), each
 * word leaving a 256-float vector for the image generator (gan).
 *
 * Approximations: no recurrence.  Each word goes through four per-word
 * layers with the arithmetic of the two LSTM layers' step: per layer, the
 * gates' input product (256 -> 1024, 4 gates x 256) and a 1024 -> 256 layer
 * with the multiply-adds of the recurrent product (4 gates x 256 over the
 * 256 hidden units) in place of the cell update; ReLU in place of the
 * gates' sigmoid/tanh; the first is a WINDOW of one word, the rest fully
 * connected.  The last (the hidden state handed on) is fixed at 256.  About
 * 2.1 MFLOP per word (multiply-add = 2): 63 MFLOP for a 30-word query
 * against bench/camelot/suite.py's 83 (its LSTM plus an 'embed' layer).
 */
#include "../net.h"

const struct net_def net_sem = {
	.name = "sem",
	.about = "LSTM-style sentence encoder (2 x 256), 1 word -> 256 floats per word",
	.input = TONIC_WORDS,
	.nfeat = 1,
	.feat = {
		{ .name = "word", .rows = 20000, .dim = 256 },
	},
	.nlayers = 5,
	.layer = {
		{ .kind = L_EMBED, .win = 1 },
		{ .kind = L_WINDOW, .out = 1024, .win = 1, .act = ACT_RELU },   /* layer 1: gates */
		{ .kind = L_FC, .out = 256, .act = ACT_RELU },                  /* layer 1: h */
		{ .kind = L_FC, .out = 1024, .act = ACT_RELU },                 /* layer 2: gates */
		{ .kind = L_FC, .out = 256, .fixed = 1 },                       /* layer 2: h */
	},
};

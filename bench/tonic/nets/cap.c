/*
 * cap - image caption (Camelot img-to-text, 2nd stage): an LSTM decoder
 * (hidden 512, 2 layers, 20 steps; Show-and-Tell style) on the 4096 fc7
 * features of vgg, then a 10000-word vocabulary and softmax.  The input is
 * one "image" of 4096 channels and side 1 (the vgg features).
 *
 * Approximations: the features go through a 512-unit ReLU embedding; each
 * decoding step is one fully connected 2048 -> 2048 ReLU layer, the GEMM
 * work of that step's two LSTM layers (each 4 gates x 512 over input and
 * hidden, 2048 x 1024), so the 20 steps are 20 dependent GEMMs in a
 * chain; the gates' sigmoid/tanh and the cell state become ReLU; the
 * vocabulary projection and softmax run once, on the last step's output
 * (one word distribution per image, not one per step).  About 0.21 GFLOP
 * per image (multiply-add = 2) against bench/camelot/suite.py's 0.37, whose
 * vocabulary layer is counted on all 20 steps.
 */
#include "../net.h"

#define STEP { .kind = L_FC, .out = 2048, .act = ACT_RELU }

const struct net_def net_cap = {
	.name = "cap",
	.about = "LSTM-style captioner (20 steps), 4096 features -> 10000 words",
	.input = TONIC_IMAGES,
	.c = 4096, .hw = 1,
	.nlayers = 23,
	.layer = {
		{ .kind = L_FC, .out = 512, .act = ACT_RELU },   /* image embedding */
		STEP, STEP, STEP, STEP, STEP, STEP, STEP, STEP, STEP, STEP,
		STEP, STEP, STEP, STEP, STEP, STEP, STEP, STEP, STEP, STEP,
		{ .kind = L_FC, .out = 10000, .fixed = 1 },      /* vocabulary */
		{ .kind = L_SOFTMAX },
	},
};

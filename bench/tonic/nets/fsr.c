/*
 * fsr - image enhancement (Camelot img-to-img, 2nd stage): an FSRCNN-style
 * net (Dong et al., ECCV 2016; FSRCNN(56, 12, 4)) on 3x64x64 images:
 * feature extraction conv 5x5 56, shrinking conv 1x1 12, mapping by four
 * conv 3x3 12, expanding conv 1x1 56, then the 9x9 deconvolution to the
 * 3 output channels.
 *
 * Approximations: the deconvolution is a 9x9 convolution (pad 4) at the
 * input resolution, so the output is 3x64x64 (no upscaling; the same
 * arithmetic per input pixel as FSRCNN's deconvolution); PReLU is ReLU;
 * all three colour channels are processed (FSRCNN works on luminance).
 * About 0.2 GFLOP per image (multiply-add = 2), 2.6x below the 0.5 GFLOP
 * bench/camelot/suite.py gives this stage.
 */
#include "../net.h"

const struct net_def net_fsr = {
	.name = "fsr",
	.about = "FSRCNN-style enhancer, 3x64x64 -> 3x64x64",
	.input = TONIC_IMAGES,
	.c = 3, .hw = 64,
	.nlayers = 8,
	.layer = {
		{ .kind = L_CONV, .out = 56, .win = 5, .stride = 1, .pad = 2, .act = ACT_RELU }, /* feature */
		{ .kind = L_CONV, .out = 12, .win = 1, .stride = 1, .act = ACT_RELU },            /* shrink */
		{ .kind = L_CONV, .out = 12, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU }, /* map x4 */
		{ .kind = L_CONV, .out = 12, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU },
		{ .kind = L_CONV, .out = 12, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU },
		{ .kind = L_CONV, .out = 12, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU },
		{ .kind = L_CONV, .out = 56, .win = 1, .stride = 1, .act = ACT_RELU },            /* expand */
		{ .kind = L_CONV, .out = 3, .win = 9, .stride = 1, .pad = 4, .fixed = 1 },        /* deconv */
	},
};

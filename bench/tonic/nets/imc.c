/*
 * imc - image classification (Tonic IMC): an AlexNet-style net on
 * 3x227x227 images, 1000 classes.  Five convolutions (11x11/4, 5x5, 3x3 x3)
 * with ReLU, 3x3/2 max pooling after the 1st, 2nd and 5th, two 4096-unit
 * ReLU layers.  Differences from AlexNet: no local response normalisation
 * and no grouped convolutions (conv2, 4, 5 see all input channels);
 * dropout is the identity at inference anyway.
 */
#include "../net.h"

const struct net_def net_imc = {
	.name = "imc",
	.about = "AlexNet-style classifier, 3x227x227 -> 1000",
	.input = TONIC_IMAGES,
	.c = 3, .hw = 227,
	.nlayers = 12,
	.layer = {
		{ .kind = L_CONV, .out = 96, .win = 11, .stride = 4, .act = ACT_RELU },
		{ .kind = L_POOL, .win = 3, .stride = 2 },
		{ .kind = L_CONV, .out = 256, .win = 5, .stride = 1, .pad = 2, .act = ACT_RELU },
		{ .kind = L_POOL, .win = 3, .stride = 2 },
		{ .kind = L_CONV, .out = 384, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU },
		{ .kind = L_CONV, .out = 384, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU },
		{ .kind = L_CONV, .out = 256, .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU },
		{ .kind = L_POOL, .win = 3, .stride = 2 },
		{ .kind = L_FC, .out = 4096, .act = ACT_RELU },
		{ .kind = L_FC, .out = 4096, .act = ACT_RELU },
		{ .kind = L_FC, .out = 1000, .fixed = 1 },
		{ .kind = L_SOFTMAX },
	},
};

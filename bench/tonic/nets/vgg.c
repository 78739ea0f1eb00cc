/*
 * vgg - image feature extraction (Camelot img-to-text, 1st stage): VGG-16
 * (Simonyan and Zisserman, ICLR 2015) on 3x224x224 images: 13 convolutions
 * 3x3 (pad 1) with ReLU in five groups (64 x2, 128 x2, 256 x3, 512 x3,
 * 512 x3), each group followed by 2x2/2 max pooling, then fc6 and fc7 of
 * 4096 ReLU units.  It stops at fc7: those 4096 features are what the
 * caption stage (cap) takes, so there is no fc8 and no softmax.
 *
 * Exact shapes otherwise (dropout is the identity at inference).  About
 * 31 GFLOP per image counting a multiply-add as 2; bench/camelot/suite.py's
 * 14.9 GFLOP is the usual "15.5 GFLOP" that counts it as 1.
 */
#include "../net.h"

#define CONV3(k) { .kind = L_CONV, .out = (k), .win = 3, .stride = 1, .pad = 1, .act = ACT_RELU }
#define POOL2    { .kind = L_POOL, .win = 2, .stride = 2 }

const struct net_def net_vgg = {
	.name = "vgg",
	.about = "VGG-16 features, 3x224x224 -> 4096 (fc7)",
	.input = TONIC_IMAGES,
	.c = 3, .hw = 224,
	.nlayers = 20,
	.layer = {
		CONV3(64), CONV3(64), POOL2,
		CONV3(128), CONV3(128), POOL2,
		CONV3(256), CONV3(256), CONV3(256), POOL2,
		CONV3(512), CONV3(512), CONV3(512), POOL2,
		CONV3(512), CONV3(512), CONV3(512), POOL2,
		{ .kind = L_FC, .out = 4096, .act = ACT_RELU },   /* fc6 */
		{ .kind = L_FC, .out = 4096, .act = ACT_RELU },   /* fc7 */
	},
};

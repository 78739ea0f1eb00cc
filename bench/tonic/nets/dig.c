/*
 * dig - handwritten digit recognition (Tonic DIG): a LeNet-5-style net on
 * 28x28 grey images, as in DjiNN's Caffe model: two 5x5 convolutions with
 * 2x2 max pooling, a 500-unit ReLU layer and 10 class scores.
 */
#include "../net.h"

const struct net_def net_dig = {
	.name = "dig",
	.about = "LeNet-style digit classifier, 1x28x28 -> 10",
	.input = TONIC_IMAGES,
	.c = 1, .hw = 28,
	.nlayers = 7,
	.layer = {
		{ .kind = L_CONV, .out = 20, .win = 5, .stride = 1 },
		{ .kind = L_POOL, .win = 2, .stride = 2 },
		{ .kind = L_CONV, .out = 50, .win = 5, .stride = 1 },
		{ .kind = L_POOL, .win = 2, .stride = 2 },
		{ .kind = L_FC, .out = 500, .act = ACT_RELU },
		{ .kind = L_FC, .out = 10, .fixed = 1 },
		{ .kind = L_SOFTMAX },
	},
};

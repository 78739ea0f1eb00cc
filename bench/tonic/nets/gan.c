/*
 * gan - image generation (Camelot text-to-img, 2nd stage): a DC-GAN
 * generator (Radford et al., ICLR 2016) producing 3x64x64 images: the
 * projection of (text embedding, noise) to 1024 maps, then four 5x5
 * deconvolutions 1024 -> 512 -> 256 -> 128 -> 3, ReLU between, tanh at
 * the end.
 *
 * Approximations: Tonic has no upsampling, so every layer runs at the
 * output resolution.  The handed-over embedding (with the noise) is spread
 * over a small 4x64x64 input image; the projection is a 1x1 convolution to
 * 80 maps and the deconvolutions are 5x5 convolutions (pad 2) 80 -> 40 ->
 * 20 -> 10 -> 3 at 64x64: DC-GAN's halving channels, divided by 12.8 so that
 * the arithmetic stays DC-GAN's order, about 0.87 GFLOP per image
 * (multiply-add = 2; bench/camelot/suite.py: 0.9).  No batch normalisation
 * (folded into the weights at inference), no tanh: the last layer is linear.
 */
#include "../net.h"

#define DECONV(k) { .kind = L_CONV, .out = (k), .win = 5, .stride = 1, .pad = 2, .act = ACT_RELU }

const struct net_def net_gan = {
	.name = "gan",
	.about = "DC-GAN-style generator, 4x64x64 embedding -> 3x64x64 image",
	.input = TONIC_IMAGES,
	.c = 4, .hw = 64,
	.nlayers = 5,
	.layer = {
		{ .kind = L_CONV, .out = 80, .win = 1, .stride = 1, .act = ACT_RELU },    /* project */
		DECONV(40), DECONV(20), DECONV(10),
		{ .kind = L_CONV, .out = 3, .win = 5, .stride = 1, .pad = 2, .fixed = 1 }, /* deconv4 */
	},
};

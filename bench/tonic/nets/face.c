/*
 * face - face recognition (Tonic FACE): a DeepFace-style net (Taigman et
 * al., CVPR 2014) on aligned 3x152x152 faces: C1 32 11x11, M2 3x3/2 max
 * pooling, C3 16 9x9, then the locally connected L4 16 9x9, L5 16 7x7/2 and
 * L6 16 5x5, F7 4096 and F8 4030 identities.
 *
 * Locally connected layers (a separate filter per output position) are
 * approximated by convolutions of the same shape: the same output sizes
 * and per-position arithmetic, far fewer parameters.
 */
#include "../net.h"

const struct net_def net_face = {
	.name = "face",
	.about = "DeepFace-style identifier, 3x152x152 -> 4030",
	.input = TONIC_IMAGES,
	.c = 3, .hw = 152,
	.nlayers = 9,
	.layer = {
		{ .kind = L_CONV, .out = 32, .win = 11, .stride = 1, .act = ACT_RELU }, /* C1 */
		{ .kind = L_POOL, .win = 3, .stride = 2 },                              /* M2 */
		{ .kind = L_CONV, .out = 16, .win = 9, .stride = 1, .act = ACT_RELU },  /* C3 */
		{ .kind = L_CONV, .out = 16, .win = 9, .stride = 1, .act = ACT_RELU },  /* L4 */
		{ .kind = L_CONV, .out = 16, .win = 7, .stride = 2, .act = ACT_RELU },  /* L5 */
		{ .kind = L_CONV, .out = 16, .win = 5, .stride = 1, .act = ACT_RELU },  /* L6 */
		{ .kind = L_FC, .out = 4096, .act = ACT_RELU },                         /* F7 */
		{ .kind = L_FC, .out = 4030, .fixed = 1 },                              /* F8 */
		{ .kind = L_SOFTMAX },
	},
};

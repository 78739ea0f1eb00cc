/*
 * bert - text summarization (Camelot text-to-text, 1st stage): a
 * BERT-base-style encoder (Devlin et al., NAACL 2019) over a sentence of
 * WordPiece tokens (30522, embedding 768), every token leaving a
 * 768-float vector.
 *
 * Approximations: attention is omitted (its Q/K/V/output projections and
 * the token-to-token products), as are residuals, the position and segment
 * embeddings and layer normalisation (but the last, see below); an encoder
 * block is its per-token feed-forward pair, two WINDOW layers of one word.
 * BERT's 12 blocks of 768 -> 3072 ReLU (GELU) -> 768 would take 25 layers
 * with the embedding, over NET_MAX_LAYERS (24), so there are 8 wider blocks
 * of 768 -> 4608 -> 768: the same total arithmetic, 113 MFLOP per token
 * (multiply-add = 2), 14.5 GFLOP per 128-token query against
 * bench/camelot/suite.py's 22.  The last block's 768 outputs are fixed
 * (what the next stage gets does not change with --width), and a softmax
 * over each token's 768 features stands in for the final layer
 * normalisation: a bounded output, on which --check's relative tolerance
 * holds (16 FP32 layers leave ~1e-5 absolute error on raw outputs of ~1,
 * too much for the ones near 0).
 */
#include "../net.h"

#define FF   { .kind = L_WINDOW, .out = 4608, .win = 1, .act = ACT_RELU }
#define OUT  { .kind = L_WINDOW, .out = 768, .win = 1 }
#define BLOCK FF, OUT

const struct net_def net_bert = {
	.name = "bert",
	.about = "BERT-style encoder (feed-forward only), 1 token -> 768 floats per token (softmax)",
	.input = TONIC_WORDS,
	.nfeat = 1,
	.feat = {
		{ .name = "wordpiece", .rows = 30522, .dim = 768 },
	},
	.nlayers = 18,
	.layer = {
		{ .kind = L_EMBED, .win = 1 },
		BLOCK, BLOCK, BLOCK, BLOCK, BLOCK, BLOCK, BLOCK,
		FF, { .kind = L_WINDOW, .out = 768, .win = 1, .fixed = 1 },
		{ .kind = L_SOFTMAX },   /* in place of the final LayerNorm */
	},
};

/*
 * proto.h - the wire format between a Tonic service and its clients.
 *
 * Transport: a Unix stream socket (path given by the service's --socket).
 * A client may open several connections; each carries a sequence of
 * requests, and the service answers each request on its connection, in
 * order.  All integers are little-endian, structs are packed as declared
 * (every field is naturally aligned, so there is no padding).
 *
 * Request: a 24-byte header, then `nbytes` bytes of input.
 *
 *   off size field
 *     0   4  magic   TONIC_REQ_MAGIC ("TNQ1")
 *     4   4  kind    TONIC_INFER, TONIC_INFO or TONIC_INFER_RANGE
 *     8   8  id      the client's query id (echoed; also the id passed to
 *                    colocate_query_begin/end)
 *    16   4  size    input size: images in the batch (image nets) or words
 *                    in the sentence (word nets); 1..max_size
 *    20   4  nbytes  0: the service makes a deterministic synthetic input
 *                    of that size (the same for every query of that size);
 *                    else exactly size * unit_bytes input bytes follow:
 *                    float32 pixels NCHW (image nets) or, per word, one
 *                    int32 id per input feature (word nets; an id is taken
 *                    modulo the feature's vocabulary, row 0 being padding)
 *
 * A TONIC_INFER_RANGE request (Abacus operator groups) is the header with
 * nbytes 0, then 8 more bytes, struct tonic_range: {u32 start, u32 end}.
 * It issues only operators [start, end) of the network for an input of
 * `size`, where an operator is one library call (cuDNN / cuBLAS) or one
 * kernel of our own, numbered in issue order from 0 (net.h says which a
 * layer issues; the INFO reply gives their number, n_ops).  No copies run:
 * operator `start` reads whatever activations the device buffers hold (the
 * previous request's, or garbage).  The latency of a range does not depend
 * on the values, so this is what a query would take at that point.
 * It is marked as a query of its id and size (colocate_query_begin/end),
 * so a trace shows its operators as that query's tasks.  Returned:
 * device_ns, the range's device time between two CUDA events around it,
 * and start_ns (see the reply).  A range outside [0, n_ops) or
 * empty is answered TONIC_EBADREQ and the connection stays open (its 8
 * bytes were read: the stream is in step); nbytes != 0 closes it as any
 * bad header does.  Services older than this answer the kind itself with
 * TONIC_EBADREQ and report n_ops 0.
 *
 * Reply: 56 bytes.
 *
 *     0   4  magic       TONIC_REP_MAGIC ("TNR1")
 *     4   4  status      TONIC_OK, TONIC_EBADREQ (the connection is then
 *                        closed: the stream may be out of step) or
 *                        TONIC_EDEVICE (a CUDA/cuDNN/cuBLAS call failed; the
 *                        service exits after replying)
 *     8   8  id          the request's id
 *    16   8  checksum    FNV-1a 64 of the output's bytes (float32 scores,
 *                        `out_floats` of them); 0 for TONIC_INFO.
 *                        TONIC_INFER_RANGE: start_ns instead, the service's
 *                        CLOCK_MONOTONIC (ns) when the range's first event
 *                        was recorded: one clock for every process of a
 *                        host, so a client can line up co-running ranges
 *    24   8  server_ns   wall time from the request read to the result on
 *                        the host (H2D copy, network, D2H copy, sync)
 *    32   8  device_ns   device time of the same, from CUDA events around
 *                        the copies (modelled device time on simgpu)
 *    40   4  out_floats  output size: size * classes (or tags).
 *                        n_ops instead for TONIC_INFO (the operators of a
 *                        forward pass; 0 from older services) and for
 *                        TONIC_INFER_RANGE (operators run: end - start)
 *    44   4  unit_bytes  input bytes per image or per word
 *    48   4  max_size    the largest size this service accepts
 *    52   4  input_kind  TONIC_IMAGES or TONIC_WORDS
 *
 * A TONIC_INFO request (size and nbytes 0) is answered with status OK and
 * the fields n_ops, unit_bytes, max_size and input_kind filled in; it runs
 * nothing.
 */
#ifndef TONIC_PROTO_H
#define TONIC_PROTO_H

#include <stdint.h>

#define TONIC_REQ_MAGIC 0x31514e54u   /* "TNQ1" little-endian */
#define TONIC_REP_MAGIC 0x31524e54u   /* "TNR1" little-endian */

enum tonic_kind { TONIC_INFER = 0, TONIC_INFO = 1, TONIC_INFER_RANGE = 2 };
enum tonic_status { TONIC_OK = 0, TONIC_EBADREQ = 1, TONIC_EDEVICE = 2 };
enum tonic_input { TONIC_IMAGES = 0, TONIC_WORDS = 1 };

struct tonic_req {
	uint32_t magic;
	uint32_t kind;
	uint64_t id;
	uint32_t size;
	uint32_t nbytes;
};

/* follows a TONIC_INFER_RANGE header */
struct tonic_range {
	uint32_t start;
	uint32_t end;
};

struct tonic_rep {
	uint32_t magic;
	int32_t  status;
	uint64_t id;
	union {
		uint64_t checksum;
		uint64_t start_ns;      /* TONIC_INFER_RANGE */
	};
	uint64_t server_ns;
	uint64_t device_ns;
	union {
		uint32_t out_floats;
		uint32_t n_ops;         /* TONIC_INFO, TONIC_INFER_RANGE */
	};
	uint32_t unit_bytes;
	uint32_t max_size;
	uint32_t input_kind;
};

#ifdef __cplusplus
static_assert(sizeof(struct tonic_req) == 24, "request header is 24 bytes");
static_assert(sizeof(struct tonic_rep) == 56, "reply is 56 bytes");
static_assert(sizeof(struct tonic_range) == 8, "range is 8 bytes");
#else
_Static_assert(sizeof(struct tonic_req) == 24, "request header is 24 bytes");
_Static_assert(sizeof(struct tonic_rep) == 56, "reply is 56 bytes");
_Static_assert(sizeof(struct tonic_range) == 8, "range is 8 bytes");
#endif

#endif

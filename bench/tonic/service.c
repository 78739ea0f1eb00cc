/*
 * tonic-service - one Tonic/DjiNN inference service, long running.
 *
 *   tonic-service --net NAME --socket PATH [--queries N] [options]
 *   tonic-service --net NAME --check [--size N] [options]
 *
 * NAME is face, dig, imc (image nets: a query is a batch of images) or pos,
 * chk, ner (word nets: a query is one sentence).  Serving, it listens on a
 * Unix stream socket and answers requests (wire format: proto.h) until
 * killed (SIGINT/SIGTERM) or N queries are done, then prints a SUMMARY
 * line.  Each query: colocate_query_begin(id, size), H2D copy, the network,
 * D2H copy, stream sync, colocate_query_end(id), reply.  A range request
 * (TONIC_INFER_RANGE) issues only some operators of the network, between
 * the same query marks, for Abacus's operator-group sampling.
 *
 * --check runs one query of the synthetic input of --size on the GPU and
 * on the CPU reference (ref.c), prints `CHECK ... checksum=<fnv1a64>` and
 * PASS, or FAIL when an output differs by more than 1e-6 + 1e-3 * |ref|
 * (strict FP32 on both sides; the slack covers summation order).
 *
 * Options: --width F scales channels and hidden units (not class counts),
 * --res R the input side of image nets, --max-size N the largest query
 * (16 images / 128 words), --seed S the parameters and synthetic inputs.
 * Full Tonic shapes are the default; small ones keep simgpu's CPU twins fast.
 */
#define _GNU_SOURCE   /* accept4 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "colocate.h"
#include "gpu.h"
#include "net.h"
#include "ref.h"

static const char *NAME = "tonic";

#include "progutil.h"

#define MAX_CLIENTS 64

struct opts {
	const char *net, *socket;
	long long   queries, size, max_size, seed;
	double      width;
	int         res, check;
};

struct stats {
	double *server_s, *device_s;
	size_t  n, cap;
	long    errors;
	long    ranges;    /* of the n: TONIC_INFER_RANGE requests */
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static double arg_double(int argc, char **argv, int *i, double lo, double hi)
{
	char *end;
	double v;

	if (*i + 1 >= argc)
		fail("%s needs a value%s", argv[*i], "");
	v = strtod(argv[*i + 1], &end);
	if (*end || end == argv[*i + 1] || !(v >= lo && v <= hi))
		fail("bad value for %s: %s", argv[*i], argv[*i + 1]);
	*i += 1;
	return v;
}

static void usage(void)
{
	printf("usage: tonic-service --net NAME (--socket PATH [--queries N] | --check [--size N])\n"
	       "                     [--width F] [--res R] [--max-size N] [--seed S]\n"
	       "  --net NAME      %s\n"
	       "  --socket PATH   serve requests (bench/tonic/proto.h) until SIGTERM/SIGINT\n"
	       "  --queries N     ... or until N queries are answered (0: no limit)\n"
	       "  --check         one query of --size N (2) on the GPU and the CPU reference: PASS/FAIL\n"
	       "  --width F       scale channels and hidden units (1.0: Tonic's shapes)\n"
	       "  --res R         input side of image nets (default: the net's)\n"
	       "  --max-size N    largest query: images per batch (16) / words per sentence (128)\n"
	       "  --seed S        parameters and synthetic inputs (1)\n", net_names());
}

static void parse(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){ .width = 1.0, .size = 2, .seed = 1 };
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--net") && i + 1 < argc)
			o->net = argv[++i];
		else if (!strcmp(argv[i], "--socket") && i + 1 < argc)
			o->socket = argv[++i];
		else if (!strcmp(argv[i], "--queries"))
			o->queries = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--size"))
			o->size = arg_int(argc, argv, &i, 1, 65536);
		else if (!strcmp(argv[i], "--max-size"))
			o->max_size = arg_int(argc, argv, &i, 1, 65536);
		else if (!strcmp(argv[i], "--seed"))
			o->seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--width"))
			o->width = arg_double(argc, argv, &i, 1e-3, 16);
		else if (!strcmp(argv[i], "--res"))
			o->res = (int)arg_int(argc, argv, &i, 1, 4096);
		else if (!strcmp(argv[i], "--check"))
			o->check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage();
			exit(0);
		} else
			fail("unknown option %s%s (see --help)", argv[i], "");
	}
	if (!o->net || !net_find(o->net))
		fail("--net must be one of: %s%s", net_names(), "");
	if (!o->check && !o->socket)
		fail("need --socket PATH (or --check)%s%s", "", "");
}

/* ---- check mode ---- */

static int run_check(const struct net_plan *p, const float *params, const struct opts *o)
{
	char err[512];
	int n = (int)o->size;
	size_t nout = (size_t)n * p->out_per;
	float *ref = malloc(nout * sizeof(float));
	double dev_s = 0, max_abs = 0, max_rel = 0;
	size_t bad = 0, worst = 0;
	struct gpu_net *g;
	const float *got;

	if (!ref)
		fail("out of host memory%s%s", "", "");
	g = gpu_net_open(p, params, err, sizeof(err));
	if (!g)
		fail("%s%s", err, "");
	net_input_fill(p, n, gpu_net_input(g));
	if (gpu_net_run(g, n, &dev_s, err, sizeof(err)))
		fail("%s%s", err, "");
	if (net_ref_forward(p, params, n, gpu_net_input(g), ref))
		fail("reference: out of host memory%s%s", "", "");
	got = gpu_net_output(g);
	for (size_t i = 0; i < nout; i++) {
		double e = fabs((double)got[i] - ref[i]);
		double rel = e / (fabs(ref[i]) > 1e-30 ? fabs(ref[i]) : 1e-30);

		if (!(e <= 1e-6 + 1e-3 * fabs(ref[i])))   /* NaN is wrong too */
			bad++;
		if (!(e <= max_abs)) {
			max_abs = e;
			worst = i;
		}
		if (e > 1e-12 && rel > max_rel)
			max_rel = rel;
	}
	printf("CHECK net=%s size=%d out=%zu checksum=%016llx max_abs_err=%.3g max_rel_err=%.3g "
	       "device_ms=%.4f\n", p->def->name, n, nout,
	       (unsigned long long)net_fnv1a64(got, nout * sizeof(float)), max_abs, max_rel,
	       dev_s * 1e3);
	if (bad) {
		printf("FAIL %s %zu of %zu outputs off (worst %zu: got %.8g want %.8g)\n", NAME, bad,
		       nout, worst, got[worst], ref[worst]);
		gpu_net_close(g);
		free(ref);
		return 1;
	}
	printf("PASS %s size=%d max_abs_err=%.3g\n", NAME, n, max_abs);
	gpu_net_close(g);
	free(ref);
	return 0;
}

/* ---- serving ---- */

static int full_io(int fd, void *buf, size_t n, int writing)
{
	char *b = buf;

	while (n) {
		ssize_t r = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);

		if (r < 0 && errno == EINTR && !stop)
			continue;
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int listen_on(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(a.sun_path))
		fail("socket path too long: %s%s", path, "");
	strcpy(a.sun_path, path);
	/* a stale socket of a previous run: replace it, never another file */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0)
		fail("cannot listen on %s: %s", path, strerror(errno));
	return fd;
}

static void record(struct stats *s, double server_s, double device_s)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 1024;
		double *a = realloc(s->server_s, cap * sizeof(double));
		double *b = a ? realloc(s->device_s, cap * sizeof(double)) : NULL;

		if (a)
			s->server_s = a;
		if (!b)
			return;    /* keep serving; the summary misses this one */
		s->device_s = b;
		s->cap = cap;
	}
	s->server_s[s->n] = server_s;
	s->device_s[s->n] = device_s;
	s->n++;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const double *v, size_t n, double q)
{
	size_t k;

	if (!n)
		return 0;
	k = (size_t)ceil(q / 100.0 * (double)n);
	return v[k ? k - 1 : 0];
}

static void summary(const char *net, struct stats *s)
{
	double ms = 0, md = 0;

	for (size_t i = 0; i < s->n; i++)
		ms += s->server_s[i], md += s->device_s[i];
	qsort(s->server_s, s->n, sizeof(double), cmp_double);
	qsort(s->device_s, s->n, sizeof(double), cmp_double);
	printf("SUMMARY net=%s queries=%zu errors=%ld server_ms_p50=%.3f server_ms_p99=%.3f "
	       "server_ms_mean=%.3f device_ms_p50=%.3f device_ms_p99=%.3f device_ms_mean=%.3f "
	       "ranges=%ld\n",
	       net, s->n, s->errors, pct(s->server_s, s->n, 50) * 1e3,
	       pct(s->server_s, s->n, 99) * 1e3, s->n ? ms / s->n * 1e3 : 0,
	       pct(s->device_s, s->n, 50) * 1e3, pct(s->device_s, s->n, 99) * 1e3,
	       s->n ? md / s->n * 1e3 : 0, s->ranges);
	fflush(stdout);
}

/*
 * Operators [start, end) of a TONIC_INFER_RANGE request (proto.h): no
 * copies, no output.  Returns 0, or -1 when the device failed.  A range the
 * network does not have was refused before this.
 */
static int serve_range(int fd, const struct tonic_req *q, const struct tonic_range *rg,
		       struct tonic_rep *r, struct gpu_net *g, struct stats *s)
{
	char err[512];
	double t0 = now_s(), dev_s = 0;
	uint64_t start_ns = 0;

	colocate_query_begin(q->id, q->size);
	if (gpu_net_run_range(g, (int)q->size, (int)rg->start, (int)rg->end, &dev_s, &start_ns,
			      err, sizeof(err))) {
		colocate_query_end(q->id);
		fprintf(stderr, "%s: range %llu: %s\n", NAME, (unsigned long long)q->id, err);
		r->status = TONIC_EDEVICE;
		s->errors++;
		full_io(fd, r, sizeof(*r), 1);
		return -1;
	}
	colocate_query_end(q->id);
	r->server_ns = (uint64_t)llround((now_s() - t0) * 1e9);
	r->device_ns = (uint64_t)llround(dev_s * 1e9);
	r->start_ns = start_ns;
	r->n_ops = rg->end - rg->start;
	record(s, r->server_ns * 1e-9, dev_s);
	s->ranges++;
	return 0;
}

/*
 * Read and answer one request on fd.  Returns 0 to keep the connection,
 * 1 to close it, -1 when the device failed (the service must stop).
 */
static int serve_one(int fd, const struct net_plan *p, struct gpu_net *g, const void *synth,
		     struct stats *s)
{
	struct tonic_req q;
	struct tonic_range rg = { 0, 0 };
	struct tonic_rep r = { .magic = TONIC_REP_MAGIC };
	char err[512];
	double t0, dev_s = 0;
	int known;

	if (full_io(fd, &q, sizeof(q), 0))
		return 1;
	r.id = q.id;
	r.unit_bytes = (uint32_t)p->unit_bytes;
	r.max_size = (uint32_t)p->max_size;
	r.input_kind = p->def->input;
	known = q.kind == TONIC_INFER || q.kind == TONIC_INFO || q.kind == TONIC_INFER_RANGE;
	if (q.magic != TONIC_REQ_MAGIC || !known ||
	    (q.kind != TONIC_INFO && (q.size < 1 || q.size > (uint32_t)p->max_size)) ||
	    (q.kind == TONIC_INFER && q.nbytes && q.nbytes != q.size * p->unit_bytes) ||
	    (q.kind != TONIC_INFER && q.nbytes)) {
		r.status = TONIC_EBADREQ;
		s->errors++;
		full_io(fd, &r, sizeof(r), 1);
		return 1;
	}
	if (q.kind == TONIC_INFO) {
		r.n_ops = (uint32_t)p->nops;
		return full_io(fd, &r, sizeof(r), 1) ? 1 : 0;
	}
	if (q.kind == TONIC_INFER_RANGE) {
		int rc;

		if (full_io(fd, &rg, sizeof(rg), 0))
			return 1;
		if (rg.start >= rg.end || rg.end > (uint32_t)p->nops) {
			/* the whole request was read: the stream is in step */
			r.status = TONIC_EBADREQ;
			s->errors++;
			return full_io(fd, &r, sizeof(r), 1) ? 1 : 0;
		}
		rc = serve_range(fd, &q, &rg, &r, g, s);
		if (rc)
			return rc;
		return full_io(fd, &r, sizeof(r), 1) ? 1 : 0;
	}

	t0 = now_s();
	if (q.nbytes) {
		if (full_io(fd, gpu_net_input(g), q.nbytes, 0))
			return 1;
	} else {
		memcpy(gpu_net_input(g), synth, (size_t)q.size * p->unit_bytes);
	}
	colocate_query_begin(q.id, q.size);
	if (gpu_net_run(g, (int)q.size, &dev_s, err, sizeof(err))) {
		colocate_query_end(q.id);
		fprintf(stderr, "%s: query %llu: %s\n", NAME, (unsigned long long)q.id, err);
		r.status = TONIC_EDEVICE;
		s->errors++;
		full_io(fd, &r, sizeof(r), 1);
		return -1;
	}
	colocate_query_end(q.id);
	r.server_ns = (uint64_t)llround((now_s() - t0) * 1e9);
	r.device_ns = (uint64_t)llround(dev_s * 1e9);
	r.out_floats = q.size * (uint32_t)p->out_per;
	r.checksum = net_fnv1a64(gpu_net_output(g), r.out_floats * sizeof(float));
	record(s, r.server_ns * 1e-9, dev_s);
	return full_io(fd, &r, sizeof(r), 1) ? 1 : 0;
}

static int run_server(const struct net_plan *p, const float *params, const struct opts *o)
{
	struct pollfd pf[1 + MAX_CLIENTS];
	struct stats s = { 0 };
	struct sigaction sa = { .sa_handler = on_signal };   /* no SA_RESTART: poll wakes */
	char err[512];
	void *synth = malloc((size_t)p->max_size * p->unit_bytes);
	struct gpu_net *g;
	int nfd = 1, rc = 0;

	if (!synth)
		fail("out of host memory%s%s", "", "");
	net_input_fill(p, p->max_size, synth);
	g = gpu_net_open(p, params, err, sizeof(err));
	if (!g)
		fail("%s%s", err, "");
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	pf[0] = (struct pollfd){ .fd = listen_on(o->socket), .events = POLLIN };
	printf("READY net=%s socket=%s max_size=%d unit_bytes=%zu out_per=%d params=%zu "
	       "n_ops=%d\n", p->def->name, o->socket, p->max_size, p->unit_bytes, p->out_per,
	       p->nparams, p->nops);
	fflush(stdout);

	while (!stop && (!o->queries || s.n + (size_t)s.errors < (size_t)o->queries)) {
		if (poll(pf, nfd, -1) < 0) {
			if (errno == EINTR)
				continue;
			fail("poll: %s%s", strerror(errno), "");
		}
		if (pf[0].revents & POLLIN) {
			int c = accept4(pf[0].fd, NULL, NULL, SOCK_CLOEXEC);

			if (c >= 0 && nfd < 1 + MAX_CLIENTS)
				pf[nfd++] = (struct pollfd){ .fd = c, .events = POLLIN };
			else if (c >= 0)
				close(c);
		}
		for (int i = 1; i < nfd && !stop; i++) {
			int r = 0;

			if (!pf[i].revents)
				continue;
			if (pf[i].revents & POLLIN)
				r = serve_one(pf[i].fd, p, g, synth, &s);
			else
				r = 1;   /* hang-up or error without data */
			if (r < 0) {
				rc = 1;
				stop = 1;
			}
			if (r) {
				close(pf[i].fd);
				pf[i--] = pf[--nfd];
			}
			if (o->queries && s.n + (size_t)s.errors >= (size_t)o->queries)
				break;
		}
	}
	for (int i = 0; i < nfd; i++)
		close(pf[i].fd);
	unlink(o->socket);
	summary(p->def->name, &s);
	gpu_net_close(g);
	free(synth);
	free(s.server_s);
	free(s.device_s);
	return rc;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct net_plan *p = malloc(sizeof(*p));
	const struct net_def *d;
	char err[512], name[64];
	float *params;
	int rc;

	if (!p)
		fail("out of host memory%s%s", "", "");
	parse(argc, argv, &o);
	d = net_find(o.net);
	snprintf(name, sizeof(name), "tonic-%s", d->name);
	NAME = name;
	if (!o.max_size)
		o.max_size = d->input == TONIC_IMAGES ? 16 : 128;
	if (o.check && o.size > o.max_size)
		o.max_size = o.size;
	if (net_plan_make(p, d, o.width, o.res, (int)o.max_size, (uint64_t)o.seed, err,
			  sizeof(err)))
		fail("%s%s", err, "");
	params = malloc(p->nparams * sizeof(float));
	if (!params)
		fail("cannot allocate %s parameters%s", "the", "");
	net_params_fill(p, params);
	rc = o.check ? run_check(p, params, &o) : run_server(p, params, &o);
	free(params);
	free(p);
	return rc;
}

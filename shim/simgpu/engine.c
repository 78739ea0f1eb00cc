/*
 * engine.c - the device model's engine (engine.h says what it keeps;
 * simgpu_model.h what each mechanism means and where its parameters live).
 *
 * Each event (a cohort of blocks retires, a copy ends, a time slice ends,
 * a context switch completes) and each admission runs settle():
 *
 *   1. slices   without MPS, pick the context that owns the device;
 *   2. unfold   folded cohorts give their queued waves back (anything may
 *               have changed);
 *   3. dispatch in arrival order, each kernel takes the blocks its MPS cap
 *               and the free SM capacity allow; the first kernel that wants
 *               more than fits stops the walk (left-over policy); kernels up
 *               to it that refill their own SMs fold their remaining waves.
 *               Where MPS limits oversubscribe the device, a client limited
 *               below it keeps a fair share of SMs (shares() below says why
 *               and how), which no one else takes and no walk stops;
 *   4. rates    each executing kernel's wave period from its SMs, their
 *               co-residents and the DRAM load; copies' share of PCIe;
 *   5. trace    executing stretches that ended are reported.
 *
 * Rates, for kernel k with R resident blocks spanning m SMs (blocks go
 * breadth-first: m = min(quota, R)), of which x are its own and m - x
 * shared with later (or earlier) kernels' blocks:
 *
 *   u      = min(1, warps per SM / sat_warps)              (enough warps?)
 *   s_c    = max(1, u c + partner's u c)                   (issue slots)
 *   s_m    = max(1, u mu + partner's u mu) (1 + l1_gamma mu mu')  (L1/LSU)
 *   C      = sm_flops u (x + (m - x) / s_c)      compute rate
 *   M      = sm_bw    u (x + (m - x) / s_m)      memory rate its SMs pull
 *   t_c    = R flops_b / C,  t_m = R bytes_b / M  (min(M, bw) without bwq)
 *   P0     = max(t_c, t_m), rho = sum_k R bytes_b / P0 / bw
 *   period = max(t_c, t_m S_k)      with bwq (S_k: dram_stretch); without,
 *            P0 max(1, rho) for kernels that move DRAM bytes (the fluid
 *            model's uniform scale)
 *
 * where c and mu (compute and memory intensity) are a block's compute and
 * memory times on one SM over the larger of the two.  A cohort's remaining
 * work falls by 1 / period per second.
 *
 * With bwq, the kernels pulling D = sum D_k get D / L(D / bw) in all,
 * L(rho) = (1 + (rho (1 + bw_beta))^k)^(1/k), k = bw_sharp: a soft minimum
 * of the pull and what DRAM delivers, bw / (1 + bw_beta).  A kernel's pull
 * is what it keeps in flight over DRAM's idle latency (Little's law), so it
 * is uncapped (a kernel on 120 SMs keeps more in flight than one on 40,
 * though either alone would saturate DRAM): R bytes_b / t_m while memory
 * time is what it waits on; a kernel whose compute hides the grown latency
 * (t_m S_k < t_c) takes R bytes_b / t_c and keeps that times S_k in flight.
 * They share in proportion to their pulls to the power bw_share; S_k is a
 * kernel's pull over its share, DRAM's latency as it sees it
 * (dram_stretch).  So no kernel gets more than DRAM delivers, a compute-
 * bound kernel slows only once its stretched loads outlast its compute,
 * and more flops of its own never speed one up.  A co-runner's change can
 * move a kernel a few per cent either way: the soft minimum's shortfall
 * falls on the largest pulls, and a kernel whose compute hides its stretch
 * absorbs its part of it for free.
 *
 * Approximations, on purpose: co-residence is counted, not placed (how many
 * of a kernel's SMs host others' blocks, each kernel taking empty SMs
 * first), and a kernel's partner on shared SMs is the average of the
 * others; the blocks of one cohort progress alike; a kernel keeps at most
 * EN_COHORTS cohorts (a further one merges into the freshest by mean
 * remaining work).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define EPS_REM 1e-7

static int has(const struct en_state *st, unsigned m)
{
	return (st->p.mech & m) != 0;
}

static int slicing(const struct en_state *st)
{
	return !st->p.mps && has(st, SIMGPU_M_SLICE);
}

static double resident(const struct en_task *k)
{
	double r = 0;
	unsigned j;

	for (j = 0; j < k->ncoh; j++)
		r += k->coh[j].n;
	return r;
}

size_t en_size(uint32_t cap)
{
	return sizeof(struct en_state) + (size_t)cap * sizeof(struct en_task);
}

void en_init(struct en_state *st, const struct simgpu_model_params *p, uint32_t cap)
{
	memset(st, 0, en_size(cap));
	st->p = *p;
	st->cap = cap;
}

/* SMs per TPC on sm_90 (and on the 2080Ti's and V100's parts the simulator
 * rescales to) */
#define TPC_SMS 2

/*
 * MPS gives whole TPCs: on an H100 and an H200 alike, 10, 20 ... 100 % gave
 * 12, 26, 38, 52, 66, 78, 92, 104, 118 and 132 of 132 SMs (the calibration
 * probe's cudaDevAttrMultiProcessorCount under MPS,
 * bench/calib/h100-2026-11-27.jsonl and h200-2026-11-27.jsonl): the
 * percentage's SMs rounded down to a multiple of TPC_SMS, never below one
 * TPC; at 100 % (no limit) every SM, an odd count too.
 */
int en_quota_sms(double pct, int sms)
{
	int n = TPC_SMS * (int)floor(pct / 100.0 * sms / TPC_SMS + 1e-9);

	if (pct >= 100)
		n = sms;
	if (n < TPC_SMS)
		n = TPC_SMS;
	return n > sms ? sms : n;
}

double en_blocks_per_sm(const struct simgpu_model_params *p, double threads, double regs,
			double smem)
{
	double warps = ceil((threads < 1 ? 1 : threads) / 32.0);
	double b = floor(p->sm_threads / (warps * 32.0));

	if (p->sm_blocks < b)
		b = p->sm_blocks;
	if (regs <= 0)
		regs = p->regs_default;
	if (regs > 0) {
		/* registers are allocated per warp, in units of 256 */
		double per_warp = ceil(regs * 32.0 / 256.0) * 256.0;
		double by_regs = floor(floor(p->sm_regs / per_warp) / warps);

		if (by_regs < b)
			b = by_regs;
	}
	if (smem < 0)
		smem = 0;
	if (smem + p->block_smem > 0) {
		double by_smem = floor(p->sm_smem / (smem + p->block_smem));

		if (by_smem < b)
			b = by_smem;
	}
	return b < 1 ? 1 : b;
}

/* Blocks per SM of the fluid model: packed by threads alone, 1..32. */
static double packed_per_sm(double threads)
{
	double b = floor(2048.0 / (threads < 1 ? 1 : threads));

	return b < 1 ? 1 : b > 32 ? 32 : b;
}

/* ---------------------------------------------------------------- shape */

static void shape(struct en_state *st, struct en_task *k, const struct simgpu_model_task *d)
{
	const struct simgpu_model_params *p = &st->p;
	double tc, tm, mx;

	k->kind = (uint32_t)d->kind;
	if (d->kind != SIMGPU_T_KERNEL) {
		k->blocks = 1;
		k->per_sm = 1;
		k->quota = 1;
		k->flops_b = 0;
		k->bytes_b = d->bytes > 0 ? d->bytes : 0;
		k->coh[0] = (struct en_cohort){ 1, 1 };
		k->ncoh = 1;
		k->t_start = st->t_ref;
		return;
	}
	k->blocks = d->blocks >= 1 ? floor(d->blocks) : 1;
	k->warps_b = ceil((d->threads >= 1 ? d->threads : 1) / 32.0);
	k->per_sm = has(st, SIMGPU_M_BLOCKS) ? en_blocks_per_sm(p, d->threads, d->regs, d->smem)
					     : packed_per_sm(d->threads);
	k->quota = d->quota_sms < 1 ? 1 : d->quota_sms > p->sms ? p->sms : floor(d->quota_sms);
	k->flops_b = (d->flops > 0 ? d->flops : 0) / k->blocks;
	k->bytes_b = (d->bytes > 0 ? d->bytes : 0) / k->blocks;
	tc = k->flops_b / p->sm_flops;
	tm = k->bytes_b / p->sm_bw;
	mx = tc > tm ? tc : tm;
	k->c_int = mx > 0 ? tc / mx : 0;
	k->m_int = mx > 0 ? tm / mx : 0;
	if (has(st, SIMGPU_M_BLOCKS)) {
		k->undisp = k->blocks;
		k->t_start = -1;
	} else {
		/* fluid: the whole grid at once, on a proportional share */
		k->coh[0] = (struct en_cohort){ k->blocks, 1 };
		k->ncoh = 1;
		k->t_start = st->t_ref;
	}
}

/* ---------------------------------------------------------------- slices */

/* Kernels of this task's context may execute now. */
static int eligible(const struct en_state *st, const struct en_task *k)
{
	if (k->state != EN_RUN)
		return 0;
	if (k->kind != SIMGPU_T_KERNEL || !slicing(st))
		return 1;
	return !st->switching && st->has_active && k->ctx == st->active_ctx;
}

/*
 * The next context to get the device: of the running kernels outside the
 * active context, the one whose context had the device least recently
 * (round robin), the oldest kernel breaking ties; 0 when none waits.
 */
/* When context c last got the device, -1: never (or forgotten). */
static double last_turn(const struct en_state *st, int32_t c)
{
	unsigned j;

	for (j = 0; j < EN_CTXS; j++)
		if (st->turns[j].used && st->turns[j].ctx == c)
			return st->turns[j].t;
	return -1;
}

static const struct en_task *waiting_ctx(const struct en_state *st, int *active_busy)
{
	const struct en_task *best = NULL;
	double best_t = 0;
	uint32_t i;

	*active_busy = 0;
	for (i = 0; i < st->hi; i++) {
		const struct en_task *k = &st->t[i];

		if (k->state != EN_RUN || k->kind != SIMGPU_T_KERNEL)
			continue;
		if (st->has_active && k->ctx == st->active_ctx)
			*active_busy = 1;
		else {
			double t = last_turn(st, k->ctx);

			if (!best || t < best_t || (t == best_t && k->seq < best->seq)) {
				best = k;
				best_t = t;
			}
		}
	}
	return best;
}

/* Context c has the device from t (the table forgets the longest idle). */
static void mark_ctx(struct en_state *st, int32_t c, double t)
{
	unsigned j, slot = 0;

	for (j = 0; j < EN_CTXS; j++) {
		if (st->turns[j].used && st->turns[j].ctx == c) {
			slot = j;
			break;
		}
		if (!st->turns[j].used || (st->turns[slot].used && st->turns[j].t < st->turns[slot].t))
			slot = j;
	}
	st->turns[slot].ctx = c;
	st->turns[slot].used = 1;
	st->turns[slot].t = t;
}

static void switch_to(struct en_state *st, int32_t c, double t)
{
	mark_ctx(st, c, t);
	if (!st->has_active || st->p.switch_s <= 0) {
		st->active_ctx = c;
		st->has_active = 1;
		st->slice_end = t + st->p.slice_s;
	} else {
		st->switching = 1;
		st->next_ctx = c;
		st->switch_end = t + st->p.switch_s;
	}
}

static void slice_update(struct en_state *st, double t)
{
	const struct en_task *w;
	int busy;

	if (!slicing(st)) {
		st->switching = 0;
		return;
	}
	if (st->switching) {
		if (t < st->switch_end)
			return;
		st->active_ctx = st->next_ctx;
		st->has_active = 1;
		st->switching = 0;
		st->slice_end = t + st->p.slice_s;
	}
	w = waiting_ctx(st, &busy);
	busy |= t < st->hold_until;     /* its next kernel is on its way */
	if (w && (!busy || t >= st->slice_end)) {
		st->hold_until = 0;
		switch_to(st, w->ctx, t);
	}
}

/* ---------------------------------------------------------------- dispatch */

static void unfold(struct en_state *st)
{
	uint32_t i, j;

	for (i = 0; i < st->hi; i++) {
		struct en_task *k = &st->t[i];

		if (k->state != EN_RUN || k->kind != SIMGPU_T_KERNEL)
			continue;
		for (j = 0; j < k->ncoh; j++) {
			double extra = ceil(k->coh[j].rem - 1e-9) - 1;

			if (extra > 0) {
				k->undisp += extra * k->coh[j].n;
				k->coh[j].rem -= extra;
			}
		}
	}
}

static void add_cohort(struct en_task *k, double n)
{
	unsigned j, best = 0;

	if (k->ncoh < EN_COHORTS) {
		k->coh[k->ncoh++] = (struct en_cohort){ n, 1 };
		return;
	}
	/* full: merge into the cohort nearest a fresh one (approximation) */
	for (j = 1; j < k->ncoh; j++)
		if (k->coh[j].rem > k->coh[best].rem)
			best = j;
	k->coh[best].rem = (k->coh[best].n * k->coh[best].rem + n) / (k->coh[best].n + n);
	k->coh[best].n += n;
}

/*
 * Its cohorts will each refill their own blocks wave after wave: queue the
 * full rounds into their remaining work.  The kernel that stops the walk
 * (blocked) keeps its last refill an event: after it nothing of it waits,
 * and the next kernel may take the room it leaves.
 */
static void fold(const struct en_state *st, struct en_task *k, int blocked, double most)
{
	double r = resident(k), w;
	unsigned j;

	if (r <= 0 || k->undisp < r || (st->p.mech & SIMGPU_M_NOFOLD))
		return;
	w = blocked ? ceil(k->undisp / r) - 1 : floor(k->undisp / r);
	if (w > most)
		w = most;
	if (w <= 0)
		return;
	for (j = 0; j < k->ncoh; j++)
		k->coh[j].rem += w;
	k->undisp -= w * r;
}

/* Indices of running kernels in arrival order (insertion sort: few). */
static int by_arrival(const struct en_state *st, int *idx)
{
	int n = 0, a;
	uint32_t i;

	for (i = 0; i < st->hi; i++) {
		const struct en_task *k = &st->t[i];

		if (k->state != EN_RUN || k->kind != SIMGPU_T_KERNEL)
			continue;
		for (a = n; a > 0 && st->t[idx[a - 1]].seq > k->seq; a--)
			idx[a] = idx[a - 1];
		idx[a] = (int)i;
		n++;
	}
	return n;
}

/*
 * MPS clients limited below the whole device keep a fair share of it when
 * the limits oversubscribe the device.  Measured on an H100 and an H200
 * (bench/calib/h100-2026-11-27.jsonl, h200-2026-11-27.jsonl, the pair
 * cases with a 100 % co-runner): a compute-bound victim at q % beside a
 * compute-bound co-runner at 100 % slowed 1.03, 1.17, 1.41, 1.53, 1.78,
 * 2.00 at q = 50, 60, ..., 100 (mean launch times; both GPUs within 0.01)
 * -- close to q / 50, its share of a device split evenly -- where
 * left-over dispatch across the two made it wait behind each co-runner
 * kernel: 2 at every q.
 * So: the SMs are water-filled over the clients with kernels (each gets
 * at most what its kernels could use within its limit, the rest split
 * evenly), and a limited client's blocks may take room up to its share
 * whatever the arrival order; no one else takes the room such a client
 * has not filled yet.  Clients at 100 % keep left-over dispatch among
 * themselves (the few-block kernel behind a full-device one waits: Pai et
 * al.; not measured across clients here).  Below q = 50 the GPUs slowed the
 * victim 1.03-1.20; the share alone would give 1.00, the model's
 * co-residence and DRAM terms make it 1.06-1.21.  Shares are whole SMs
 * (a fraction of one would stay empty), so with more clients than SMs
 * some get none until others' kernels end.
 *
 * Folded waves give the wave-by-wave times (the random test), except when
 * events coincide to the nanosecond (round-number arrivals): there a
 * kernel earlier in arrival order may take room at the tie that a folded
 * kernel keeps (a reviewer's fuzz: 13 of 3000 such cases differ).
 */
struct share {
	int32_t ctx;
	int     limited;       /* its limit is below the device            */
	int     kernels;       /* its kernels with blocks to run           */
	double  cap, demand;   /* SMs: its limit; what its kernels could use */
	double  share, used;   /* SMs: its fair share; what its blocks fill */
};

/* The clients with kernels and their shares, into sh; how many, or 0 when
 * there is no MPS, one client, or the limits do not oversubscribe the
 * device (then dispatch is left-over alone). */
static int shares(const struct en_state *st, const int *idx, int n, struct share *sh)
{
	double total = 0, left = st->p.sms;
	int ns = 0, a, b, open, changed;

	if (!st->p.mps)
		return 0;
	for (a = 0; a < n; a++) {
		const struct en_task *k = &st->t[idx[a]];
		double r = resident(k), need;

		if (!eligible(st, k) || r + k->undisp <= 0)
			continue;
		for (b = 0; b < ns && sh[b].ctx != k->ctx; b++)
			;
		if (b == ns)
			sh[ns++] = (struct share){ .ctx = k->ctx };
		need = ceil((r + k->undisp) / k->per_sm - 1e-9);
		sh[b].demand += need < k->quota ? need : k->quota;
		sh[b].kernels++;
		sh[b].used += r / k->per_sm;
		if (k->quota > sh[b].cap)
			sh[b].cap = k->quota;
	}
	for (b = 0; b < ns; b++) {
		if (sh[b].demand > sh[b].cap)
			sh[b].demand = sh[b].cap;
		sh[b].limited = sh[b].cap < st->p.sms - 0.5;
		sh[b].share = -1;
		total += sh[b].demand;
	}
	if (ns < 2 || total <= st->p.sms)
		return 0;
	/* water-filling: who wants less than an even split gets it */
	open = ns;
	do {
		changed = 0;
		for (b = 0; b < ns; b++)
			if (sh[b].share < 0 && sh[b].demand <= left / open) {
				sh[b].share = sh[b].demand;
				left -= sh[b].demand;
				open--;
				changed = 1;
			}
	} while (changed && open > 0);
	/* the rest evenly, in whole SMs (a fraction of an SM reserved would
	 * stay empty: a client takes room by the block), the odd ones to the
	 * clients that came first; with more clients than SMs some get none
	 * for now and wait for the others' kernels to end */
	left = floor(left + 1e-9);
	for (b = 0; b < ns; b++)
		if (sh[b].share < 0) {
			double even = floor(left / open);

			sh[b].share = even + (left - even * open >= 1 ? 1 : 0);
			left -= sh[b].share;
			open--;
		}
	return ns;
}

static struct share *share_of(struct share *sh, int ns, int32_t ctx)
{
	int b;

	for (b = 0; b < ns; b++)
		if (sh[b].ctx == ctx)
			return &sh[b];
	return NULL;
}

/* What limited clients' shares still lack: room no one else takes.  (A
 * client with no blocks left to dispatch keeps it too, until its kernels
 * end: letting it go at the last dispatch would be a change between
 * events, which folded waves do not see.) */
static double reserved(const struct share *sh, int ns)
{
	double r = 0;
	int b;

	for (b = 0; b < ns; b++)
		if (sh[b].limited && sh[b].share > sh[b].used)
			r += sh[b].share - sh[b].used;
	return r;
}

/* How many more waves of its resident blocks kernel k can run before what
 * it asks of the shares (shares(): the SMs its remaining blocks fill, at
 * most its limit) changes. */
static double steady_waves(const struct en_task *k)
{
	double r = resident(k), over;

	if (r <= 0)
		return 0;
	over = r + k->undisp - k->quota * k->per_sm;   /* blocks past its limit's fill */
	return over > 0 ? floor(over / r + 1e-9) : 0;
}

static void dispatch(struct en_state *st, const int *idx, int n)
{
	struct share sh[n > 0 ? n : 1];
	struct share *cs[n > 0 ? n : 1];   /* each kernel's client's share */
	signed char fate[n > 0 ? n : 1];   /* -1 not visited, else blocked */
	double used = 0;
	int a, ns, waiting = 0, lacking;

	if (!has(st, SIMGPU_M_BLOCKS))
		return;
	for (a = 0; a < n; a++) {
		const struct en_task *k = &st->t[idx[a]];

		if (eligible(st, k))
			used += resident(k) / k->per_sm;
	}
	ns = shares(st, idx, n, sh);
	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];

		cs[a] = ns ? share_of(sh, ns, k->ctx) : NULL;
		k->held = cs[a] && cs[a]->limited;
	}
	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];
		struct share *c = cs[a];
		double want, room, can, avail;
		int blocked = 0;

		fate[a] = -1;
		if (!eligible(st, k))
			continue;
		/* behind a kernel that could not have all it wanted, only a
		 * limited client's kernels still take (their share's) room */
		if (waiting && !k->held)
			continue;
		if (k->undisp > 0) {
			want = floor(k->quota * k->per_sm) - resident(k);
			if (want > k->undisp)
				want = k->undisp;
			avail = st->p.sms - used - (ns ? reserved(sh, ns) : 0);
			if (k->held) {
				/* its own share's room is its to take, no further:
				 * at its share it refills its own SMs, as at its
				 * limit (not blocked: what it would take beyond
				 * its share is not asked for) */
				double lack = c->share > c->used ? c->share - c->used : 0;
				double top = floor(lack * k->per_sm + 1e-9);

				avail += lack;
				if (want > top)
					want = top;
			}
			room = avail > 0 ? floor(avail * k->per_sm + 1e-9) : 0;
			can = want < room ? want : room;
			if (can >= 1) {
				add_cohort(k, can);
				k->undisp -= can;
				used += can / k->per_sm;
				if (c)
					c->used += can / k->per_sm;
				if (k->t_start < 0)
					k->t_start = st->t_ref;
			}
			blocked = can < want;
		}
		fate[a] = (signed char)blocked;
		if (blocked && !k->held) {
			if (!ns) {
				a++;
				break;
			}
			waiting = 1;
		}
	}
	for (; a < n; a++)
		fate[a] = -1;
	/* While shares are kept, folding must not skip an event that changes
	 * them (the results would differ from wave by wave): while a limited
	 * client lacks room of its share, every wave ends in an event (the
	 * room it leaves may go to that client); and a kernel folds only the
	 * waves after which its remaining blocks still fill as many SMs (what
	 * it asks of the shares) */
	lacking = ns && reserved(sh, ns) > 1e-9;
	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];
		const struct share *c = k->held ? cs[a] : NULL;

		if (fate[a] < 0 || lacking)
			continue;
		/* a limited client's kernel over its share (it had the room
		 * before the share was kept) refills only its share next; of
		 * several kernels sharing one, an earlier one takes the room a
		 * later one's wave leaves */
		if (c && (c->used > c->share + 1e-9 || c->kernels > 1))
			continue;
		fold(st, k, fate[a], ns ? steady_waves(k) : INFINITY);
	}
}

/* ---------------------------------------------------------------- rates */

/* Memory-time stretch of a kernel alone at DRAM load rho (bwq on): the
 * SMs' pull, rho bw, over what DRAM delivers of it, a soft minimum of the
 * pull and bw / (1 + beta) (simgpu_model.h; fitted to an H100's and an
 * H200's memory-bound kernel alone on 12..132 SMs, bench/RESULTS.md). */
static double queueing(const struct simgpu_model_params *p, double rho)
{
	double x = rho * (1 + p->bw_beta), k = p->bw_sharp;

	if (x <= 0)
		return 1;
	if (x > 1)      /* the same, without overflowing x^k */
		return x * pow(1 + pow(x, -k), 1 / k);
	return pow(1 + pow(x, k), 1 / k);
}

/*
 * DRAM shared by n kernels (bwq on).  Kernel a moves b bytes a wave in
 * compute time tc and memory time tm (its SMs' pull with DRAM idle, dm =
 * b / tm).  Each SM keeps so many requests in flight; as DRAM fills, their
 * latency grows by the kernel's stretch s, and (Little's law) what the
 * kernel pulls is what it keeps in flight over the idle latency:
 *
 *   memory-bound  (tm s >= tc): pulls e = dm, gets dm / s
 *   compute-bound (tm s <  tc): gets dc = b / tc (its compute hides the
 *                               latency), so it keeps e = dc s in flight
 *
 * All together get what one kernel pulling the sum would (queueing()),
 * split in proportion to e^bw_share (bw_share = 1: in proportion to the
 * pull, and so to the SMs; below 1 a kernel on few SMs keeps more than its
 * SMs' share, as the H100's and H200's memory-bound pairs did), none above
 * its own pull: s = max(1, e^(1 - bw_share) lam) for one lam common to all.
 * A compute-bound kernel's e grows with its s, so lam is found by
 * bisection: the kernels' takings, which fall as lam rises, equal what
 * DRAM delivers to their pull, which rises with it.  Taken on the side of
 * the larger lam: no kernel gets more than DRAM delivers.
 */
static double dram_take(const struct simgpu_model_params *p, double tc, double tm, double b,
			double lam, double *e, double *s)
{
	double g = p->bw_share, sc;

	if (tc > 0) {                     /* compute-bound at this lam? */
		sc = pow(pow(b / tc, 1 - g) * lam, 1 / g);
		sc = sc > 1 ? sc : 1;
		if (tm * sc < tc) {
			*s = sc;
			*e = b / tc * sc;
			return b / tc;
		}
	}
	*s = pow(b / tm, 1 - g) * lam;
	*s = *s > 1 ? *s : 1;
	*e = b / tm;
	return *e / *s;
}

/* The kernels' takings minus what DRAM delivers to their pull, at lam. */
static double dram_excess(const struct simgpu_model_params *p, const double *tc, const double *tm,
			  const double *b, double *s, int n, double lam)
{
	double got = 0, pull = 0, e;
	int a;

	for (a = 0; a < n; a++)
		if (b[a] > 0 && tm[a] > 0) {
			got += dram_take(p, tc[a], tm[a], b[a], lam, &e, &s[a]);
			pull += e;
		} else {
			s[a] = 1;
		}
	return pull > 0 ? got - pull / queueing(p, pull / p->bw) : 0;
}

/* The same when no kernel's compute can hide the latency (each is memory-
 * bound already at s = 1, so its pull is fixed): water-filled in closed
 * form, kernels whose share covers their pull leaving with s = 1. */
static void dram_fill(const struct simgpu_model_params *p, const double *d, double *s, int n)
{
	double sum = 0, left, wsum, w[n > 0 ? n : 1];
	int a, open = 0, moved = 1;

	for (a = 0; a < n; a++) {
		s[a] = 1;
		w[a] = d[a] > 0 ? pow(d[a], p->bw_share) : 0;
		sum += d[a] > 0 ? d[a] : 0;
		open += d[a] > 0;
	}
	if (sum <= 0)
		return;
	left = sum / queueing(p, sum / p->bw);
	while (open > 1 && moved) {
		moved = 0;
		wsum = 0;
		for (a = 0; a < n; a++)
			wsum += w[a];
		for (a = 0; a < n; a++)
			if (w[a] > 0 && left * w[a] / wsum >= d[a]) {
				left -= d[a];
				w[a] = 0;
				open--;
				moved = 1;
			}
	}
	wsum = 0;
	for (a = 0; a < n; a++)
		wsum += w[a];
	for (a = 0; a < n; a++)
		if (w[a] > 0)
			s[a] = left > 0 ? d[a] * wsum / (left * w[a]) : 1e30;
}

static void dram_stretch(const struct simgpu_model_params *p, const double *tc, const double *tm,
			 const double *b, double *s, int n)
{
	double lo = 1, hi = 1, mid, least = 0, d[n > 0 ? n : 1];
	int a, i, hides = 0;

	for (a = 0; a < n; a++) {
		s[a] = 1;
		d[a] = b[a] > 0 && tm[a] > 0 ? b[a] / tm[a] : 0;
		hides |= d[a] > 0 && tc[a] > tm[a];
		least += d[a] > 0 ? b[a] / (tc[a] > tm[a] ? tc[a] : tm[a]) : 0;
	}
	/* no DRAM traffic, or so little that DRAM answers it at once: s = 1
	 * for all is the solution (the pull at s = 1 is the least there is) */
	if (least <= 0 || queueing(p, least / p->bw) <= 1)
		return;
	if (!hides) {
		dram_fill(p, d, s, n);
		return;
	}
	/* bracket: excess(lo) > 0 >= excess(hi); as lam -> 0 every s is 1 and
	 * the pull exceeds what DRAM delivers (queueing() > 1) */
	if (dram_excess(p, tc, tm, b, s, n, 1) > 0)
		for (i = 0; i < 200; i++) {
			lo = hi;
			hi *= 4;
			if (dram_excess(p, tc, tm, b, s, n, hi) <= 0)
				break;
		}
	else
		do {
			hi = lo;
			lo /= 4;
		} while (lo > 1e-300 && dram_excess(p, tc, tm, b, s, n, lo) <= 0);
	for (i = 0; i < 100 && hi > lo * (1 + 1e-12); i++) {
		mid = sqrt(lo) * sqrt(hi);
		if (dram_excess(p, tc, tm, b, s, n, mid) > 0)
			lo = mid;
		else
			hi = mid;
	}
	dram_excess(p, tc, tm, b, s, n, hi);
}

/* Wave period from compute and memory times: with bwq the memory time
 * stretched by s (DRAM's latency under load, dram_stretch); without,
 * max(t_c, t_m) max(1, rho) for a kernel that moves DRAM bytes (the fluid
 * model's uniform scale). */
static double period(const struct simgpu_model_params *p, double t_c, double t_m, double rho,
		     double s)
{
	double p0 = t_c > t_m ? t_c : t_m;

	if (!(p->mech & SIMGPU_M_BWQ))
		return rho > 1 && t_m > 0 ? p0 * rho : p0;
	t_m *= s;
	return t_c > t_m ? t_c : t_m;
}

/* Compute and memory time of one wave of R resident blocks over m SMs, x of
 * them its own; the shared ones slowed by s_c and s_m. */
static void wave_times(const struct simgpu_model_params *p, const struct en_task *k, double r,
		       double m, double x, double u, double s_c, double s_m, double *t_c,
		       double *t_m)
{
	double c = p->sm_flops * u * (x + (m - x) / s_c);
	double mm = p->sm_bw * u * (x + (m - x) / s_m);

	if (mm > p->bw && !(p->mech & SIMGPU_M_BWQ))  /* the fluid model's cap */
		mm = p->bw;
	*t_c = k->flops_b > 0 ? r * k->flops_b / c : 0;
	*t_m = k->bytes_b > 0 ? r * k->bytes_b / mm : 0;
}

/* SMs spanned and warp saturation of k's resident blocks (before sharing). */
static void span(const struct en_state *st, struct en_task *k, double r)
{
	const struct simgpu_model_params *p = &st->p;

	if (has(st, SIMGPU_M_BLOCKS)) {
		k->sms = r < k->quota ? r : k->quota;
		k->u = p->sat_warps > 0 ? r / k->sms * k->warps_b / p->sat_warps : 1;
		if (k->u > 1)
			k->u = 1;
	} else {
		double need = ceil(k->blocks / k->per_sm);

		k->sms = need < k->quota ? need : k->quota;
		k->u = 1;
	}
	k->excl = k->sms;
}

/* span(), on at most `room` SMs (no fewer than its blocks fill). */
static void span_within(const struct en_state *st, struct en_task *k, double r, double room)
{
	double least = ceil(r / k->per_sm - 1e-9);

	if (room < least)
		room = least;
	if (k->sms <= room)
		return;
	k->sms = room;
	k->excl = room;
	if (has(st, SIMGPU_M_BLOCKS) && st->p.sat_warps > 0) {
		k->u = r / k->sms * k->warps_b / st->p.sat_warps;
		if (k->u > 1)
			k->u = 1;
	}
}

/*
 * Co-residence: in arrival order each kernel takes empty SMs first; what
 * it spans beyond them lands on SMs that earlier kernels had to themselves,
 * which become shared (spread over them in proportion).
 */
static void place(struct en_state *st, const int *idx, int n)
{
	double empty = st->p.sms, pool = 0;
	int a, b;

	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];
		double landed, f;

		if (k->rate < 0)    /* marked: not executing */
			continue;
		k->excl = k->sms < empty ? k->sms : empty;
		empty -= k->excl;
		landed = k->sms - k->excl;
		if (landed > 0 && pool > 0) {
			f = landed >= pool ? 0 : 1 - landed / pool;
			pool = 0;
			for (b = 0; b < a; b++) {
				struct en_task *e = &st->t[idx[b]];

				if (e->rate < 0 || e->held)
					continue;
				e->excl *= f;
				pool += e->excl;
			}
		}
		if (!k->held)       /* a limited client's share is no one's pool */
			pool += k->excl;
	}
}

static void rates(struct en_state *st, const int *idx, int n)
{
	const struct simgpu_model_params *p = &st->p;
	double tot_sms = 0, held_sms = 0, sh_w = 0, sh_uc = 0, sh_um = 0, sh_mu = 0, dsum = 0, rho;
	double tc[n > 0 ? n : 1], tm[n > 0 ? n : 1], wb[n > 0 ? n : 1], str[n > 0 ? n : 1];
	int a, ncopy[3] = { 0, 0, 0 };
	uint32_t i;

	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];
		double r = resident(k);

		k->rate = -1;   /* not executing, unless below */
		if (!eligible(st, k) || r <= 0)
			continue;
		k->rate = 0;
		span(st, k, r);
		if (k->held)
			held_sms += k->sms;
	}
	/* limited clients' shares (dispatch) are theirs: the others' blocks
	 * spread over the rest of the device only (a limited kernel itself
	 * spans min(blocks, limit) as ever, which may reach past its share
	 * onto others' SMs: place() counts that as shared) */
	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];

		if (k->rate < 0)
			continue;
		if (held_sms > 0 && !k->held)
			span_within(st, k, resident(k), p->sms - held_sms);
		tot_sms += k->sms;
	}
	if (!has(st, SIMGPU_M_BLOCKS) && tot_sms > p->sms) {
		/* fluid: a proportional share of SMs for everyone */
		for (a = 0; a < n; a++) {
			struct en_task *k = &st->t[idx[a]];

			if (k->rate >= 0)
				k->excl = k->sms = k->sms * p->sms / tot_sms;
		}
	} else if (has(st, SIMGPU_M_BLOCKS) && tot_sms > p->sms) {
		place(st, idx, n);
	}
	for (a = 0; a < n; a++) {
		const struct en_task *k = &st->t[idx[a]];
		double sh = k->sms - k->excl;

		if (k->rate < 0 || sh <= 0)
			continue;
		sh_w += sh;
		sh_uc += sh * k->u * k->c_int;
		sh_um += sh * k->u * k->m_int;
		sh_mu += sh * k->m_int;
	}
	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];
		double r = resident(k), sh = k->sms - k->excl, s_c = 1, s_m = 1, w, p0;

		tc[a] = tm[a] = wb[a] = 0;
		str[a] = 1;
		if (k->rate < 0)
			continue;
		w = sh_w - sh;
		if (sh > 0 && w > 0 && has(st, SIMGPU_M_CORES)) {
			double pc = (sh_uc - sh * k->u * k->c_int) / w;
			double pm = (sh_um - sh * k->u * k->m_int) / w;
			double pmu = (sh_mu - sh * k->m_int) / w;

			s_c = k->u * k->c_int + pc;
			s_m = k->u * k->m_int + pm;
			s_c = s_c > 1 ? s_c : 1;
			s_m = (s_m > 1 ? s_m : 1) * (1 + p->l1_gamma * k->m_int * pmu);
		}
		wave_times(p, k, r, k->sms, k->excl, k->u, s_c, s_m, &tc[a], &tm[a]);
		p0 = tc[a] > tm[a] ? tc[a] : tm[a];
		wb[a] = r * k->bytes_b;
		if (p0 > 0)
			dsum += wb[a] / p0;
	}
	rho = dsum / p->bw;
	if (has(st, SIMGPU_M_BWQ))
		dram_stretch(p, tc, tm, wb, str, n);
	for (a = 0; a < n; a++) {
		struct en_task *k = &st->t[idx[a]];
		double per;

		if (k->rate < 0) {
			k->rate = 0;
			continue;
		}
		per = period(p, tc[a], tm[a], rho, str[a]);
		k->rate = per > 0 ? 1.0 / per : 1e30;
	}
	/* copies: each direction's PCIe shared fairly */
	for (i = 0; i < st->hi; i++)
		if (st->t[i].state == EN_RUN && st->t[i].kind != SIMGPU_T_KERNEL)
			ncopy[st->t[i].kind]++;
	for (i = 0; i < st->hi; i++) {
		struct en_task *k = &st->t[i];
		double bw;

		if (k->state != EN_RUN || k->kind == SIMGPU_T_KERNEL)
			continue;
		bw = k->kind == SIMGPU_T_H2D ? p->pcie_h2d : p->pcie_d2h;
		if (has(st, SIMGPU_M_PCIE))
			bw /= ncopy[k->kind];
		k->rate = k->bytes_b > 0 ? bw / k->bytes_b : 1e30;
	}
}

/* ---------------------------------------------------------------- events */

static void segments(struct en_state *st, double t, en_seg_fn seg, void *arg)
{
	uint32_t i;

	for (i = 0; i < st->hi; i++) {
		struct en_task *k = &st->t[i];
		int exec = k->state == EN_RUN && k->kind == SIMGPU_T_KERNEL && k->rate > 0 &&
			   resident(k) > 0;

		if (exec && k->t_seg < 0) {
			k->t_seg = t;
		} else if (!exec && k->t_seg >= 0) {
			if (seg && t > k->t_seg)
				seg(arg, k, k->t_seg, t);
			k->t_seg = -1;
		}
	}
}

static void settle(struct en_state *st, en_seg_fn seg, void *arg)
{
	int idx[st->cap > 0 ? st->cap : 1], n;

	slice_update(st, st->t_ref);
	unfold(st);
	n = by_arrival(st, idx);
	dispatch(st, idx, n);
	rates(st, idx, n);
	segments(st, st->t_ref, seg, arg);
}

static void progress_to(struct en_state *st, double t)
{
	double dt = t - st->t_ref;
	uint32_t i, j;

	if (dt <= 0)
		return;
	for (i = 0; i < st->hi; i++) {
		struct en_task *k = &st->t[i];

		if (k->state != EN_RUN || k->rate <= 0)
			continue;
		for (j = 0; j < k->ncoh; j++) {
			k->coh[j].rem -= k->rate * dt;
			if (k->coh[j].rem < 0)
				k->coh[j].rem = 0;
		}
	}
	st->t_ref = t;
}

double en_next_event(const struct en_state *st)
{
	double tn = INFINITY;
	uint32_t i, j;

	for (i = 0; i < st->hi; i++) {
		const struct en_task *k = &st->t[i];

		if (k->state != EN_RUN || k->rate <= 0)
			continue;
		for (j = 0; j < k->ncoh; j++) {
			double tf = st->t_ref + k->coh[j].rem / k->rate;

			if (tf < tn)
				tn = tf;
		}
	}
	if (slicing(st)) {
		int busy;

		if (st->switching) {
			if (st->switch_end < tn)
				tn = st->switch_end;
		} else if (waiting_ctx(st, &busy)) {
			double te = st->slice_end;

			if (!busy && st->hold_until < te)
				te = st->hold_until;
			if (te < st->t_ref)
				te = st->t_ref;
			if (te < tn)
				tn = te;
		}
	}
	return tn;
}

/* A wait (engine.h): its deadline is set by en_stamp. */
static int add_wait(struct en_state *st, uint64_t after, int32_t ctx, double t)
{
	if (st->nwaits >= EN_WAITS)
		return 0;
	st->waits[st->nwaits].after = after;
	st->waits[st->nwaits].ctx = ctx;
	st->waits[st->nwaits].t = t;
	st->waits[st->nwaits].until = INFINITY;
	st->nwaits++;
	return 1;
}

/* Retire what is done at t_ref: cohorts, copies, whole kernels. */
static void retire(struct en_state *st, en_seg_fn seg, void *arg)
{
	double t = st->t_ref;
	uint32_t i, j;

	for (i = 0; i < st->hi; i++) {
		struct en_task *k = &st->t[i];

		if (k->state != EN_RUN)
			continue;
		for (j = 0; j < k->ncoh;) {
			double rem = k->coh[j].rem;

			if (rem <= EPS_REM || (k->rate > 0 && rem / k->rate <= 1e-12 * (1 + t)))
				k->coh[j] = k->coh[--k->ncoh];
			else
				j++;
		}
		if (k->ncoh == 0 && k->undisp <= 0) {
			if (k->follow && k->kind == SIMGPU_T_KERNEL && st->has_active &&
			    k->ctx == st->active_ctx) {
				/* a queued kernel's start is known (the live device waits
				 * for it): held till then, and hold_s more as before */
				double h = k->queued ? k->lead + st->hold_s : st->hold_s;

				if (t + h > st->hold_until)
					st->hold_until = t + h;
			}
			if (k->queued)
				add_wait(st, k->id, k->ctx, t + k->lead);
			k->state = EN_DONE;
			k->t_end = t;
			k->rate = 0;
			if (k->t_seg >= 0 && seg && t > k->t_seg)
				seg(arg, k, k->t_seg, t);
			k->t_seg = -1;
		}
	}
}

void en_advance(struct en_state *st, double now, en_seg_fn seg, void *arg)
{
	long guard;

	for (guard = 0;; guard++) {
		double tn = en_next_event(st);

		if (!(tn <= now) || isinf(tn) || tn > en_barrier(st, 0))
			break;
		if (guard == 1000000) {
			st->stalled = 1;        /* a bug or absurd parameters: stop */
			break;
		}
		progress_to(st, tn);
		retire(st, seg, arg);
		settle(st, seg, arg);
		st->events++;
	}
}

int en_add(struct en_state *st, const struct simgpu_model_task *d, int32_t ctx, double t,
	   en_seg_fn seg, void *arg)
{
	struct en_task *k;
	uint32_t i;

	progress_to(st, t);

	for (i = 0; i < st->cap && st->t[i].state != EN_FREE; i++)
		;
	if (i == st->cap)
		return -1;
	k = &st->t[i];
	memset(k, 0, sizeof(*k));
	k->state = EN_RUN;
	k->ctx = ctx;
	k->id = ++st->next_id;
	k->seq = ++st->next_seq;
	k->t_seg = -1;
	k->t_end = -1;
	shape(st, k, d);
	if (i + 1 > st->hi)
		st->hi = i + 1;
	if (k->kind == SIMGPU_T_KERNEL && st->has_active && ctx == st->active_ctx)
		st->hold_until = 0;     /* the kernel it was held for came */
	settle(st, seg, arg);
	return (int)i;
}

double en_barrier(const struct en_state *st, uint64_t mine)
{
	double b = INFINITY;
	uint32_t i;

	for (i = 0; i < st->nwaits; i++)
		if (st->waits[i].t < b && st->waits[i].after != mine)
			b = st->waits[i].t;
	return b;
}

static void unwait(struct en_state *st, uint32_t i)
{
	st->waits[i] = st->waits[--st->nwaits];
}

uint64_t en_expect(struct en_state *st, int32_t ctx, double t)
{
	if (!(t >= st->t_ref) || !add_wait(st, st->next_id + 1, ctx, t))
		return 0;
	return ++st->next_id;   /* no task has this id */
}

int en_due(struct en_state *st, uint64_t after, double t)
{
	uint32_t i;

	for (i = 0; i < st->nwaits; i++) {
		if (st->waits[i].after == after && st->waits[i].t < t) {
			st->waits[i].t = t;
			return 1;
		}
	}
	return 0;
}

int en_keep(struct en_state *st, uint64_t after)
{
	uint32_t i;

	for (i = 0; after && i < st->nwaits; i++) {
		if (st->waits[i].after == after) {
			unwait(st, i);
			st->kept++;
			return 1;
		}
	}
	return 0;
}

void en_stamp(struct en_state *st, double now, double window)
{
	uint32_t i;

	for (i = 0; i < st->nwaits; i++)
		if (isinf(st->waits[i].until))
			st->waits[i].until = (st->waits[i].t > now ? st->waits[i].t : now) + window;
}

uint32_t en_lapse(struct en_state *st, double now, int32_t ctx)
{
	uint32_t i, n = 0;

	for (i = 0; i < st->nwaits;) {
		if (st->waits[i].until < now || (ctx && st->waits[i].ctx == ctx)) {
			unwait(st, i);
			n++;
		} else {
			i++;
		}
	}
	st->lapsed += n;
	return n;
}

void en_drop(struct en_state *st, int i, en_seg_fn seg, void *arg)
{
	int was_running;

	if (i < 0 || (uint32_t)i >= st->hi)
		return;
	was_running = st->t[i].state == EN_RUN;
	st->t[i].state = EN_FREE;
	while (st->hi > 0 && st->t[st->hi - 1].state == EN_FREE)
		st->hi--;
	if (was_running)
		settle(st, seg, arg);
}

/* The wave period of k alone with r resident blocks. */
static double alone_period(const struct en_state *st, struct en_task *k, double r)
{
	double tc, tm, p0, rho, b = r * k->bytes_b, s = 1;

	span(st, k, r);
	wave_times(&st->p, k, r, k->sms, k->sms, k->u, 1, 1, &tc, &tm);
	p0 = tc > tm ? tc : tm;
	rho = p0 > 0 ? b / p0 / st->p.bw : 0;
	if (has(st, SIMGPU_M_BWQ))
		dram_stretch(&st->p, &tc, &tm, &b, &s, 1);
	return period(&st->p, tc, tm, rho, s);
}

/* A one-task state of its own for a question about one task alone. */
struct alone {
	struct en_state st;
	struct en_task  t[1];
};

static struct en_task *alone(struct alone *s, const struct simgpu_model_params *p,
			     const struct simgpu_model_task *d)
{
	memset(s, 0, sizeof(*s));
	s->st.p = *p;
	s->st.cap = 1;
	shape(&s->st, &s->st.t[0], d);
	return &s->st.t[0];
}

double en_span_sms(const struct simgpu_model_params *p, const struct simgpu_model_task *d)
{
	struct alone s;
	struct en_task *k = alone(&s, p, d);

	span(&s.st, k, k->blocks);
	return k->sms;
}

double en_solo(const struct simgpu_model_params *p, const struct simgpu_model_task *d)
{
	struct alone s;
	struct en_task *k = alone(&s, p, d);
	double cap, full, tail;

	if (d->kind != SIMGPU_T_KERNEL)
		return k->bytes_b / (d->kind == SIMGPU_T_H2D ? p->pcie_h2d : p->pcie_d2h);
	if (!(p->mech & SIMGPU_M_BLOCKS))
		return alone_period(&s.st, k, k->blocks);
	cap = floor(k->quota * k->per_sm);
	full = floor(k->blocks / cap);
	tail = k->blocks - full * cap;
	return (full > 0 ? full * alone_period(&s.st, k, cap) : 0) +
	       (tail > 0 ? alone_period(&s.st, k, tail) : 0);
}

/* ---------------------------------------------------------------- offline */

static int params_ok(const struct simgpu_model_params *p)
{
	const double *v = &p->sms;
	size_t i, n = (sizeof(*p) - offsetof(struct simgpu_model_params, sms)) / sizeof(double);

	if (p->abi != SIMGPU_MODEL_ABI)
		return 0;
	for (i = 0; i < n; i++)
		if (!isfinite(v[i]) || v[i] < 0)
			return 0;
	return p->sms >= 1 && p->bw > 0 && p->sm_flops > 0 && p->sm_bw > 0 && p->sm_threads >= 32 &&
	       p->sm_blocks >= 1 && p->sm_regs > 0 && p->sm_smem > 0 && p->pcie_h2d > 0 &&
	       p->pcie_d2h > 0 && p->bw_sharp >= 0.1 && p->bw_share >= 0.05 && p->bw_share <= 4 && p->slice_s > 0;
}

static int task_ok(const struct simgpu_model_task *t)
{
	return isfinite(t->arrive) && isfinite(t->blocks) && isfinite(t->threads) &&
	       isfinite(t->regs) && isfinite(t->smem) && isfinite(t->flops) &&
	       isfinite(t->bytes) && isfinite(t->quota_sms) && t->flops >= 0 && t->bytes >= 0 &&
	       t->kind >= SIMGPU_T_KERNEL && t->kind <= SIMGPU_T_D2H;
}

SG_API int simgpu_model_simulate(const struct simgpu_model_params *p, int n,
				 struct simgpu_model_task *t)
{
	struct en_state *st;
	int *order, *slot, i, a;

	if (!p || !params_ok(p) || n < 0 || n > 16384 || (n && !t))
		return -1;
	for (i = 0; i < n; i++)
		if (!task_ok(&t[i]))
			return -1;
	st = malloc(en_size((uint32_t)n));
	order = malloc(sizeof(int) * (size_t)(n + 1));
	slot = malloc(sizeof(int) * (size_t)(n + 1));
	if (!st || !order || !slot) {
		free(st);
		free(order);
		free(slot);
		return -1;
	}
	en_init(st, p, (uint32_t)n);
	for (i = 0; i < n; i++) {        /* stable insertion sort by arrival */
		for (a = i; a > 0 && t[order[a - 1]].arrive > t[i].arrive; a--)
			order[a] = order[a - 1];
		order[a] = i;
	}
	if (n)
		st->t_ref = t[order[0]].arrive;
	for (a = 0; a < n; a++) {
		struct simgpu_model_task *d = &t[order[a]];

		en_advance(st, d->arrive, NULL, NULL);
		slot[order[a]] = en_add(st, d, d->ctx, d->arrive, NULL, NULL);
	}
	en_advance(st, INFINITY, NULL, NULL);
	for (i = 0; i < n; i++) {
		const struct en_task *k = &st->t[slot[i]];

		t[i].start = k->t_start;
		t[i].end = k->state == EN_DONE ? k->t_end : INFINITY;
	}
	i = st->stalled ? -1 : 0;
	free(st);
	free(order);
	free(slot);
	return i;
}

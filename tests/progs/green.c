/*
 * green.c - green contexts (CUDA 12.4+) through the driver API, loaded the
 * way cudart loads it: dlopen("libcuda.so.1"), then cuGetProcAddress_v2
 * (and plain dlsym, which must agree).  Runs on simgpu's libcuda.so.1 and
 * on a GPU's.
 *
 * Usage: test-green split             SM resources and splits, as JSON
 *        test-green run FATBIN SMS    add_one on the primary context and on
 *                                     an SMS-SM green context; an event of
 *                                     the green stream waited on by a
 *                                     primary stream (scale2 after it)
 *        test-green bad               bad arguments: the codes, as JSON
 *
 * FATBIN holds extern "C" add_one(float *, int) and scale2(float *, int)
 * (bench/bin/test-drvapi.fatbin); on simgpu their twins come from
 * $SIMGPU_TWINS.  Prints one JSON line; exits 1 (with "fail") when a call
 * that must succeed does not.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "readfile.h"

typedef CUresult (*getproc_t)(const char *, void **, int, cuuint64_t,
			      CUdriverProcAddressQueryResult *);

static void *lib;
static getproc_t getproc;

/* One entry point by cuGetProcAddress_v2 (CUDA 13.0), checked against dlsym. */
static void *sym(const char *name)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *fn = NULL, *direct;

	if (getproc(name, &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
	    st != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
		printf("{\"fail\":\"cuGetProcAddress %s\"}\n", name);
		exit(1);
	}
	direct = dlsym(lib, name);
	if (direct && direct != fn && strstr(name, "Green")) {
		printf("{\"fail\":\"dlsym and cuGetProcAddress disagree on %s\"}\n", name);
		exit(1);
	}
	return fn;
}

#define FN(name) static __typeof__(&name) p_##name
FN(cuInit);
FN(cuDeviceGet);
FN(cuDevicePrimaryCtxRetain);
FN(cuCtxSetCurrent);
FN(cuCtxGetCurrent);
FN(cuCtxDestroy);
FN(cuDeviceGetDevResource);
FN(cuCtxGetDevResource);
FN(cuGreenCtxGetDevResource);
FN(cuDevSmResourceSplitByCount);
FN(cuDevResourceGenerateDesc);
FN(cuGreenCtxCreate);
FN(cuGreenCtxDestroy);
FN(cuCtxFromGreenCtx);
FN(cuGreenCtxStreamCreate);
FN(cuStreamGetGreenCtx);
FN(cuGreenCtxRecordEvent);
FN(cuGreenCtxWaitEvent);
FN(cuStreamCreate);
FN(cuStreamDestroy);
FN(cuStreamSynchronize);
FN(cuStreamWaitEvent);
FN(cuEventCreate);
FN(cuEventRecord);
FN(cuCtxSynchronize);
FN(cuMemAlloc);
FN(cuMemcpyHtoD);
FN(cuMemcpyDtoH);
FN(cuLibraryLoadData);
FN(cuLibraryGetKernel);
FN(cuLaunchKernel);
FN(cuLaunchCooperativeKernel);

#define GET(name) (p_##name = (__typeof__(p_##name))sym(#name))

static void load(void)
{
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib || !(getproc = (getproc_t)dlsym(lib, "cuGetProcAddress_v2"))) {
		printf("{\"fail\":\"no libcuda.so.1\"}\n");
		exit(1);
	}
	GET(cuInit), GET(cuDeviceGet), GET(cuDevicePrimaryCtxRetain), GET(cuCtxSetCurrent);
	GET(cuCtxGetCurrent), GET(cuCtxDestroy), GET(cuDeviceGetDevResource);
	GET(cuCtxGetDevResource), GET(cuGreenCtxGetDevResource);
	GET(cuDevSmResourceSplitByCount), GET(cuDevResourceGenerateDesc), GET(cuGreenCtxCreate);
	GET(cuGreenCtxDestroy), GET(cuCtxFromGreenCtx), GET(cuGreenCtxStreamCreate);
	GET(cuStreamGetGreenCtx), GET(cuGreenCtxRecordEvent), GET(cuGreenCtxWaitEvent);
	GET(cuStreamCreate), GET(cuStreamDestroy), GET(cuStreamSynchronize);
	GET(cuStreamWaitEvent), GET(cuEventCreate), GET(cuEventRecord), GET(cuCtxSynchronize);
	GET(cuMemAlloc), GET(cuMemcpyHtoD), GET(cuMemcpyDtoH), GET(cuLibraryLoadData);
	GET(cuLibraryGetKernel), GET(cuLaunchKernel), GET(cuLaunchCooperativeKernel);
}

#define OK(call)                                                                   \
	do {                                                                       \
		CUresult rc_ = (call);                                             \
		if (rc_ != CUDA_SUCCESS) {                                         \
			printf("{\"fail\":\"%s\",\"rc\":%d}\n", #call, (int)rc_);  \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

static CUcontext setup(void)
{
	CUdevice dev;
	CUcontext ctx;

	OK(p_cuInit(0));
	OK(p_cuDeviceGet(&dev, 0));
	OK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
	OK(p_cuCtxSetCurrent(ctx));
	return ctx;
}

/* A green context of the first group of a split by min SMs. */
static CUgreenCtx make_green(unsigned min)
{
	CUdevResource dev, group;
	CUdevResourceDesc desc;
	unsigned nb = 1;
	CUgreenCtx g;

	OK(p_cuDeviceGetDevResource(0, &dev, CU_DEV_RESOURCE_TYPE_SM));
	OK(p_cuDevSmResourceSplitByCount(&group, &nb, &dev, NULL, 0, min));
	OK(p_cuDevResourceGenerateDesc(&desc, &group, 1));
	OK(p_cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
	return g;
}

/* ---------------------------------------------------------------- split */

static int split(void)
{
	static const unsigned mins[] = { 0, 1, 8, 9, 16, 20, 24, 32, 64, 66, 67, 100, 128, 132 };
	CUdevResource dev, groups[64], rem;
	unsigned i, nb, would;

	setup();
	OK(p_cuDeviceGetDevResource(0, &dev, CU_DEV_RESOURCE_TYPE_SM));
	printf("{\"device\":{\"sms\":%u,\"min\":%u,\"align\":%u},\"splits\":[", dev.sm.smCount,
	       dev.sm.minSmPartitionSize, dev.sm.smCoscheduledAlignment);
	for (i = 0; i < sizeof(mins) / sizeof(mins[0]); i++) {
		CUresult q, r1, r2;
		unsigned one = 1;
		CUdevResource g1, rem1;

		would = 0;
		q = p_cuDevSmResourceSplitByCount(NULL, &would, &dev, NULL, 0, mins[i]);
		nb = 64;
		memset(&rem, 0, sizeof(rem));
		r1 = p_cuDevSmResourceSplitByCount(groups, &nb, &dev, &rem, 0, mins[i]);
		memset(&rem1, 0, sizeof(rem1));
		r2 = p_cuDevSmResourceSplitByCount(&g1, &one, &dev, &rem1, 0, mins[i]);
		printf("%s{\"min\":%u,\"query_rc\":%d,\"would\":%u,\"rc\":%d,\"groups\":%u,"
		       "\"size\":%u,\"last\":%u,\"remaining\":%u,\"one_rc\":%d,\"one_groups\":%u,"
		       "\"one_size\":%u,\"one_remaining\":%u}",
		       i ? "," : "", mins[i], (int)q, would, (int)r1, nb,
		       r1 == CUDA_SUCCESS ? groups[0].sm.smCount : 0,
		       r1 == CUDA_SUCCESS ? groups[nb - 1].sm.smCount : 0,
		       r1 == CUDA_SUCCESS ? rem.sm.smCount : 0, (int)r2, one,
		       r2 == CUDA_SUCCESS ? g1.sm.smCount : 0,
		       r2 == CUDA_SUCCESS ? rem1.sm.smCount : 0);
	}
	printf("]}\n");
	return 0;
}

/* ---------------------------------------------------------------- run */

#define BLOCKS 1056
#define THREADS 256
#define N (BLOCKS * THREADS)

static void launch(CUfunction f, CUstream s, CUdeviceptr p)
{
	int n = N;
	void *args[] = { &p, &n };

	OK(p_cuLaunchKernel(f, BLOCKS, 1, 1, THREADS, 1, 1, 0, s, args, NULL));
}

/* Every element is want(i); the first one that is not, or -1. */
static long check(CUdeviceptr p, float *host, float add, float mul)
{
	long i;

	OK(p_cuMemcpyDtoH(host, p, N * sizeof(float)));
	for (i = 0; i < N; i++)
		if (host[i] != ((float)i + add) * mul)
			return i;
	return -1;
}

static int run(const char *fatbin, unsigned sms)
{
	CUcontext primary = setup(), gctx, cur;
	CUdevResource res;
	CUgreenCtx g, of_green = NULL, of_primary = (CUgreenCtx)1, of_null = NULL;
	CUstream gs, ps;
	CUevent ev;
	CUlibrary lb;
	CUkernel add_one, scale2;
	CUdeviceptr a, b, c;
	float *host = malloc(N * sizeof(float));
	void *image = test_read_file(fatbin, NULL);
	long bad_a, bad_b, bad_c;
	CUresult coop_fits, coop_over, coop_primary;
	int i;

	if (!host || !image) {
		printf("{\"fail\":\"no memory or no %s\"}\n", fatbin);
		return 1;
	}
	for (i = 0; i < N; i++)
		host[i] = (float)i;
	OK(p_cuLibraryLoadData(&lb, image, NULL, NULL, 0, NULL, NULL, 0));
	OK(p_cuLibraryGetKernel(&add_one, lb, "add_one"));
	OK(p_cuLibraryGetKernel(&scale2, lb, "scale2"));
	OK(p_cuMemAlloc(&a, N * sizeof(float)));
	OK(p_cuMemAlloc(&b, N * sizeof(float)));
	OK(p_cuMemAlloc(&c, N * sizeof(float)));
	OK(p_cuMemcpyHtoD(a, host, N * sizeof(float)));
	OK(p_cuMemcpyHtoD(b, host, N * sizeof(float)));
	OK(p_cuMemcpyHtoD(c, host, N * sizeof(float)));

	g = make_green(sms);
	OK(p_cuGreenCtxGetDevResource(g, &res, CU_DEV_RESOURCE_TYPE_SM));
	OK(p_cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
	OK(p_cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
	OK(p_cuEventCreate(&ev, CU_EVENT_DEFAULT));
	OK(p_cuStreamGetGreenCtx(gs, &of_green));
	OK(p_cuStreamGetGreenCtx(ps, &of_primary));

	/* 1: primary stream alone; 2: green stream alone (launch log order) */
	launch((CUfunction)add_one, ps, a);
	OK(p_cuStreamSynchronize(ps));
	launch((CUfunction)add_one, gs, b);
	OK(p_cuStreamSynchronize(gs));
	/* 3, 4: add_one on the green stream, scale2 on the primary one after
	 * the green stream's event */
	launch((CUfunction)add_one, gs, c);
	OK(p_cuEventRecord(ev, gs));
	OK(p_cuStreamWaitEvent(ps, ev, 0));
	launch((CUfunction)scale2, ps, c);
	OK(p_cuStreamSynchronize(ps));
	/* 5: the green context current, the NULL stream is its own */
	OK(p_cuCtxFromGreenCtx(&gctx, g));
	OK(p_cuCtxSetCurrent(gctx));
	OK(p_cuStreamGetGreenCtx(NULL, &of_null));
	launch((CUfunction)add_one, NULL, a);
	OK(p_cuCtxSynchronize());
	OK(p_cuCtxGetCurrent(&cur));
	OK(p_cuCtxSetCurrent(primary));
	/* 6: the green context's own record, waited on by the primary stream */
	launch((CUfunction)add_one, NULL, b);      /* primary's NULL stream now */
	OK(p_cuGreenCtxWaitEvent(g, ev));
	OK(p_cuGreenCtxRecordEvent(g, ev));
	OK(p_cuStreamWaitEvent(ps, ev, 0));
	OK(p_cuCtxSynchronize());

	/* a cooperative grid must be co-resident on the partition's SMs: 256
	 * threads a block is 8 blocks an SM (simgpu's occupancy rule) */
	{
		CUdeviceptr co;
		int n = N;
		void *cargs[] = { &co, &n };

		OK(p_cuMemAlloc(&co, N * sizeof(float)));

		coop_fits = p_cuLaunchCooperativeKernel((CUfunction)add_one, 8 * res.sm.smCount, 1, 1,
							THREADS, 1, 1, 0, gs, cargs);
		coop_over = p_cuLaunchCooperativeKernel((CUfunction)add_one, 8 * res.sm.smCount + 1, 1, 1,
							THREADS, 1, 1, 0, gs, cargs);
		coop_primary = p_cuLaunchCooperativeKernel((CUfunction)add_one, 8 * res.sm.smCount + 1, 1,
							   1, THREADS, 1, 1, 0, ps, cargs);
		OK(p_cuCtxSynchronize());
	}

	bad_a = check(a, host, 2, 1);       /* two add_one */
	bad_b = check(b, host, 2, 1);
	bad_c = check(c, host, 1, 2);       /* (x + 1) * 2: scale2 came after */
	OK(p_cuStreamDestroy(gs));
	OK(p_cuStreamDestroy(ps));
	OK(p_cuGreenCtxDestroy(g));
	printf("{\"green_sms\":%u,\"stream_green\":%s,\"primary_stream_green\":%s,"
	       "\"null_stream_green\":%s,\"current_is_green\":%s,\"bad_a\":%ld,\"bad_b\":%ld,"
	       "\"bad_c\":%ld,\"coop_fits\":%d,\"coop_over\":%d,\"coop_primary\":%d}\n",
	       res.sm.smCount, of_green == g ? "true" : "false", of_primary ? "true" : "false",
	       of_null == g ? "true" : "false", cur == gctx ? "true" : "false", bad_a, bad_b,
	       bad_c, (int)coop_fits, (int)coop_over, (int)coop_primary);
	return bad_a >= 0 || bad_b >= 0 || bad_c >= 0;
}

/* ---------------------------------------------------------------- bad */

static int bad(void)
{
	CUcontext primary = setup(), gctx;
	CUdevResource dev, groups[4], rem, other, mixed[2], wrong, dev_invalid;
	CUdevResourceDesc desc;
	CUgreenCtx g, dead;
	CUstream s;
	unsigned nb = 4, zero = 0;
	unsigned long long id = 0;

	(void)primary;
	OK(p_cuDeviceGetDevResource(0, &dev, CU_DEV_RESOURCE_TYPE_SM));
	OK(p_cuDevSmResourceSplitByCount(groups, &nb, &dev, &rem, 0, 16));
	nb = 1;
	OK(p_cuDevSmResourceSplitByCount(&other, &nb, &dev, NULL, 0, 8));
	memset(&wrong, 0, sizeof(wrong));
	wrong.type = CU_DEV_RESOURCE_TYPE_SM;      /* not one the driver made */
	wrong.sm.smCount = 8;
	dev_invalid = dev;
	dev_invalid.type = CU_DEV_RESOURCE_TYPE_INVALID;
	OK(p_cuDevResourceGenerateDesc(&desc, groups, 1));
	mixed[0] = groups[0];
	mixed[1] = other;
	dead = make_green(8);
	OK(p_cuGreenCtxDestroy(dead));
	g = make_green(8);
	OK(p_cuCtxFromGreenCtx(&gctx, g));
	nb = 4;

#define RC(name, call) printf("%s\"%s\":%d", first ? "" : ",", name, (int)(call)), first = 0
	int first = 1;

	printf("{");
	RC("get_null", p_cuDeviceGetDevResource(0, NULL, CU_DEV_RESOURCE_TYPE_SM));
	RC("get_type", p_cuDeviceGetDevResource(0, &dev, CU_DEV_RESOURCE_TYPE_INVALID));
	RC("get_device", p_cuDeviceGetDevResource(7, &dev, CU_DEV_RESOURCE_TYPE_SM));
	RC("split_nb_null", p_cuDevSmResourceSplitByCount(groups, NULL, &dev, &rem, 0, 8));
	RC("split_input_null", p_cuDevSmResourceSplitByCount(groups, &nb, NULL, &rem, 0, 8));
	RC("split_zero_groups", p_cuDevSmResourceSplitByCount(groups, &zero, &dev, &rem, 0, 8));
	RC("split_too_many_sms", p_cuDevSmResourceSplitByCount(groups, &nb, &dev, &rem, 0, 133));
	RC("split_rounds_past", p_cuDevSmResourceSplitByCount(groups, &nb, &dev, &rem, 0, 129));
	RC("split_flags", p_cuDevSmResourceSplitByCount(groups, &nb, &dev, &rem, 0x100, 8));
	RC("split_type", p_cuDevSmResourceSplitByCount(groups, &nb, &dev_invalid, &rem, 0, 8));
	RC("split_untagged", p_cuDevSmResourceSplitByCount(groups, &nb, &wrong, &rem, 0, 8));
	RC("split_again", p_cuDevSmResourceSplitByCount(&rem, &nb, &groups[0], NULL, 0, 8));
	RC("desc_null", p_cuDevResourceGenerateDesc(NULL, groups, 1));
	RC("desc_zero", p_cuDevResourceGenerateDesc(&desc, groups, 0));
	RC("desc_mixed", p_cuDevResourceGenerateDesc(&desc, mixed, 2));
	RC("create_flags", p_cuGreenCtxCreate(&dead, desc, 0, 0));
	RC("create_device", p_cuGreenCtxCreate(&dead, desc, 3, CU_GREEN_CTX_DEFAULT_STREAM));
	RC("create_garbage_desc",
	   p_cuGreenCtxCreate(&dead, (CUdevResourceDesc)&dev, 0, CU_GREEN_CTX_DEFAULT_STREAM));
	RC("create_null_desc", p_cuGreenCtxCreate(&dead, NULL, 0, CU_GREEN_CTX_DEFAULT_STREAM));
	RC("stream_blocking", p_cuGreenCtxStreamCreate(&s, g, CU_STREAM_DEFAULT, 0));
	RC("stream_null", p_cuGreenCtxStreamCreate(NULL, g, CU_STREAM_NON_BLOCKING, 0));
	RC("stream_dead", p_cuGreenCtxStreamCreate(&s, dead, CU_STREAM_NON_BLOCKING, 0));
	RC("stream_garbage",
	   p_cuGreenCtxStreamCreate(&s, (CUgreenCtx)&dev, CU_STREAM_NON_BLOCKING, 0));
	RC("destroy_dead", p_cuGreenCtxDestroy(dead));
	RC("destroy_null", p_cuGreenCtxDestroy(NULL));
	RC("from_null", p_cuCtxFromGreenCtx(NULL, g));
	RC("from_dead", p_cuCtxFromGreenCtx(&gctx, dead));
	RC("ctx_destroy_green", p_cuCtxDestroy(gctx));
	RC("res_dead", p_cuGreenCtxGetDevResource(dead, &rem, CU_DEV_RESOURCE_TYPE_SM));
	RC("res_null", p_cuGreenCtxGetDevResource(g, NULL, CU_DEV_RESOURCE_TYPE_SM));
	RC("ctx_res_garbage", p_cuCtxGetDevResource((CUcontext)&dev, &rem, CU_DEV_RESOURCE_TYPE_SM));
	RC("record_null_event", p_cuGreenCtxRecordEvent(g, NULL));
	RC("record_dead", p_cuGreenCtxRecordEvent(dead, (CUevent)&dev));
	RC("wait_null_event", p_cuGreenCtxWaitEvent(g, NULL));
	RC("stream_green_null", p_cuStreamGetGreenCtx(NULL, NULL));
	RC("stream_green_garbage", p_cuStreamGetGreenCtx((CUstream)&dev, &dead));
	{
		typeof(&cuGreenCtxGetId) get_id = (typeof(get_id))sym("cuGreenCtxGetId");

		RC("id_null", get_id(g, NULL));
		RC("id_dead", get_id(dead, &id));
	}
	RC("destroy_ok", p_cuGreenCtxDestroy(g));
	RC("destroy_twice", p_cuGreenCtxDestroy(g));
	printf("}\n");
	return 0;
}

int main(int argc, char **argv)
{
	load();
	if (argc == 2 && !strcmp(argv[1], "split"))
		return split();
	if (argc == 4 && !strcmp(argv[1], "run"))
		return run(argv[2], (unsigned)atoi(argv[3]));
	if (argc == 2 && !strcmp(argv[1], "bad"))
		return bad();
	fprintf(stderr, "usage: %s split | run FATBIN SMS | bad\n", argv[0]);
	return 2;
}

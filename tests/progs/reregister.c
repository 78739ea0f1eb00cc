/*
 * reregister.c - a kernel whose fat binary is unregistered and registered
 * again under the same host stub, as when a CUDA shared library is
 * dlclose'd and dlopen'ed again at the same address.  The calls are the
 * ones nvcc's generated constructor and destructor make
 * (__cudaRegisterFatBinary, __cudaRegisterFunction,
 * __cudaRegisterFatBinaryEnd, __cudaUnregisterFatBinary), made here by
 * hand so that no nvcc-built library is needed: the image is vecadd's fat
 * binary (c = a + b over n floats, "_Z6vecaddPKfS0_Pfi"), read from a file,
 * and a fresh copy of it is registered each round, as a reloaded library
 * brings its image anew.
 *
 * Usage: test-reregister <vecadd fatbin file> [launches per round (10)] [wait]
 * Prints "REREG round=<r> launches=<n> PASS" per round (c checked against
 * the CPU), then "PASS reregister", or "FAIL reregister <why>" and exits 1.
 * With "wait", it reads a line from stdin before registering again (a test
 * changes the app's route there: the first forwarded launch then comes
 * after the first image was unregistered).
 * Needs the runtime (simgpu, or a GPU's libcudart.so.13) and, on simgpu,
 * vecadd's twins in $SIMGPU_TWINS.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "readfile.h"

#define N      1024
#define ROUNDS 2
#define KNAME  "_Z6vecaddPKfS0_Pfi"

struct fat_wrapper {              /* __cudaRegisterFatBinary's argument */
	unsigned magic, version;
	const void *data;
	const void *filename_or_fatbins;
};

static void **(*reg_fat)(void *);
static void (*reg_end)(void **);
static void (*unreg_fat)(void **);
static void (*reg_fn)(void **, const char *, char *, const char *, int, uint3 *, uint3 *,
		      dim3 *, dim3 *, int *);
static cudaError_t (*c_malloc)(void **, size_t);
static cudaError_t (*c_memcpy)(void *, const void *, size_t, enum cudaMemcpyKind);
static cudaError_t (*c_launch)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
static cudaError_t (*c_sync)(void);

/* the host stub: only its address matters (the registration's key) */
__attribute__((noinline)) static void vecadd_stub(void)
{
	__asm__ volatile("");
}

static int fail(const char *why, int rc)
{
	printf("FAIL reregister %s (%d)\n", why, rc);
	return 1;
}

/* The symbols through the global namespace: a preloaded shim's first. */
static int resolve(void)
{
	if (!dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL))
		return -1;
	*(void **)&reg_fat = dlsym(RTLD_DEFAULT, "__cudaRegisterFatBinary");
	*(void **)&reg_end = dlsym(RTLD_DEFAULT, "__cudaRegisterFatBinaryEnd");
	*(void **)&unreg_fat = dlsym(RTLD_DEFAULT, "__cudaUnregisterFatBinary");
	*(void **)&reg_fn = dlsym(RTLD_DEFAULT, "__cudaRegisterFunction");
	*(void **)&c_malloc = dlsym(RTLD_DEFAULT, "cudaMalloc");
	*(void **)&c_memcpy = dlsym(RTLD_DEFAULT, "cudaMemcpy");
	*(void **)&c_launch = dlsym(RTLD_DEFAULT, "cudaLaunchKernel");
	*(void **)&c_sync = dlsym(RTLD_DEFAULT, "cudaDeviceSynchronize");
	return reg_fat && reg_end && unreg_fat && reg_fn && c_malloc && c_memcpy && c_launch &&
			       c_sync ? 0 : -1;
}

int main(int argc, char **argv)
{
	static float a[N], b[N], c[N];
	unsigned char *image;
	float *da, *db, *dc;
	size_t size = 0;
	int launches = argc > 2 ? atoi(argv[2]) : 10, r, i, n = N;
	int wait = argc > 3 && !strcmp(argv[3], "wait");
	cudaError_t e;

	if (argc < 2 || launches < 1)
		return fail("usage: test-reregister <vecadd fatbin file> [launches]", 2);
	image = test_read_file(argv[1], &size);
	if (!image || size <= 16) /* not even a fat binary's header */
		return fail("cannot read the fat binary", 0);
	if (resolve() < 0)
		return fail("no CUDA runtime symbols", 0);
	for (r = 0; r < ROUNDS; r++) {
		/* a reloaded library brings its image anew (never freed here:
		 * a runtime may keep pointers into an image it loaded) */
		struct fat_wrapper *w = calloc(1, sizeof(*w));
		unsigned char *img = malloc((size_t)size);
		char name[] = KNAME;
		void **h;

		if (!w || !img)
			return fail("out of memory", r);
		memcpy(img, image, (size_t)size);
		w->magic = 0x466243b1u;
		w->version = 1;
		w->data = img;
		h = reg_fat(w);
		reg_fn(h, (const char *)(void *)vecadd_stub, name, name, -1, NULL, NULL, NULL, NULL,
		       NULL);
		reg_end(h);
		if (r == 0) {
			e = c_malloc((void **)&da, sizeof(a));
			if (!e)
				e = c_malloc((void **)&db, sizeof(b));
			if (!e)
				e = c_malloc((void **)&dc, sizeof(c));
			if (e)
				return fail("cudaMalloc", e);
		}
		for (i = 0; i < N; i++) {
			a[i] = (float)i;
			b[i] = (float)(r + 1) * 0.5f;
			c[i] = -1.0f;
		}
		if ((e = c_memcpy(da, a, sizeof(a), cudaMemcpyHostToDevice)) ||
		    (e = c_memcpy(db, b, sizeof(b), cudaMemcpyHostToDevice)) ||
		    (e = c_memcpy(dc, c, sizeof(c), cudaMemcpyHostToDevice)))
			return fail("cudaMemcpy to the device", e);
		for (i = 0; i < launches; i++) {
			void *args[] = { &da, &db, &dc, &n };
			dim3 grid = { N / 256, 1, 1 }, block = { 256, 1, 1 };

			e = c_launch((const void *)vecadd_stub, grid, block, args, 0, NULL);
			if (e)
				return fail("cudaLaunchKernel", e);
		}
		if ((e = c_sync()))
			return fail("cudaDeviceSynchronize", e);
		if ((e = c_memcpy(c, dc, sizeof(c), cudaMemcpyDeviceToHost)))
			return fail("cudaMemcpy to the host", e);
		for (i = 0; i < N; i++)
			if (c[i] != a[i] + b[i])
				return fail("wrong result at", i);
		printf("REREG round=%d launches=%d PASS\n", r, launches);
		fflush(stdout);
		unreg_fat(h);           /* as dlclose runs the destructor */
		if (wait && r + 1 < ROUNDS) {
			char line[16];

			if (!fgets(line, sizeof(line), stdin))
				return fail("stdin closed", r);
		}
	}
	printf("PASS reregister\n");
	return 0;
}

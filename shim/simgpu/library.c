/*
 * library.c - cudaLibraryLoadData and friends: kernels from a fat binary
 * handed over at run time, as a process-pool worker gets an app's module.
 *
 * The image is parsed once, at load, with fatbin.c (the raw-image entry
 * point: strict, so a damaged image is cudaErrorInvalidKernelImage): each
 * kernel becomes a record of kernels.c with the layout from the cubin, and
 * nothing of the caller's buffer is kept (a real runtime lets the caller
 * free it after the call).  Launches take the handle like any cudaKernel_t;
 * the host twin is found by the kernel's mangled name at its first launch,
 * as for registered kernels.
 *
 * Only fat binaries (nvcc's 0xBA55ED50 images) are read; a bare cubin or
 * PTX is cudaErrorInvalidKernelImage here (a GPU would take both).  A fat
 * binary with no ELF image simgpu can read (PTX only, or compressed with a
 * codec this system lacks) is cudaErrorNoKernelImageForDevice.
 *
 * Handles are validated through a set; an unloaded library leaves the set
 * and its kernels' handles fail from then on, but no record is freed: a
 * launch queued before the unload may still be running it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simgpu_impl.h"

static struct sg_hset libs = SG_HSET_INIT;

struct collect {
	struct sg_library *lib;
	unsigned cap;
	int ignore_layout;
};

static void free_params(struct sg_params *p)
{
	free(p->off);
	free(p->size);
	p->off = p->size = NULL;
}

/* One kernel of the image (fatbin.c calls this per image it is in). */
static int add_kernel(const char *name, struct sg_params *p, void *arg)
{
	struct collect *c = arg;
	struct sg_library *lib = c->lib;
	struct sg_kernel *k;
	unsigned i;

	for (i = 0; i < lib->n; i++) {
		if (!strcmp(lib->k[i]->name, name)) {
			free_params(p);           /* another arch's copy of it */
			return 0;
		}
	}
	if (c->ignore_layout) {
		free_params(p);
		p->n = -1;
	}
	if (lib->n == c->cap) {
		unsigned cap = c->cap ? 2 * c->cap : 8;
		struct sg_kernel **nk = realloc(lib->k, cap * sizeof(*nk));

		if (!nk)
			goto oom;
		lib->k = nk;
		c->cap = cap;
	}
	k = sg_kernel_of_library(lib, name, p);
	if (!k)
		goto oom;
	lib->k[lib->n++] = k;
	return 0;
oom:
	free_params(p);
	return -1;
}

static struct sg_library *lib_of(cudaLibrary_t h)
{
	return h && sg_hset_has(&libs, h) ? (struct sg_library *)h : NULL;
}

SG_API cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
				       enum cudaJitOption *jitOptions, void **jitOptionsValues,
				       unsigned int numJitOptions,
				       enum cudaLibraryOption *libraryOptions,
				       void **libraryOptionValues, unsigned int numLibraryOptions)
{
	struct collect c = { NULL, 0, 0 };
	struct sg_fatbin *fb;
	uint64_t size = 0;
	int n;

	sg_init();
	if (!library || !code || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
	    (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
		return sg_err(cudaErrorInvalidValue);
	/* JIT and library options change nothing for a CPU device */
	fb = sg_fatbin_image(code, &size);
	if (!fb) {
		sg_log("cudaLibraryLoadData: not a fat binary, or a damaged one");
		return sg_err(cudaErrorInvalidKernelImage);
	}
	if (!sg_fatbin_nimages(fb)) {
		sg_fatbin_close(fb);
		return sg_err(cudaErrorNoKernelImageForDevice);
	}
	c.lib = calloc(1, sizeof(*c.lib));
	if (!c.lib) {
		sg_fatbin_close(fb);
		return sg_err(cudaErrorMemoryAllocation);
	}
	c.ignore_layout = getenv("SIMGPU_IGNORE_CUBIN") != NULL;
	n = sg_fatbin_each_kernel(fb, add_kernel, &c);
	sg_fatbin_close(fb);
	if (n < 0 || sg_hset_add(&libs, c.lib) < 0) {
		/* the kernels made so far stay (records are never freed), dead */
		atomic_store(&c.lib->unloaded, 1);
		return sg_err(cudaErrorMemoryAllocation);
	}
	sg_log("library %p: %u kernels from a %llu-byte fat binary", (void *)c.lib, c.lib->n,
	       (unsigned long long)size);
	*library = (cudaLibrary_t)c.lib;
	return cudaSuccess;
}

/* The file read whole, then as cudaLibraryLoadData. */
SG_API cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t *library, const char *fileName,
					   enum cudaJitOption *jitOptions, void **jitOptionsValues,
					   unsigned int numJitOptions,
					   enum cudaLibraryOption *libraryOptions,
					   void **libraryOptionValues, unsigned int numLibraryOptions)
{
	struct stat st;
	cudaError_t e;
	char *buf;
	size_t got = 0;
	uint64_t fat;
	uint32_t magic;
	uint16_t hdr;
	int fd;

	sg_init();
	if (!library || !fileName)
		return sg_err(cudaErrorInvalidValue);
	fd = open(fileName, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sg_err(cudaErrorInvalidValue);
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 16 ||
	    (uint64_t)st.st_size > (1ull << 30)) {
		close(fd);
		return sg_err(cudaErrorInvalidKernelImage);
	}
	buf = malloc((size_t)st.st_size);
	if (!buf) {
		close(fd);
		return sg_err(cudaErrorMemoryAllocation);
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (got != (size_t)st.st_size) {
		free(buf);
		return sg_err(cudaErrorInvalidKernelImage);
	}
	/* the image must also say it is no longer than the file */
	memcpy(&magic, buf, 4);
	memcpy(&hdr, buf + 6, 2);
	memcpy(&fat, buf + 8, 8);
	if (magic == 0xBA55ED50u && (fat > got || hdr > got - fat)) {
		free(buf);
		return sg_err(cudaErrorInvalidKernelImage);
	}
	e = cudaLibraryLoadData(library, buf, jitOptions, jitOptionsValues, numJitOptions,
				libraryOptions, libraryOptionValues, numLibraryOptions);
	free(buf);
	return e;
}

SG_API cudaError_t cudaLibraryUnload(cudaLibrary_t library)
{
	struct sg_library *lib;

	sg_init();
	lib = lib_of(library);
	if (!lib)
		return sg_err(cudaErrorInvalidResourceHandle);
	sg_hset_del(&libs, lib);
	atomic_store_explicit(&lib->unloaded, 1, memory_order_release);
	return cudaSuccess;
}

SG_API cudaError_t cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library,
					const char *name)
{
	struct sg_library *lib;
	unsigned i;

	sg_init();
	if (!pKernel || !name)
		return sg_err(cudaErrorInvalidValue);
	lib = lib_of(library);
	if (!lib)
		return sg_err(cudaErrorInvalidResourceHandle);
	for (i = 0; i < lib->n; i++) {
		if (!strcmp(lib->k[i]->name, name)) {
			*pKernel = (cudaKernel_t)lib->k[i];
			return cudaSuccess;
		}
	}
	return sg_err(cudaErrorSymbolNotFound);
}

SG_API cudaError_t cudaLibraryGetKernelCount(unsigned int *count, cudaLibrary_t lib)
{
	struct sg_library *l;

	sg_init();
	if (!count)
		return sg_err(cudaErrorInvalidValue);
	l = lib_of(lib);
	if (!l)
		return sg_err(cudaErrorInvalidResourceHandle);
	*count = l->n;
	return cudaSuccess;
}

SG_API cudaError_t cudaLibraryEnumerateKernels(cudaKernel_t *kernels, unsigned int numKernels,
					       cudaLibrary_t lib)
{
	struct sg_library *l;
	unsigned i;

	sg_init();
	if (!kernels && numKernels)
		return sg_err(cudaErrorInvalidValue);
	l = lib_of(lib);
	if (!l)
		return sg_err(cudaErrorInvalidResourceHandle);
	for (i = 0; i < numKernels && i < l->n; i++)
		kernels[i] = (cudaKernel_t)l->k[i];
	return cudaSuccess;
}

/*
 * image.c - what cuModuleLoadData and friends may be handed, made into a
 * fat binary that simgpu's runtime loads (cudaLibraryLoadData parses only
 * nvcc's 0xBA55ED50 images):
 *
 *   fat binary     copied: header and payload, headerSize + fatSize bytes
 *   fatbin wrapper the __fatbinwrap struct nvcc's host code holds (magic
 *                  0x466243b1): its fat binary
 *   cubin          an ELF image: wrapped in a fat binary of one entry
 *   PTX            CUDA_ERROR_JIT_COMPILER_NOT_FOUND: nothing here compiles
 *                  PTX (kernels run as host twins, found by name only once
 *                  a cubin says which kernels exist and their layout)
 *
 * The driver API gives no image size: a fat binary's header and a cubin's
 * ELF headers say how long they are, and they are trusted as the driver
 * trusts them; a file's size bounds them.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "drv.h"

#define FATBIN_MAGIC   0xBA55ED50u
#define WRAPPER_MAGIC  0x466243b1u
#define ENTRY_ELF      2
#define ENTRY_HDR      64
#define IMAGE_MAX      (1ull << 30)

struct wrapper {
	int         magic;
	int         version;
	const void *data;
	void       *unused;
};

static uint64_t rd(const void *p, size_t n)
{
	uint64_t v = 0;

	memcpy(&v, p, n);      /* little-endian host, as the images */
	return v;
}

static void wr(void *p, uint64_t v, size_t n)
{
	memcpy(p, &v, n);
}

/* Bytes of the ELF image at p, from its headers; 0 when it is not one. */
static size_t elf_len(const uint8_t *p, size_t max)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)p;
	uint64_t end;
	unsigned i;

	if (max && max < sizeof(*eh))
		return 0;
	if (memcmp(p, ELFMAG, SELFMAG) != 0 || p[EI_CLASS] != ELFCLASS64 ||
	    eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > IMAGE_MAX)
		return 0;
	end = eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr);
	if (end > IMAGE_MAX || (max && end > max))
		return 0;
	for (i = 0; i < eh->e_shnum; i++) {
		const Elf64_Shdr *s = (const Elf64_Shdr *)(p + eh->e_shoff) + i;

		if (s->sh_type == SHT_NOBITS)
			continue;
		if (s->sh_offset > IMAGE_MAX || s->sh_size > IMAGE_MAX)
			return 0;
		if (s->sh_offset + s->sh_size > end)
			end = s->sh_offset + s->sh_size;
	}
	if (eh->e_phoff && eh->e_phnum && eh->e_phentsize == sizeof(Elf64_Phdr) &&
	    eh->e_phoff <= IMAGE_MAX) {
		uint64_t pe = eh->e_phoff + (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr);

		if (pe > end)
			end = pe;
	}
	if (end > IMAGE_MAX || (max && end > max))
		return 0;
	return (size_t)end;
}

/* One ELF image as a fat binary: 16-byte header, one 64-byte entry. */
static CUresult wrap_cubin(const uint8_t *elf, size_t n, void **out, size_t *len)
{
	size_t pad = (8 - n % 8) % 8, total = 16 + ENTRY_HDR + n + pad;
	uint8_t *fb = calloc(1, total);
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)elf;

	if (!fb)
		return CUDA_ERROR_OUT_OF_MEMORY;
	wr(fb, FATBIN_MAGIC, 4);
	wr(fb + 4, 1, 2);                       /* version                   */
	wr(fb + 6, 16, 2);                      /* header size               */
	wr(fb + 8, ENTRY_HDR + n + pad, 8);     /* payload size              */
	wr(fb + 16, ENTRY_ELF, 2);              /* kind                      */
	wr(fb + 18, 0x0101, 2);                 /* entry version             */
	wr(fb + 20, ENTRY_HDR, 4);              /* entry header size         */
	wr(fb + 24, n + pad, 8);                /* payload size              */
	wr(fb + 40, 0x00010008, 4);             /* as nvcc writes it         */
	wr(fb + 44, eh->e_flags & 0xff, 4);     /* sm_XY                     */
	wr(fb + 56, 0x11, 8);                   /* 64-bit, ELF: nvcc's flags */
	memcpy(fb + 16 + ENTRY_HDR, elf, n);
	*out = fb;
	*len = total;
	return CUDA_SUCCESS;
}

static int looks_like_ptx(const char *s)
{
	size_t i;

	/* PTX is text beginning with comments or directives */
	for (i = 0; i < 4096 && s[i]; i++) {
		if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')
			continue;
		if (s[i] == '/' && s[i + 1] == '/') {
			while (i < 4096 && s[i] && s[i] != '\n')
				i++;
			if (!s[i])
				return 1;
			continue;
		}
		return s[i] == '.';
	}
	return 0;
}

CUresult drv_image_fatbin(const void *image, size_t max, void **out, size_t *len)
{
	const uint8_t *p = image;
	uint64_t total;
	size_t n;
	void *copy;

	if (!image || !out || !len)
		return CUDA_ERROR_INVALID_VALUE;
	if ((!max || max >= 16) && rd(p, 4) == WRAPPER_MAGIC) {
		const struct wrapper *w = image;

		if (!w->data)
			return CUDA_ERROR_INVALID_IMAGE;
		p = w->data;
		max = 0;
	}
	if ((!max || max >= 16) && rd(p, 4) == FATBIN_MAGIC) {
		total = rd(p + 6, 2) + rd(p + 8, 8);
		if (rd(p + 6, 2) < 16 || total > IMAGE_MAX || (max && total > max))
			return CUDA_ERROR_INVALID_IMAGE;
		copy = malloc((size_t)total);
		if (!copy)
			return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(copy, p, (size_t)total);
		*out = copy;
		*len = (size_t)total;
		return CUDA_SUCCESS;
	}
	if ((!max || max >= SELFMAG) && !memcmp(p, ELFMAG, SELFMAG)) {
		n = elf_len(p, max);
		if (!n)
			return CUDA_ERROR_INVALID_IMAGE;
		return wrap_cubin(p, n, out, len);
	}
	if (looks_like_ptx((const char *)p))
		return CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
	return CUDA_ERROR_INVALID_IMAGE;
}

CUresult drv_image_read_file(const char *path, void **buf, size_t *len)
{
	struct stat st;
	size_t got = 0;
	char *b;
	int fd;

	if (!path || !buf || !len)
		return CUDA_ERROR_INVALID_VALUE;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_FILE_NOT_FOUND;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (uint64_t)st.st_size > IMAGE_MAX) {
		close(fd);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	/* one zero byte past the end: PTX text is read as a string */
	b = malloc((size_t)st.st_size + 1);
	if (!b) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, b + got, (size_t)st.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (got != (size_t)st.st_size) {
		free(b);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	b[got] = 0;
	*buf = b;
	*len = got;
	return CUDA_SUCCESS;
}

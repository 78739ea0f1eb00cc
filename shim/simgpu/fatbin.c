/*
 * fatbin.c - read what simgpu needs from the device code nvcc embeds:
 * each kernel's parameter layout, and the initial values of __device__
 * variables.
 *
 * Why: a launch is asynchronous, and its args[] point into the caller's
 * stack frame, so the launch must copy the argument values - and only the
 * cubin knows how big each one is.  Without a layout a launch still works
 * but waits until the executor has consumed the arguments.
 *
 * Format (reverse-engineered, stable since CUDA 10):
 *   wrapper  { u32 magic 0x466243b1; u32 version; const void *fatbin; ... }
 *   fatbin   { u32 magic 0xBA55ED50; u16 version; u16 header_size;
 *              u64 payload_size } then entries
 *   entry    { u16 kind (1 PTX, 2 ELF); u16 version; u32 header_size;
 *              u64 payload_size; ... u64 flags @40; u64 raw_size @56 }
 *            flags 0x2000: LZ4 payload, 0x8000: zstd payload (CUDA 13 uses
 *            zstd with -Xfatbin -compress-all and for PTX)
 *   cubin    an ELF file; section ".nv.info.<kernel>" holds attribute
 *            records { u8 format; u8 attribute; u16 size-or-value; data }
 *            and EIATTR_KPARAM_INFO (0x17) records
 *            { u32 index; u16 ordinal; u16 offset; u32 flags } where the
 *            parameter's size in bytes is flags >> 18.
 * Compressed entries are inflated with libzstd / liblz4 when the system
 * has them (dlopen; no build dependency).  Every offset read from the
 * image is bounds-checked: a damaged image means "layout unknown".
 *
 * Two ways in: a registration wrapper (sg_fatbin_open, parsed lazily:
 * registration runs in static constructors) and a raw image
 * (sg_fatbin_image, for cudaLibraryLoadData: parsed at once, strictly, so
 * that a damaged image is an error, and closed once its kernels are read,
 * keeping nothing that points into the caller's buffer).
 */
#include <dlfcn.h>
#include <elf.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_impl.h"

#define FATBIN_MAGIC        0xBA55ED50u
#define ENTRY_ELF           2
#define FLAG_LZ4            0x2000
#define FLAG_ZSTD           0x8000
#define EIATTR_KPARAM_INFO  0x17
#define EIATTR_REGCOUNT     0x2f
#define EIFMT_SVAL          4
#define MAX_IMAGE           (512u << 20)
#define MAX_FATBIN          (1ull << 30)    /* a raw image, header included */

struct image {
	const uint8_t *p;
	size_t         n;
	int            owned;     /* inflated: ours to free */
};

struct sg_fatbin {
	const void     *wrapper;
	pthread_mutex_t mu;
	int             parsed;
	struct image   *img;
	int             nimg;
};

struct fatbin_wrapper {
	int         magic;
	int         version;
	const void *data;
	void       *filename_or_fatbins;
};

static inline uint16_t rd16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline uint32_t rd32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline uint64_t rd64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* ---------------------------------------------------------------- inflate */

static size_t (*zstd_decompress)(void *, size_t, const void *, size_t);
static unsigned (*zstd_is_error)(size_t);
static int (*lz4_decompress)(const char *, char *, int, int);
static pthread_once_t codec_once = PTHREAD_ONCE_INIT;

static void load_codecs(void)
{
	void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);

	if (h) {
		*(void **)&zstd_decompress = dlsym(h, "ZSTD_decompress");
		*(void **)&zstd_is_error = dlsym(h, "ZSTD_isError");
	}
	h = dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h)
		*(void **)&lz4_decompress = dlsym(h, "LZ4_decompress_safe");
}

static uint8_t *inflate(const uint8_t *src, size_t n, size_t comp_n, size_t raw_n,
			uint64_t flags)
{
	uint8_t *dst;

	if (raw_n == 0 || raw_n > MAX_IMAGE)
		return NULL;
	pthread_once(&codec_once, load_codecs);
	dst = malloc(raw_n);
	if (!dst)
		return NULL;
	if ((flags & FLAG_ZSTD) && zstd_decompress && zstd_is_error) {
		size_t r = zstd_decompress(dst, raw_n, src, comp_n && comp_n <= n ? comp_n : n);

		if (!zstd_is_error(r) && r == raw_n)
			return dst;
	} else if ((flags & FLAG_LZ4) && lz4_decompress && n < (1u << 31)) {
		int r = lz4_decompress((const char *)src, (char *)dst,
				       (int)(comp_n && comp_n <= n ? comp_n : n), (int)raw_n);

		if (r > 0)
			return dst;
	}
	free(dst);
	return NULL;
}

/* ---------------------------------------------------------------- fatbin */

/* Is the ELF header sound enough for shdr() and sec_name() below? */
static int elf_ok(const uint8_t *p, size_t n)
{
	Elf64_Ehdr eh;

	if (n < sizeof(eh) || memcmp(p, ELFMAG, SELFMAG) != 0 || p[EI_CLASS] != ELFCLASS64)
		return 0;
	memcpy(&eh, p, sizeof(eh));
	return eh.e_shentsize >= sizeof(Elf64_Shdr) && eh.e_shstrndx < eh.e_shnum &&
	       eh.e_shoff <= n && (uint64_t)eh.e_shnum * eh.e_shentsize <= n - eh.e_shoff;
}

/* 0 kept (or skipped: not ours to read), -1 not a sound ELF image. */
static int add_image(struct sg_fatbin *fb, const uint8_t *p, size_t n, int owned)
{
	struct image *ni;

	if (!elf_ok(p, n))
		return -1;
	ni = realloc(fb->img, sizeof(*ni) * (size_t)(fb->nimg + 1));
	if (!ni)
		return 0;
	fb->img = ni;
	fb->img[fb->nimg].p = p;
	fb->img[fb->nimg].n = n;
	fb->img[fb->nimg].owned = owned;
	fb->nimg++;
	return 0;
}

/*
 * The entries of the fatbin at base: ELF images kept (compressed ones
 * inflated).  0, or -1 when the image is damaged: a bad header, entries
 * that do not tile the payload, an ELF entry that is not an ELF file.  A
 * compressed entry without its codec on this system is skipped, not an
 * error.  *total: header + payload bytes.
 */
static int parse_image(struct sg_fatbin *fb, const uint8_t *base, uint64_t *total)
{
	const uint8_t *p, *end;
	uint64_t fat_size;
	uint16_t hdr;
	int bad = 0;

	if (rd32(base) != FATBIN_MAGIC)
		return -1;
	hdr = rd16(base + 6);
	fat_size = rd64(base + 8);
	if (hdr < 16 || fat_size > MAX_FATBIN - hdr)
		return -1;
	if (total)
		*total = hdr + fat_size;
	p = base + hdr;
	end = p + fat_size;
	while (p + 64 <= end) {
		uint16_t kind = rd16(p);
		uint32_t ehdr = rd32(p + 4);
		uint64_t size = rd64(p + 8);
		uint64_t comp = rd64(p + 16);
		uint64_t flags = rd64(p + 40);
		uint64_t raw = rd64(p + 56);
		const uint8_t *payload = p + ehdr;

		if (ehdr < 64 || ehdr > (uint64_t)(end - p) || size > (uint64_t)(end - payload))
			return -1;
		if (kind == ENTRY_ELF) {
			if (flags & (FLAG_LZ4 | FLAG_ZSTD)) {
				uint8_t *img = inflate(payload, size, comp, raw, flags);

				if (img && add_image(fb, img, raw, 1) < 0) {
					free(img);
					bad = 1;
				}
			} else if (add_image(fb, payload, size, 0) < 0) {
				bad = 1;
			}
		}
		p = payload + size;
	}
	/* whatever is left must be padding */
	for (; p < end; p++)
		if (*p)
			return -1;
	return bad ? -1 : 0;
}

static void parse(struct sg_fatbin *fb)
{
	const struct fatbin_wrapper *w = fb->wrapper;

	if (w && w->data)
		parse_image(fb, w->data, NULL);   /* what could be read is kept */
}

struct sg_fatbin *sg_fatbin_open(const void *wrapper)
{
	struct sg_fatbin *fb = calloc(1, sizeof(*fb));

	if (!fb)
		return NULL;
	fb->wrapper = wrapper;
	pthread_mutex_init(&fb->mu, NULL);
	return fb;     /* parsed lazily: registration runs before main */
}

struct sg_fatbin *sg_fatbin_image(const void *image, uint64_t *size)
{
	struct sg_fatbin *fb = sg_fatbin_open(NULL);

	if (!fb)
		return NULL;
	fb->parsed = 1;
	if (parse_image(fb, image, size) < 0) {
		sg_fatbin_close(fb);
		return NULL;
	}
	return fb;
}

int sg_fatbin_nimages(const struct sg_fatbin *fb)
{
	return fb ? fb->nimg : 0;
}

void sg_fatbin_close(struct sg_fatbin *fb)
{
	int i;

	if (!fb)
		return;
	for (i = 0; i < fb->nimg; i++)
		if (fb->img[i].owned)
			free((void *)fb->img[i].p);
	free(fb->img);
	pthread_mutex_destroy(&fb->mu);
	free(fb);
}

static void ensure_parsed(struct sg_fatbin *fb)
{
	pthread_mutex_lock(&fb->mu);
	if (!fb->parsed) {
		parse(fb);
		fb->parsed = 1;
	}
	pthread_mutex_unlock(&fb->mu);
}

/* ---------------------------------------------------------------- ELF */

/* Section header i of an image, or NULL if out of bounds. */
static const Elf64_Shdr *shdr(const struct image *im, unsigned i)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;
	uint64_t off;

	if (eh->e_shentsize < sizeof(Elf64_Shdr) || i >= eh->e_shnum)
		return NULL;
	off = eh->e_shoff + (uint64_t)i * eh->e_shentsize;
	if (off > im->n || im->n - off < sizeof(Elf64_Shdr))
		return NULL;
	return (const Elf64_Shdr *)(im->p + off);
}

static int sec_ok(const struct image *im, const Elf64_Shdr *s)
{
	return s->sh_type == SHT_NOBITS ||
	       (s->sh_offset <= im->n && s->sh_size <= im->n - s->sh_offset);
}

/* NUL-terminated string at offset o of string section st, or NULL. */
static const char *str_at(const struct image *im, const Elf64_Shdr *st, uint64_t o)
{
	const char *s;

	if (!st || !sec_ok(im, st) || st->sh_type == SHT_NOBITS || o >= st->sh_size)
		return NULL;
	s = (const char *)im->p + st->sh_offset + o;
	return memchr(s, 0, st->sh_size - o) ? s : NULL;
}

static const char *sec_name(const struct image *im, const Elf64_Shdr *s)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;

	return str_at(im, shdr(im, eh->e_shstrndx), s->sh_name);
}

static int kparams(const struct image *im, const Elf64_Shdr *s, struct sg_params *out)
{
	const uint8_t *p = im->p + s->sh_offset, *end = p + s->sh_size;
	uint32_t off[4096], size[4096];
	int n = 0, i;
	uint32_t total = 0;

	memset(size, 0, sizeof(size));
	while (p + 4 <= end) {
		uint8_t fmt = p[0], attr = p[1];
		uint16_t v = rd16(p + 2);

		if (fmt == EIFMT_SVAL) {
			if (v > end - (p + 4))
				return -1;
			if (attr == EIATTR_KPARAM_INFO && v >= 12) {
				uint16_t ord = rd16(p + 8), o = rd16(p + 10);
				uint32_t fl = rd32(p + 12), sz = fl >> 18;

				if (ord >= 4096 || sz == 0)
					return -1;
				off[ord] = o;
				size[ord] = sz;
				if (ord + 1 > n)
					n = ord + 1;
				if (o + sz > total)
					total = o + sz;
			}
			p += 4 + v;
		} else {
			p += 4;
		}
	}
	for (i = 0; i < n; i++)
		if (!size[i])
			return -1;    /* a hole: do not guess */
	out->off = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
	out->size = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
	if (!out->off || !out->size) {
		free(out->off);
		free(out->size);
		out->off = out->size = NULL;
		return -1;
	}
	memcpy(out->off, off, sizeof(uint32_t) * (size_t)n);
	memcpy(out->size, size, sizeof(uint32_t) * (size_t)n);
	out->total = total;
	out->n = n;
	return 0;
}

/* The kernel a sound section ".nv.info.<kernel>" describes, or NULL. */
static const char *info_kernel(const struct image *im, const Elf64_Shdr *s)
{
	static const char pre[] = ".nv.info.";
	const char *nm;

	if (!s || !sec_ok(im, s) || s->sh_type == SHT_NOBITS)
		return NULL;
	nm = sec_name(im, s);
	if (!nm || strncmp(nm, pre, sizeof(pre) - 1) != 0 || !nm[sizeof(pre) - 1])
		return NULL;
	return nm + sizeof(pre) - 1;
}

/* Symbol `name` of the image and its index (0: none). */
static const Elf64_Sym *find_sym(const struct image *im, const char *name, uint32_t *index)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;
	unsigned k;

	for (k = 1; k < eh->e_shnum; k++) {
		const Elf64_Shdr *s = shdr(im, k), *st;
		uint64_t j, nsym;

		if (!s || s->sh_type != SHT_SYMTAB || !sec_ok(im, s) ||
		    s->sh_entsize < sizeof(Elf64_Sym))
			continue;
		st = shdr(im, s->sh_link);
		nsym = s->sh_size / s->sh_entsize;
		for (j = 1; j < nsym && j < UINT32_MAX; j++) {
			const Elf64_Sym *sym = (const Elf64_Sym *)(im->p + s->sh_offset +
								   j * s->sh_entsize);
			const char *nm = str_at(im, st, sym->st_name);

			if (nm && !strcmp(nm, name)) {
				*index = (uint32_t)j;
				return sym;
			}
		}
	}
	*index = 0;
	return NULL;
}

/* EIATTR_REGCOUNT of symbol `sym` in the image's ".nv.info", or 0. */
static uint32_t regcount(const struct image *im, uint32_t sym)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;
	unsigned k;

	for (k = 1; k < eh->e_shnum; k++) {
		const Elf64_Shdr *s = shdr(im, k);
		const char *nm = s && sec_ok(im, s) && s->sh_type != SHT_NOBITS ? sec_name(im, s) : NULL;
		const uint8_t *p, *end;

		if (!nm || strcmp(nm, ".nv.info") != 0)
			continue;
		p = im->p + s->sh_offset;
		end = p + s->sh_size;
		while (p + 4 <= end) {
			uint16_t v = rd16(p + 2);

			if (p[0] != EIFMT_SVAL) {
				p += 4;
				continue;
			}
			if (v > end - (p + 4))
				break;
			if (p[1] == EIATTR_REGCOUNT && v >= 8 && rd32(p + 4) == sym)
				return rd32(p + 8);
			p += 4 + v;
		}
	}
	return 0;
}

/*
 * What one block of kernel `name` holds on an SM, from the first image that
 * has it: registers per thread (EIATTR_REGCOUNT in ".nv.info", by symbol
 * index) and static shared memory (the size of ".nv.shared.<name>", which
 * on sm_8x/9x starts with the 1 KiB the system reserves per block: that
 * part is the model's block_smem, not counted here).  0 when not known.
 */
int sg_fatbin_resources(struct sg_fatbin *fb, const char *name, double reserved, double *regs,
			double *smem)
{
	static const char shared[] = ".nv.shared.";
	int i;

	*regs = *smem = 0;
	if (!fb || !name)
		return -1;
	ensure_parsed(fb);
	for (i = 0; i < fb->nimg; i++) {
		const struct image *im = &fb->img[i];
		const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;
		uint32_t sym;
		unsigned k;

		if (!find_sym(im, name, &sym))
			continue;
		*regs = (double)regcount(im, sym);
		for (k = 1; k < eh->e_shnum; k++) {
			const Elf64_Shdr *s = shdr(im, k);
			const char *nm = s ? sec_name(im, s) : NULL;

			if (nm && !strncmp(nm, shared, sizeof(shared) - 1) &&
			    !strcmp(nm + sizeof(shared) - 1, name))
				*smem = (double)s->sh_size > reserved ? (double)s->sh_size - reserved : 0;
		}
		return 0;
	}
	return -1;
}

int sg_fatbin_params(struct sg_fatbin *fb, const char *name, struct sg_params *p)
{
	int i;

	p->n = -1;
	if (!fb || !name)
		return -1;
	ensure_parsed(fb);
	for (i = 0; i < fb->nimg; i++) {
		const struct image *im = &fb->img[i];
		const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;
		unsigned k;

		for (k = 1; k < eh->e_shnum; k++) {
			const Elf64_Shdr *s = shdr(im, k);
			const char *nm = info_kernel(im, s);

			if (nm && !strcmp(nm, name) && kparams(im, s, p) == 0)
				return 0;
		}
	}
	return -1;
}

/*
 * Every kernel of every image (a section ".nv.info.<kernel>"; device
 * functions have none) with its layout (n = -1 when unreadable), which fn
 * keeps or frees.  Several images (archs) may name the same kernel: fn
 * sees it once per image.  Returns the number visited, or -1 when fn
 * failed.
 */
int sg_fatbin_each_kernel(struct sg_fatbin *fb, int (*fn)(const char *, struct sg_params *, void *),
			  void *arg)
{
	int i, n = 0;

	if (!fb)
		return 0;
	ensure_parsed(fb);
	for (i = 0; i < fb->nimg; i++) {
		const struct image *im = &fb->img[i];
		const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->p;
		unsigned k;

		for (k = 1; k < eh->e_shnum; k++) {
			const Elf64_Shdr *s = shdr(im, k);
			struct sg_params p = { -1, 0, NULL, NULL };
			const char *nm = info_kernel(im, s);

			if (!nm)
				continue;
			if (kparams(im, s, &p) < 0)
				p.n = -1;
			if (fn(nm, &p, arg) < 0)
				return -1;
			n++;
		}
	}
	return n;
}

int sg_fatbin_var_init(struct sg_fatbin *fb, const char *name, void *dst, size_t n)
{
	int i;

	if (!fb || !name)
		return -1;
	ensure_parsed(fb);
	for (i = 0; i < fb->nimg; i++) {
		const struct image *im = &fb->img[i];
		uint32_t index;
		const Elf64_Sym *sym = find_sym(im, name, &index);
		const Elf64_Shdr *ds;
		size_t len;

		if (!sym)
			continue;
		ds = shdr(im, sym->st_shndx);
		if (!ds || !sec_ok(im, ds))
			return -1;
		if (ds->sh_type == SHT_NOBITS)
			return 0;      /* zero-initialised */
		len = sym->st_size < n ? sym->st_size : n;
		if (sym->st_value > ds->sh_size || len > ds->sh_size - sym->st_value)
			return -1;
		memcpy(dst, im->p + ds->sh_offset + sym->st_value, len);
		return 0;
	}
	return -1;
}

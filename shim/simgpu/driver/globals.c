/*
 * globals.c - cuModuleGetGlobal / cuLibraryGetGlobal: a module's
 * __device__ variables.
 *
 * A variable lives in device memory from its first lookup until its
 * module is unloaded: allocated from simgpu's arena at the symbol's size
 * and initialised from the cubin (its bytes in .nv.global.init, or zeros
 * for .nv.global).  Its size and initial value come from the module's
 * own copy of its fat binary: the ELF symbol table of the first image
 * that defines it.  Compressed images are not read here (nvcc leaves
 * small ones uncompressed; a compressed-only module's variables are
 * CUDA_ERROR_NOT_FOUND).  Kernels run as host twins, which do not see
 * module variables: the memory is the program's to copy in and out.
 */
#include <elf.h>
#include <stdlib.h>
#include <string.h>

#include "drv.h"

#define FLAG_COMPRESSED (0x2000 | 0x8000)
#define ENTRY_ELF       2

struct drv_global {
	char              *name;
	void              *dev;
	size_t             size;
	struct drv_global *next;
};

static uint64_t rd(const uint8_t *p, size_t n)
{
	uint64_t v = 0;

	memcpy(&v, p, n);
	return v;
}

/* The symbol `name` in the ELF image [p, p+n): its size and its initial
 * bytes (*init NULL: zeros).  0 found, -1 not there or damaged. */
static int elf_var(const uint8_t *p, size_t n, const char *name, size_t *size,
		   const uint8_t **init)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)p;
	unsigned i;

	if (n < sizeof(*eh) || memcmp(p, ELFMAG, SELFMAG) || p[EI_CLASS] != ELFCLASS64 ||
	    eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > n ||
	    (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > n - eh->e_shoff)
		return -1;
	for (i = 1; i < eh->e_shnum; i++) {
		const Elf64_Shdr *sh = (const Elf64_Shdr *)(p + eh->e_shoff) + i, *st;
		uint64_t j, nsym;

		if (sh->sh_type != SHT_SYMTAB || sh->sh_entsize < sizeof(Elf64_Sym) ||
		    sh->sh_offset > n || sh->sh_size > n - sh->sh_offset ||
		    sh->sh_link >= eh->e_shnum)
			continue;
		st = (const Elf64_Shdr *)(p + eh->e_shoff) + sh->sh_link;
		if (st->sh_offset > n || st->sh_size > n - st->sh_offset)
			continue;
		nsym = sh->sh_size / sh->sh_entsize;
		for (j = 1; j < nsym; j++) {
			const Elf64_Sym *sym = (const Elf64_Sym *)(p + sh->sh_offset +
								   j * sh->sh_entsize);
			const Elf64_Shdr *ds;
			const char *nm;

			if (sym->st_name >= st->sh_size ||
			    ELF64_ST_TYPE(sym->st_info) != STT_OBJECT)
				continue;
			nm = (const char *)p + st->sh_offset + sym->st_name;
			if (strnlen(nm, st->sh_size - sym->st_name) == st->sh_size - sym->st_name ||
			    strcmp(nm, name) != 0)
				continue;
			if (sym->st_shndx == SHN_UNDEF || sym->st_shndx >= eh->e_shnum)
				continue;              /* a declaration, not the variable */
			ds = (const Elf64_Shdr *)(p + eh->e_shoff) + sym->st_shndx;
			*size = sym->st_size;
			if (ds->sh_type == SHT_NOBITS) {
				*init = NULL;
				return 0;
			}
			if (ds->sh_offset > n || ds->sh_size > n - ds->sh_offset ||
			    sym->st_value > ds->sh_size || sym->st_size > ds->sh_size - sym->st_value)
				return -1;
			*init = p + ds->sh_offset + sym->st_value;
			return 0;
		}
	}
	return -1;
}

/* The variable in any uncompressed ELF image of the fat binary. */
static int fatbin_var(const uint8_t *fb, size_t len, const char *name, size_t *size,
		      const uint8_t **init)
{
	const uint8_t *p, *end;
	uint64_t hdr, fat;

	if (len < 16)
		return -1;
	hdr = rd(fb + 6, 2);
	fat = rd(fb + 8, 8);
	if (hdr < 16 || hdr > len || fat > len - hdr)
		return -1;
	p = fb + hdr;
	end = p + fat;
	while (end - p >= 64) {
		uint64_t eh = rd(p + 4, 4), n = rd(p + 8, 8), flags = rd(p + 40, 8);

		if (eh < 64 || eh > (uint64_t)(end - p) || n > (uint64_t)(end - p) - eh)
			return -1;
		if (rd(p, 2) == ENTRY_ELF && !(flags & FLAG_COMPRESSED) &&
		    elf_var(p + eh, n, name, size, init) == 0)
			return 0;
		p += eh + n;
	}
	return -1;
}

CUresult drv_global_get(struct drv_mod *m, const char *name, CUdeviceptr *dptr, size_t *bytes)
{
	struct drv_global *g;
	const uint8_t *init = NULL;
	size_t size = 0;
	CUresult r = CUDA_SUCCESS;
	int e;

	pthread_mutex_lock(&m->mu);
	for (g = m->globals; g; g = g->next)
		if (!strcmp(g->name, name))
			goto found;
	if (!m->fatbin || fatbin_var(m->fatbin, m->fatbin_len, name, &size, &init) < 0) {
		r = CUDA_ERROR_NOT_FOUND;
		goto out;
	}
	g = calloc(1, sizeof(*g));
	if (!g || !(g->name = strdup(name))) {
		free(g);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	g->size = size;
	/* a zero-sized variable still gets an address of its own */
	e = simgpu_drv_mem_alloc(&g->dev, size ? size : 1);
	if (e == 0)
		e = init ? simgpu_drv_copy(g->dev, init, size, SG_DRV_H2D, NULL, 0, 0)
			 : simgpu_drv_memset(g->dev, 0, 1, size ? size : 1, NULL, 0, 0);
	if (e != 0) {
		if (g->dev)
			(void)simgpu_drv_mem_free(g->dev);
		free(g->name);
		free(g);
		r = drv_err(e);
		goto out;
	}
	g->next = m->globals;
	m->globals = g;
found:
	if (dptr)
		*dptr = (CUdeviceptr)(uintptr_t)g->dev;
	if (bytes)
		*bytes = g->size;
out:
	pthread_mutex_unlock(&m->mu);
	return r;
}

void drv_globals_free(struct drv_mod *m)
{
	struct drv_global *g, *next;

	pthread_mutex_lock(&m->mu);
	g = m->globals;
	m->globals = NULL;
	pthread_mutex_unlock(&m->mu);
	for (; g; g = next) {
		next = g->next;
		(void)simgpu_drv_mem_free(g->dev);
		free(g->name);
		free(g);
	}
}

/*
 * shim_fwd_twins.c - which simgpu twin libraries a worker must load to run
 * this app's kernels, said in its HELLO: the executable's own
 * "<exe>.twins.so", loaded libraries that carry twins (simgpu's CPU
 * cuDNN/cuBLAS mark themselves with simgpu_twin_library), and
 * $SIMGPU_TWINS.  Only on simgpu: a GPU process may have hundreds of
 * libraries, and a GPU worker needs no twins.
 *
 * Locking: none of its own; called once per connection, under fwd.mu.
 */
#define _GNU_SOURCE
#include "shim_fwd.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct twin_objs {
	char *out;
	size_t outlen, o;
	char **paths;           /* every loaded object with a path          */
	int n, cap;
};

/* Only collect here: dlopen under dl_iterate_phdr's lock is not allowed. */
static int collect_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct twin_objs *t = arg;
	char **grown;

	(void)size;
	if (!info->dlpi_name || info->dlpi_name[0] != '/')
		return 0;
	if (t->n == t->cap) {
		grown = realloc(t->paths, (size_t)(t->cap ? 2 * t->cap : 64) * sizeof(*grown));
		if (!grown)
			return 1;
		t->paths = grown;
		t->cap = t->cap ? 2 * t->cap : 64;
	}
	t->paths[t->n] = strdup(info->dlpi_name);
	if (t->paths[t->n])
		t->n++;
	return 0;
}

static void add_path(struct twin_objs *t, const char *path)
{
	if (t->o + strlen(path) + 2 < t->outlen)
		t->o += (size_t)snprintf(t->out + t->o, t->outlen - t->o, "%s%s", t->o ? ":" : "",
					 path);
}

/* "<exe>.twins.so" (if it exists), loaded twin libraries, and $SIMGPU_TWINS,
 * absolute, ':'-joined. */
void fconn_twins(char *out, size_t outlen)
{
	struct twin_objs t;
	char exe[PATH_MAX], path[PATH_MAX + 16];
	const char *env = getenv("SIMGPU_TWINS");
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int i;

	memset(&t, 0, sizeof(t));
	t.out = out;
	t.outlen = outlen;
	out[0] = 0;
	if (n > 0) {
		exe[n] = 0;
		snprintf(path, sizeof(path), "%s.twins.so", exe);
		if (access(path, R_OK) == 0)
			add_path(&t, path);
	}
	/* loaded libraries that carry twins (simgpu's CPU cuDNN/cuBLAS) say so
	 * with the marker simgpu_twin_library; once per connection, and only
	 * on simgpu (a GPU process may have hundreds of libraries, and this
	 * runs under the forwarding lock) */
	if (shim_dlsym(RTLD_DEFAULT, "simgpu_kernel_has_twin"))
		dl_iterate_phdr(collect_object, &t);
	for (i = 0; i < t.n; i++) {
		void *h = dlopen(t.paths[i], RTLD_NOLOAD | RTLD_LAZY);

		if (h) {
			/* dlsym(h) also searches h's dependencies: ask for the
			 * object that really defines the marker */
			void *m = shim_dlsym(h, "simgpu_twin_library");
			Dl_info di;

			if (m && dladdr(m, &di) && di.dli_fname && !strcmp(di.dli_fname, t.paths[i]))
				add_path(&t, t.paths[i]);
			dlclose(h);
		}
		free(t.paths[i]);
	}
	free(t.paths);
	if (env && *env) {
		char *copy = strdup(env), *save = NULL, *p;

		for (p = copy ? strtok_r(copy, ":", &save) : NULL; p; p = strtok_r(NULL, ":", &save)) {
			char *r = realpath(p, NULL);

			if (r)
				add_path(&t, r);
			free(r);
		}
		free(copy);
	}
}

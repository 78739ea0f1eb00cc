/*
 * handoff_util.c - errors, the handle's checks and the private runtime
 * directory of exporter sockets.
 */
#define _GNU_SOURCE
#include "handoff_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(struct colocate_handoff_handle) == COLOCATE_HANDOFF_HANDLE_BYTES,
	       "the handle is a fixed wire format");
_Static_assert(sizeof(((struct colocate_handoff_handle *)0)->ipc) == sizeof(cudaIpcMemHandle_t),
	       "room for a cudaIpcMemHandle_t");

/* per thread: a message belongs to the call that failed in this thread */
static __thread char errbuf[256];

int hf_err(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	return code;
}

HF_API const char *colocate_handoff_last_error(void)
{
	return errbuf[0] ? errbuf : "no error";
}

HF_API int colocate_handoff_abi(void)
{
	return COLOCATE_HANDOFF_ABI;
}

/* FNV-1a 64 over the handle less its checksum field (the last 8 bytes). */
uint64_t hf_checksum(const struct colocate_handoff_handle *h)
{
	const unsigned char *p = (const unsigned char *)h;
	uint64_t x = 0xcbf29ce484222325ull;
	size_t i;

	for (i = 0; i < offsetof(struct colocate_handoff_handle, checksum); i++) {
		x ^= p[i];
		x *= 0x100000001b3ull;
	}
	return x;
}

HF_API int colocate_handoff_parse(const void *bytes, size_t len,
				  struct colocate_handoff_handle *out)
{
	struct colocate_handoff_handle h;

	if (!bytes || !out)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "handle: NULL argument");
	if (len != sizeof(h))
		return hf_err(COLOCATE_HANDOFF_E_TRUNCATED,
			      "handle: %zu bytes, a hand-off handle has %zu (truncated or not a handle)",
			      len, sizeof(h));
	memcpy(&h, bytes, sizeof(h));
	if (h.magic != COLOCATE_HANDOFF_MAGIC)
		return hf_err(COLOCATE_HANDOFF_E_FORGED, "handle: bad magic 0x%08x (not a hand-off handle)",
			      h.magic);
	if (h.version != COLOCATE_HANDOFF_VERSION)
		return hf_err(COLOCATE_HANDOFF_E_FORGED, "handle: version %u, this library reads %u",
			      h.version, COLOCATE_HANDOFF_VERSION);
	if (h.checksum != hf_checksum(&h))
		return hf_err(COLOCATE_HANDOFF_E_FORGED, "handle: checksum mismatch (corrupted or forged)");
	/* the rest is checked by the exporter; these would misroute us first */
	if ((h.kind != COLOCATE_HANDOFF_KIND_IPC && h.kind != COLOCATE_HANDOFF_KIND_FD) ||
	    !h.size || !h.pid || h.path[0] != '/' ||
	    !memchr(h.path, 0, sizeof(h.path)))
		return hf_err(COLOCATE_HANDOFF_E_FORGED, "handle: malformed fields (kind %u, size %llu, "
			      "pid %u)", h.kind, (unsigned long long)h.size, h.pid);
	if (h.uid != (uint32_t)geteuid())
		return hf_err(COLOCATE_HANDOFF_E_PERM, "handle: exported by uid %u, this process is uid %u "
			      "(hand-offs are between processes of one user)", h.uid, (unsigned)geteuid());
	*out = h;
	return COLOCATE_HANDOFF_OK;
}

/* mkdir one level, 0700; an existing directory is fine (checked later). */
static int mkdir_one(const char *p)
{
	if (mkdir(p, 0700) == 0 || errno == EEXIST)
		return 0;
	return -1;
}

int hf_runtime_dir(const char *want, char *out, size_t outlen)
{
	const char *env = getenv("COLOCATE_RUNTIME_DIR"), *xdg = getenv("XDG_RUNTIME_DIR");
	char parent[256];
	struct stat st;
	int n;

	/* the same rule as shim/rundir.py, plus a handoff/ folder of our own */
	if (want && *want)
		n = snprintf(out, outlen, "%s", want);
	else {
		if (env && *env)
			n = snprintf(parent, sizeof(parent), "%s", env);
		else if (xdg && *xdg)
			n = snprintf(parent, sizeof(parent), "%s/colocate", xdg);
		else
			n = snprintf(parent, sizeof(parent), "/tmp/colocate-%u", (unsigned)geteuid());
		if (n < 0 || (size_t)n >= sizeof(parent))
			return hf_err(COLOCATE_HANDOFF_E_INVAL, "runtime dir: path too long");
		if (mkdir_one(parent) < 0)
			return hf_err(COLOCATE_HANDOFF_E_SYS, "runtime dir %s: %s", parent, strerror(errno));
		n = snprintf(out, outlen, "%s/handoff", parent);
	}
	if (n < 0 || (size_t)n >= outlen)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "runtime dir: path too long");
	if (mkdir_one(out) < 0)
		return hf_err(COLOCATE_HANDOFF_E_SYS, "runtime dir %s: %s", out, strerror(errno));
	/* another user must not be able to put a socket of theirs in our place */
	if (lstat(out, &st) < 0)
		return hf_err(COLOCATE_HANDOFF_E_SYS, "runtime dir %s: %s", out, strerror(errno));
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
		return hf_err(COLOCATE_HANDOFF_E_PERM, "runtime dir %s must be a directory of uid %u with "
			      "mode 0700 (is uid %u, mode %03o)", out, (unsigned)geteuid(),
			      (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
	return COLOCATE_HANDOFF_OK;
}

/*
 * readfile.h - the test programs' one file reader (fat binaries, mostly).
 *
 * test_read_file() returns the whole of path in a malloc'd buffer, its size
 * in *len when len is not NULL; NULL when the file cannot be opened, is
 * empty or cannot be read whole.
 */
#ifndef TESTS_READFILE_H
#define TESTS_READFILE_H

#include <stdio.h>
#include <stdlib.h>

static inline void *test_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf && len)
		*len = (size_t)n;
	return buf;
}

#endif

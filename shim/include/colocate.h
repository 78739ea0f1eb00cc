/*
 * colocate.h - the public API an application may call to tell colocate
 * where its queries begin and end.  Header only; no link dependency.
 *
 *   colocate_query_begin(id, input_size);   // a query arrived
 *   ... GPU work of the query ...
 *   colocate_query_end(id);                 // its result is back on the host
 *
 * id is any number unique among the process's queries in flight;
 * input_size is what the predictors key on (images in a batch, words in a
 * sentence, bytes: whatever the service's natural size is).
 *
 * Under `colocate run` the preloaded libcolocate.so exports
 * colocate_query_begin_v1/colocate_query_end_v1, found here with
 * dlsym(RTLD_DEFAULT) once.  Without colocate both calls do nothing, so a
 * program built with this header runs unchanged anywhere.  Link with -ldl
 * on glibc older than 2.34.
 */
#ifndef COLOCATE_H
#define COLOCATE_H

#include <dlfcn.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libcolocate.so exports; 0 on success, -1 when the shim is inactive. */
typedef int (*colocate_query_begin_fn)(uint64_t id, uint64_t input_size);
typedef int (*colocate_query_end_fn)(uint64_t id);

struct colocate_api_ {
	int                     looked_up;
	colocate_query_begin_fn begin;
	colocate_query_end_fn   end;
};

static inline struct colocate_api_ *colocate_api_(void)
{
	static struct colocate_api_ api;

	/* A benign race: two threads may both look up; both store the same. */
	if (!__atomic_load_n(&api.looked_up, __ATOMIC_ACQUIRE)) {
		void *b = dlsym(RTLD_DEFAULT, "colocate_query_begin_v1");
		void *e = dlsym(RTLD_DEFAULT, "colocate_query_end_v1");

		api.begin = (colocate_query_begin_fn)(uintptr_t)b;
		api.end = (colocate_query_end_fn)(uintptr_t)e;
		__atomic_store_n(&api.looked_up, 1, __ATOMIC_RELEASE);
	}
	return &api;
}

/* A query with this id and input size starts now. */
static inline int colocate_query_begin(uint64_t id, uint64_t input_size)
{
	struct colocate_api_ *a = colocate_api_();

	return a->begin ? a->begin(id, input_size) : -1;
}

/* The query with this id is complete (its result is on the host). */
static inline int colocate_query_end(uint64_t id)
{
	struct colocate_api_ *a = colocate_api_();

	return a->end ? a->end(id) : -1;
}

#ifdef __cplusplus
}
#endif

#endif

/*
 * shim_graph.h - CUDA graphs seen by libcolocate.so (shim_graph.c).
 *
 * A graph launch runs many kernels with one call.  After an instantiation
 * succeeds the shim walks the graph (the runtime's own cudaGraphGetNodes,
 * cudaGraphNodeGetType, cudaGraphKernelNodeGetParams, child graphs
 * recursively) and remembers, for the executable graph, each kernel and how
 * many of its nodes there are, and the bytes its copy nodes move; each
 * launch of it then counts them.  When
 * the walk fails, a launch counts as one launch of an unnamed kernel, as
 * before (and the shim says so once).
 *
 * Stream capture records work into a graph instead of running it: the
 * hooks then neither count nor fence it (a fence's synchronisation would
 * invalidate the capture), and the graph's launches count it instead.
 */
#ifndef COLOCATE_SHIM_GRAPH_H
#define COLOCATE_SHIM_GRAPH_H

/* Captures begun through the hooks and not yet ended. */
extern int shim_graph_captures;

int shim_graph_capturing_slow(void *stream, int ptsz);

/* Whether stream (the _ptsz meaning of NULL when ptsz) is capturing, or
 * cannot be asked (the legacy stream while a blocking stream captures:
 * the work will fail there).  One relaxed load when nothing captures. */
static inline int shim_graph_capturing(void *stream, int ptsz)
{
	if (__builtin_expect(!__atomic_load_n(&shim_graph_captures, __ATOMIC_RELAXED), 1))
		return 0;
	return shim_graph_capturing_slow(stream, ptsz);
}

/* cudaStreamBeginCapture* succeeded on a stream. */
void shim_graph_capture_begun(void);
/* cudaStreamEndCapture* on stream: was_capturing from before the call; the
 * capture is over when the stream no longer captures. */
void shim_graph_capture_end(void *stream, int ptsz, int was_capturing);

/* An instantiation (or update) of exec from graph succeeded: learn its
 * kernels.  Costs a walk of the graph; never fails the application. */
void shim_graph_note(void *exec, void *graph);
/* Before cudaGraphExecDestroy: its address may be reused. */
void shim_graph_forget(void *exec);
/* A successful launch of exec: count its kernels (outermost hook only). */
void shim_graph_count(const void *exec);

#endif

/*
 * unixutil.h - two process/socket probes shared by libcolocate.so and the
 * process-pool worker (both link unixutil.c).
 */
#ifndef COLOCATE_UNIXUTIL_H
#define COLOCATE_UNIXUTIL_H

#include <stdarg.h>
#include <stdint.h>

/* Alive and not a zombie: a killed child its parent has not reaped yet
 * still answers kill(pid, 0). */
int colocate_pid_alive(uint32_t pid);

/* Is anyone accepting on the unix socket at path?  One connect(2), so a
 * socket file left by a crashed process is told apart without waiting. */
int colocate_socket_listens(const char *path);

/* "who[id]: message\n" to stderr in one write(2), so that lines of
 * concurrent processes do not interleave. */
void colocate_vlog(const char *who, unsigned id, const char *fmt, va_list ap);

#endif

/* common.h — shared basics of the C core: error reporting and small helpers.
 * Core functions return 0 or a negative errno; a short message describing the
 * failure is left in a thread-local buffer for the binding to raise. */
#ifndef KD_COMMON_H
#define KD_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#define KD_ERRMSG_LEN 256

/* Record a message for the most recent failure on this thread; returns err so
 * callers can write `return kd_fail(-EINVAL, "...")`. */
int kd_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *kd_last_error(void);
void kd_clear_error(void);
/* Copy another thread's message into this thread (worker -> caller). */
void kd_set_error_text(const char *msg);

static inline uint64_t kd_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t kd_now_ns(void);
unsigned kd_cpu_count(void);

/* Run fn(arg) on `threads` threads, the caller being one of them, and wait
 * for all. The extra threads block signals so Python's main thread gets them. */
void kd_run_workers(void *(*fn)(void *), void *arg, unsigned threads);

/* Aligned allocation; returns NULL on failure. Free with kd_free_aligned. */
void *kd_alloc_aligned(size_t alignment, size_t size);
void kd_free_aligned(void *p);

#endif

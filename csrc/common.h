/* common.h — shared basics of the C core: error reporting and small helpers.
 * Core functions return 0 or a negative errno; a short message describing the
 * failure is left in a thread-local buffer for the binding to raise. */
#ifndef KD_COMMON_H
#define KD_COMMON_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define KD_ERRMSG_LEN 256

/* A truncated, damaged or foreign file. Kept apart from EINVAL (a bad
 * argument) so the binding can raise CorruptIndexError for it. */
#define KD_ECORRUPT EBADMSG

/* Record a message for the most recent failure on this thread; returns err so
 * callers can write `return kd_fail(-EINVAL, "...")`. */
int kd_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *kd_last_error(void);
void kd_clear_error(void);
/* Copy another thread's message into this thread (worker -> caller). */
void kd_set_error_text(const char *msg);

/* The first error of a pool of workers, with its message (messages are per
 * thread): workers record theirs and stop once one is set; the caller takes
 * it back onto its own thread. */
struct kd_first_error {
    pthread_mutex_t lock;
    int err;
    char msg[KD_ERRMSG_LEN];
};
#define KD_FIRST_ERROR_INIT                                                                        \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, 0, ""                                                           \
    }
/* Keep err (nonzero) and this thread's message unless one is kept already. */
void kd_first_error_record(struct kd_first_error *e, int err);
/* Whether a worker has recorded one (read without the lock, to stop early). */
static inline int kd_first_error_set(struct kd_first_error *e)
{
    return __atomic_load_n(&e->err, __ATOMIC_RELAXED) != 0;
}
/* The kept error, its message now this thread's; 0 when there is none. */
int kd_first_error_take(struct kd_first_error *e);

static inline uint64_t kd_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t kd_now_ns(void);
unsigned kd_cpu_count(void);
/* Bytes of the last-level data cache: sysfs, else sysconf, else 32 MiB. */
uint64_t kd_llc_bytes(void);
/* Tests: have kd_llc_bytes answer `bytes` (0: ask the system again). */
void kd_set_llc_bytes(uint64_t bytes);
/* Tests and benchmarks: which codes insertion's beam reads. 0: the core's
 * rules decide; 1: the 1-bit search codes; -1: the build codes. */
int kd_beam_rule(void);
void kd_set_beam_rule(int rule);

/* Run fn(arg) on `threads` threads, the caller being one of them, and wait
 * for all. The extra threads block signals so Python's main thread gets them. */
void kd_run_workers(void *(*fn)(void *), void *arg, unsigned threads);

/* Ask for transparent huge pages over the whole pages of [p, p + len):
 * arrays read at random (build codes, graph lists) then miss the TLB far
 * less. Advice only: ignored where the kernel lacks or refuses it. */
void kd_advise_huge(void *p, size_t len);

/* Aligned allocation; returns NULL on failure. Free with kd_free_aligned. */
void *kd_alloc_aligned(size_t alignment, size_t size);
void kd_free_aligned(void *p);

/* Test-only fault injection (knndirect._core._inject_fault). kd_fault_kind
 * stays 0 unless a test arms it, so an I/O path pays one relaxed load and a
 * branch. Armed, the `after` matching operations pass, then `count` of them
 * (all when count < 0) fail: reads of vector records (every backend but mmap)
 * or writes of a save. */
enum kd_fault_kind {
    KD_FAULT_NONE = 0,
    KD_FAULT_READ_EIO = 1,     /* the read fails with EIO */
    KD_FAULT_READ_SHORT = 2,   /* the read returns half of what it got */
    KD_FAULT_READ_EOF = 3,     /* the read returns 0 bytes: the file looks truncated */
    KD_FAULT_WRITE_ENOSPC = 4, /* the write fails with ENOSPC */
    KD_FAULT_WRITE_EIO = 5,    /* the write fails with EIO */
    KD_FAULT_WRITE_SLOW = 6,   /* the write takes 100 ms longer: a slow disk */
};
extern int kd_fault_kind;
void kd_fault_arm(int kind, uint64_t after, int64_t count);
/* Faults injected, and matching operations seen, since the last arm. */
uint64_t kd_fault_fired(void);
uint64_t kd_fault_seen(void);
/* The slow path: res is a byte count or a negative errno. */
int64_t kd_fault_apply(int write, int64_t res);

/* What a read (write = 0) or write (write = 1) that returned res becomes. */
static inline int64_t kd_fault(int write, int64_t res)
{
    if (__builtin_expect(__atomic_load_n(&kd_fault_kind, __ATOMIC_RELAXED) != 0, 0))
        return kd_fault_apply(write, res);
    return res;
}

#endif

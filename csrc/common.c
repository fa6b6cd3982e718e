#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <sys/mman.h>

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char errmsg[KD_ERRMSG_LEN];

int kd_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return err;
}

const char *kd_last_error(void) { return errmsg; }
void kd_clear_error(void) { errmsg[0] = 0; }

void kd_set_error_text(const char *msg) { snprintf(errmsg, sizeof errmsg, "%s", msg); }

void kd_first_error_record(struct kd_first_error *e, int err)
{
    if (!err)
        return;
    pthread_mutex_lock(&e->lock);
    if (!e->err) {
        snprintf(e->msg, sizeof e->msg, "%s", errmsg);
        __atomic_store_n(&e->err, err, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&e->lock);
}

int kd_first_error_take(struct kd_first_error *e)
{
    if (e->err)
        kd_set_error_text(e->msg);
    return e->err;
}

uint64_t kd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

unsigned kd_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

static uint64_t llc_bytes; /* 0: not yet asked */

/* A number from cpu0's cache `index` in sysfs (size in KiB, level); 0 when
 * unreadable. */
static unsigned long cache_attr(int index, const char *name)
{
    char path[80];
    unsigned long v = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", index, name);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%lu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

/* sysfs first, the highest level of cpu0's caches: it gives the cache that
 * cpu0 shares, where glibc's sysconf may give the whole package's (384 MiB
 * on an EPYC whose complexes have 32 MiB each). */
static uint64_t llc_from_system(void)
{
    unsigned long kib = 0, top = 0;
    for (int i = 0; i < 8; i++) {
        unsigned long level = cache_attr(i, "level"), size = cache_attr(i, "size");
        if (level > top && size) { /* L1i shares level 1 with L1d: never the top */
            top = level;
            kib = size;
        }
    }
    if (kib)
        return (uint64_t)kib << 10;
    long n = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    n = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return n > 0 ? (uint64_t)n : (uint64_t)32 << 20;
}

uint64_t kd_llc_bytes(void)
{
    uint64_t n = __atomic_load_n(&llc_bytes, __ATOMIC_RELAXED);
    if (!n) {
        n = llc_from_system();
        __atomic_store_n(&llc_bytes, n, __ATOMIC_RELAXED);
    }
    return n;
}

void kd_set_llc_bytes(uint64_t bytes) { __atomic_store_n(&llc_bytes, bytes, __ATOMIC_RELAXED); }

static int beam_rule;

int kd_beam_rule(void) { return __atomic_load_n(&beam_rule, __ATOMIC_RELAXED); }

void kd_set_beam_rule(int rule) { __atomic_store_n(&beam_rule, rule, __ATOMIC_RELAXED); }

void kd_advise_huge(void *p, size_t len)
{
#ifdef MADV_HUGEPAGE
    uintptr_t lo = kd_round_up((uintptr_t)p, 4096), hi = ((uintptr_t)p + len) & ~(uintptr_t)4095;
    if (hi > lo + (2u << 20)) /* a huge page could fit */
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
}

void *kd_alloc_aligned(size_t alignment, size_t size)
{
    void *p = NULL;
    if (size == 0)
        size = alignment;
    if (posix_memalign(&p, alignment, size) != 0)
        return NULL;
    return p;
}

void kd_free_aligned(void *p) { free(p); }

void kd_run_workers(void *(*fn)(void *), void *arg, unsigned threads)
{
    pthread_t t[256];
    unsigned started = 0;
    if (threads > 256)
        threads = 256;
    if (threads > 1) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (; started + 1 < threads; started++)
            if (pthread_create(&t[started], NULL, fn, arg) != 0)
                break;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    fn(arg);
    for (unsigned i = 0; i < started; i++)
        pthread_join(t[i], NULL);
}

/* ---- test-only fault injection */

int kd_fault_kind;
static uint64_t fault_after, fault_seen, fault_fired;
static int64_t fault_count;

void kd_fault_arm(int kind, uint64_t after, int64_t count)
{
    __atomic_store_n(&kd_fault_kind, KD_FAULT_NONE, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fault_after, after, __ATOMIC_RELAXED);
    __atomic_store_n(&fault_count, count, __ATOMIC_RELAXED);
    __atomic_store_n(&fault_seen, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fault_fired, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&kd_fault_kind, kind, __ATOMIC_SEQ_CST);
}

uint64_t kd_fault_fired(void) { return __atomic_load_n(&fault_fired, __ATOMIC_SEQ_CST); }
uint64_t kd_fault_seen(void) { return __atomic_load_n(&fault_seen, __ATOMIC_SEQ_CST); }

int64_t kd_fault_apply(int write, int64_t res)
{
    int kind = __atomic_load_n(&kd_fault_kind, __ATOMIC_ACQUIRE);
    if (kind == KD_FAULT_NONE || (kind >= KD_FAULT_WRITE_ENOSPC) != (write != 0))
        return res;
    uint64_t n = __atomic_fetch_add(&fault_seen, 1, __ATOMIC_RELAXED);
    uint64_t after = __atomic_load_n(&fault_after, __ATOMIC_RELAXED);
    int64_t count = __atomic_load_n(&fault_count, __ATOMIC_RELAXED);
    if (n < after || (count >= 0 && n - after >= (uint64_t)count))
        return res;
    __atomic_fetch_add(&fault_fired, 1, __ATOMIC_RELAXED);
    switch (kind) {
    case KD_FAULT_READ_EIO:
    case KD_FAULT_WRITE_EIO:
        return -EIO;
    case KD_FAULT_WRITE_ENOSPC:
        return -ENOSPC;
    case KD_FAULT_READ_SHORT:
        return res > 1 ? res / 2 : res;
    case KD_FAULT_READ_EOF:
        return res >= 0 ? 0 : res;
    case KD_FAULT_WRITE_SLOW: {
        struct timespec ts = {0, 100000000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        return res;
    }
    }
    return res;
}

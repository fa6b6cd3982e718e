#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

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

void kd_set_error_text(const char *msg)
{
    snprintf(errmsg, sizeof errmsg, "%s", msg);
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

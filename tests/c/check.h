/* check.h — the pass/fail count of the C tests.
 * CHECK(cond, fmt, ...) counts a pass, or prints where it failed, the
 * condition, the message and the core's last error message. A test whose
 * threads check defines CHECK_LOCK() and CHECK_UNLOCK() before including. */
#ifndef KD_TEST_CHECK_H
#define KD_TEST_CHECK_H

#include "common.h"

#include <stdio.h>

static int n_pass, n_fail;

#ifndef CHECK_LOCK
#define CHECK_LOCK() ((void)0)
#define CHECK_UNLOCK() ((void)0)
#endif

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        CHECK_LOCK();                                                                              \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            printf("FAIL %s:%d: %s -- ", __FILE__, __LINE__, #cond);                               \
            printf(__VA_ARGS__);                                                                   \
            printf(" [last error: %s]\n", kd_last_error());                                        \
            fflush(stdout);                                                                        \
        }                                                                                          \
        CHECK_UNLOCK();                                                                            \
    } while (0)

#endif

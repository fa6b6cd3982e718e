/* check.h — the pass/fail count of the single-threaded C tests.
 * CHECK(cond, fmt, ...) counts a pass, or prints where it failed, the
 * condition, the message and the core's last error message. */
#ifndef KD_TEST_CHECK_H
#define KD_TEST_CHECK_H

#include "common.h"

#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            n_pass++;                                                      \
        } else {                                                           \
            n_fail++;                                                      \
            printf("FAIL %s:%d: %s -- ", __FILE__, __LINE__, #cond);       \
            printf(__VA_ARGS__);                                           \
            printf(" [last error: %s]\n", kd_last_error());               \
        }                                                                  \
    } while (0)

#endif

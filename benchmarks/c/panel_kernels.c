/* panel_kernels.c — exact search's panel kernel against the core's FMA
 * peak, on one thread: each variant of kd_kernels_named's panel_dot scores
 * twelve queries against one cached panel of 32 rows, over and over (the
 * kernel's own cost; -O3, as setup.py builds it), and twelve independent
 * chains of 512-bit FMAs give the bound (AVX-512 CPUs only). Best of 5
 * runs, in GFLOP/s (2 a term).
 *
 *   gcc -O3 -std=c11 -Icsrc csrc/common.c csrc/distance.c \
 *       benchmarks/c/panel_kernels.c -lpthread -lm -o /tmp/panel_kernels
 *   /tmp/panel_kernels 768 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "distance.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float fma_chains(long steps)
{
    __m512 a[12], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long s = 0; s < steps; s++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], b, c);
    __m512 t = a[0];
    for (int i = 1; i < 12; i++)
        t = _mm512_add_ps(t, a[i]);
    return _mm512_reduce_add_ps(t);
}
#endif

int main(int argc, char **argv)
{
    size_t d = argc > 1 ? (size_t)atol(argv[1]) : 768;
    float *q = malloc(KD_PANEL_QUERIES * d * sizeof *q);
    float *panel = malloc(KD_PANEL_ROWS * d * sizeof *panel);
    float out[KD_PANEL_QUERIES * KD_PANEL_ROWS], sink = 0;
    if (!q || !panel || !d)
        return 1;
    srand(1);
    for (size_t i = 0; i < KD_PANEL_QUERIES * d; i++)
        q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < KD_PANEL_ROWS * d; i++)
        panel[i] = (float)rand() / RAND_MAX - 0.5f;
    long calls = (long)(4e9 / (2.0 * KD_PANEL_QUERIES * KD_PANEL_ROWS * d)) + 1;
    const char *names[] = {"scalar", "avx2", "avx512"};
    for (int v = 0; v < 3; v++) {
        const struct kd_kernels *k = kd_kernels_named(names[v]);
        if (!k) {
            printf("%-8s unavailable on this CPU\n", names[v]);
            continue;
        }
        long n = v == 0 ? calls / 20 + 1 : calls;
        double best = 1e30;
        for (int run = 0; run < 5; run++) {
            double t = seconds();
            for (long c = 0; c < n; c++) {
                k->panel_dot(q, d, KD_PANEL_QUERIES, panel, d, out);
                sink += out[c % (KD_PANEL_QUERIES * KD_PANEL_ROWS)];
            }
            t = seconds() - t;
            best = t < best ? t : best;
        }
        printf("%-8s panel_dot, %zu dims: %6.1f GFLOP/s\n", names[v], d,
               2.0 * KD_PANEL_QUERIES * KD_PANEL_ROWS * d * n / best * 1e-9);
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) {
        long steps = 100000000;
        double best = 1e30;
        for (int run = 0; run < 5; run++) {
            double t = seconds();
            sink += fma_chains(steps);
            t = seconds() - t;
            best = t < best ? t : best;
        }
        printf("bound    12 chains of 512-bit FMAs: %6.1f GFLOP/s\n",
               2.0 * 16 * 12 * steps / best * 1e-9);
    }
#endif
    return sink == 12345.0f;
}

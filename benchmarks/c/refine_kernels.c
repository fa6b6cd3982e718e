/* refine_kernels.c — time each variant of the refined codes' estimator
 * (quant.c's kd_refiner_named) on n rows of random refined codes, 64 rows a
 * call as a search's refine step passes them: "cached" re-estimates rows
 * 0-63 over and over (the kernel's own cost), "scattered" draws the 64 rows
 * at random from all n (each row's levels missed in cache, no prefetch).
 * Best of 5 passes of 20,000 calls, in ns a row.
 *
 *   gcc -O2 -std=c11 -Icsrc csrc/common.c csrc/distance.c csrc/quant.c \
 *       benchmarks/c/refine_kernels.c -lpthread -lm -o /tmp/refine_kernels
 *   /tmp/refine_kernels 384 100000 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant.h"

#define BATCH 64

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double ns_a_row(kd_refine_fn f, const struct kd_quant *q, const struct kd_qcode *qc,
                       const uint8_t *codes, const uint8_t *refined, size_t n, int scattered)
{
    uint32_t rows[BATCH];
    float out[BATCH];
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        srand(3);
        double t = seconds();
        for (int call = 0; call < 20000; call++) {
            for (size_t j = 0; j < BATCH; j++)
                rows[j] = scattered ? (uint32_t)((size_t)rand() % n) : (uint32_t)j;
            f(q, qc, codes, refined, rows, BATCH, out);
        }
        double ns = (seconds() - t) * 1e9 / (20000.0 * BATCH);
        best = ns < best ? ns : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIM ROWS\n", argv[0]);
        return 2;
    }
    uint32_t dim = (uint32_t)atoi(argv[1]);
    size_t n = (size_t)atol(argv[2]);
    struct kd_quant q;
    struct kd_qcode qc;
    if (dim < 2 || n < BATCH || kd_quant_init(&q, 1, 4, dim, KD_IP, 1, NULL, NULL, 7) ||
        kd_qcode_alloc(&qc, &q))
        return 1;
    float *x = malloc(n * dim * sizeof(float)), *work = malloc(q.pdim * sizeof(float));
    uint8_t *codes = malloc(n * q.code_size), *refined = malloc(n * q.refine_size);
    if (!x || !work || !codes || !refined)
        return 1;
    for (size_t i = 0; i < n * dim; i++)
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < n; i++)
        kd_quant_encode(&q, x + i * dim, codes + i * q.code_size, refined + i * q.refine_size,
                        work);
    kd_qcode_prepare(&q, x, &qc);
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    for (int scattered = 0; scattered <= 1; scattered++)
        for (size_t v = 0; v < sizeof names / sizeof *names; v++) {
            kd_refine_fn f = kd_refiner_named(names[v]);
            if (f)
                printf("dim %u, %s rows, %s: %.1f ns a row\n", dim,
                       scattered ? "scattered" : "cached", names[v],
                       ns_a_row(f, &q, &qc, codes, refined, n, scattered));
            else
                printf("dim %u: %s not on this CPU\n", dim, names[v]);
        }
    free(x);
    free(work);
    free(codes);
    free(refined);
    kd_qcode_free(&qc);
    kd_quant_free(&q);
    return 0;
}

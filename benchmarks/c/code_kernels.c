/* code_kernels.c — time each variant of the kernels that score codes, on n
 * rows of random codes, BATCH rows a call as a beam passes them:
 *   - the 1-bit estimator (quant.c's kd_estimator_named), with the variant
 *     the core picks at run time for this width (kd_estimator_variant);
 *   - the refined codes' estimator (kd_refiner_named);
 *   - the 8-bit build-code distance, each tier (buildcode.c).
 * "cached" scores rows 0..BATCH-1 over and over (the kernel's own cost),
 * "scattered" draws the rows at random from all n (each row missed in
 * cache, no prefetch). Best of 5 passes of 20,000 calls, in ns a row.
 *
 *   gcc -O2 -std=c11 -Icsrc csrc/common.c csrc/distance.c csrc/quant.c \
 *       csrc/buildcode.c benchmarks/c/code_kernels.c -lpthread -lm \
 *       -o /tmp/code_kernels
 *   /tmp/code_kernels 384 100000 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "buildcode.h"
#include "format.h"
#include "quant.h"

#define BATCH 64
#define CALLS 20000

struct codes {
    struct kd_quant q;
    struct kd_qcode qc;
    struct kd_bcode b;
    uint8_t *codes, *refined;
    kd_estimate_fn estimate;
    kd_refine_fn refine;
};

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One call of the kernel being timed; `call` varies the build codes' node. */
typedef void (*score_fn)(const struct codes *c, const uint32_t *rows, int call, float *out);

static void score_estimate(const struct codes *c, const uint32_t *rows, int call, float *out)
{
    c->estimate(&c->q, &c->qc, c->codes, rows, BATCH, out);
}

static void score_refine(const struct codes *c, const uint32_t *rows, int call, float *out)
{
    c->refine(&c->q, &c->qc, c->codes, c->refined, rows, BATCH, out);
}

static void score_bcode(const struct codes *c, const uint32_t *rows, int call, float *out)
{
    kd_bcode_from(&c->b, (uint32_t)call % BATCH, rows, BATCH, out);
}

static double ns_a_row(score_fn f, const struct codes *c, size_t n, int scattered)
{
    uint32_t rows[BATCH];
    float out[BATCH];
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        srand(3);
        double t = seconds();
        for (int call = 0; call < CALLS; call++) {
            for (size_t j = 0; j < BATCH; j++)
                rows[j] = scattered ? (uint32_t)((size_t)rand() % n) : (uint32_t)j;
            f(c, rows, call, out);
        }
        double ns = (seconds() - t) * 1e9 / (CALLS * (double)BATCH);
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
    struct codes c;
    if (dim < 2 || n < BATCH ||
        kd_quant_init(&c.q, 1, 4, dim, kd_quant_padded_dim(1, 4, dim, KD_FORMAT_VERSION), KD_IP, 1,
                      NULL, NULL, 7) ||
        kd_qcode_alloc(&c.qc, &c.q))
        return 1;
    float *x = malloc(n * dim * sizeof(float)), *work = malloc(c.q.pdim * sizeof(float));
    c.codes = malloc(n * c.q.code_size);
    c.refined = malloc(n * c.q.refine_size);
    if (!x || !work || !c.codes || !c.refined)
        return 1;
    for (size_t i = 0; i < n * dim; i++)
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < n; i++)
        kd_quant_encode(&c.q, x + i * dim, c.codes + i * c.q.code_size,
                        c.refined + i * c.q.refine_size, work);
    kd_qcode_prepare(&c.q, x, &c.qc);
    if (kd_bcode_fit(&c.b, dim, 0, x, NULL, n) || kd_bcode_reserve(&c.b, n))
        return 1;
    for (size_t i = 0; i < n; i++)
        kd_bcode_encode(&c.b, i, x + i * dim, 1.0f);
    static const char *const estimators[] = {"scalar", "popcnt", "avx2", "avx512"};
    static const char *const refiners[] = {"scalar", "avx2", "avx512"};
    static const char *const tiers[] = {"scalar", "avx2", "avx512-vnni"};
    for (int scattered = 0; scattered <= 1; scattered++) {
        const char *how = scattered ? "scattered" : "cached";
        for (size_t v = 0; v < sizeof estimators / sizeof *estimators; v++)
            if ((c.estimate = kd_estimator_named(estimators[v])))
                printf("dim %u, %s rows, 1-bit %s: %.1f ns a row\n", dim, how, estimators[v],
                       ns_a_row(score_estimate, &c, n, scattered));
        for (size_t v = 0; v < sizeof refiners / sizeof *refiners; v++)
            if ((c.refine = kd_refiner_named(refiners[v])))
                printf("dim %u, %s rows, refined %s: %.1f ns a row\n", dim, how, refiners[v],
                       ns_a_row(score_refine, &c, n, scattered));
        for (int t = 0; t < KD_BCODE_TIERS; t++)
            if (kd_bcode_use_tier(&c.b, t))
                printf("dim %u, %s rows, 8-bit %s: %.1f ns a row\n", dim, how, tiers[t],
                       ns_a_row(score_bcode, &c, n, scattered));
    }
    printf("dim %u: the core picks the 1-bit %s estimator\n", dim, kd_estimator_variant(c.q.pdim));
    free(x);
    free(work);
    free(c.codes);
    free(c.refined);
    kd_bcode_free(&c.b);
    kd_qcode_free(&c.qc);
    kd_quant_free(&c.q);
    return 0;
}

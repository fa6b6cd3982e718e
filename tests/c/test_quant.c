/* test_quant.c — the 1-bit estimators, the refined codes' estimators and the
 * distance kernels against their scalar references.
 *
 * Every estimator variant that this CPU has must return bit-identical
 * estimates (they add the same integer popcounts); the reference itself must
 * track the true distances. Dims cover each chunk path of the SIMD variants
 * (256, 128 and 64-bit pieces). Every distance kernel variant (AVX2,
 * AVX-512) must agree with the scalar one up to the rounding of a different
 * summation order, and its Walsh-Hadamard transform bit for bit. Refined
 * codes: the 1-bit part estimates as before, the refined estimate tracks the
 * true distances at least four times closer than the 1-bit one, and its AVX2
 * and AVX-512 variants agree with the scalar one up to summation order. A variant
 * this CPU lacks prints "skip ..."; one that ran prints "ran ...".
 * Run by tests/test_quant_native.py, or:
 *   gcc -O2 -g -std=c11 -Icsrc csrc/common.c csrc/distance.c csrc/quant.c \
 *       tests/c/test_quant.c -lpthread -lm -o /tmp/test_quant && /tmp/test_quant */
#include "check.h"
#include "distance.h"
#include "quant.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 42;

static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) - 0.5f;
}

/* Mean |estimate - true distance| of the rows' estimates est. */
static double mean_error(const float *x, const float *query, uint32_t dim, int metric,
                         const uint32_t *rows, const float *est, size_t n, double *spread)
{
    double err_sum = 0, mean = 0, var = 0;
    for (size_t i = 0; i < n; i++) {
        const float *v = x + (size_t)rows[i] * dim;
        double t = 0;
        for (uint32_t j = 0; j < dim; j++)
            t += metric == KD_L2 ? (double)(v[j] - query[j]) * (v[j] - query[j])
                                 : -(double)v[j] * query[j];
        err_sum += fabs(est[i] - t);
        mean += t;
        var += t * t;
    }
    mean /= n;
    *spread = sqrt(var / n - mean * mean);
    return err_sum / n;
}

static void refined_case(const struct kd_quant *q, const struct kd_qcode *qc, const float *x,
                         const float *query, const uint8_t *codes, const uint8_t *refined,
                         const uint32_t *rows, size_t n, int metric, double coarse_error)
{
    uint32_t dim = q->dim;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    kd_refiner_named("scalar")(q, qc, codes, refined, rows, n, ref);
    double spread, e = mean_error(x, query, dim, metric, rows, ref, n, &spread);
    CHECK(e < 0.25 * coarse_error, "dim %u metric %d: refined error %.4g vs 1-bit %.4g", dim,
          metric, e, coarse_error);
    static const char *const variants[] = {"avx2", "avx512"};
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        kd_refine_fn f = kd_refiner_named(variants[v]);
        if (!f) {
            printf("skip refined %s: this CPU lacks it\n", variants[v]);
            continue;
        }
        f(q, qc, codes, refined, rows, n, got);
        int same = 1;
        for (size_t i = 0; i < n; i++)
            same &= fabsf(got[i] - ref[i]) <= 1e-4f * (fabsf(ref[i]) + (float)spread);
        CHECK(same, "refined %s differs from scalar at dim %u", variants[v], dim);
    }
    free(ref);
    free(got);
}

static void one_case(uint32_t dim, uint32_t pdim, int metric, uint32_t refine)
{
    const size_t n = 600;
    const char *variants[] = {"popcnt", "avx2", "avx512"};
    struct kd_quant q;
    struct kd_qcode qc;
    memset(&qc, 0, sizeof qc);
    float *x = malloc(n * dim * sizeof(float)), *query = malloc(dim * sizeof(float));
    for (size_t i = 0; i < n * dim; i++)
        x[i] = uniform() + (float)(i / dim % 3); /* three loose clusters */
    for (uint32_t i = 0; i < dim; i++)
        query[i] = uniform() + 1.0f;
    int err = kd_quant_init(&q, 1, refine, dim, pdim, metric, 1, NULL, NULL, 7);
    CHECK(!err, "init dim %u: %d", dim, err);
    if (err)
        goto out_free;
    CHECK(!(err = kd_quant_train(&q, x, n, 7, 2)), "train dim %u: %d", dim, err);
    uint8_t *codes = malloc(n * q.code_size), *refined = malloc(n * q.refine_size + 1);
    float *work = malloc(q.pdim * sizeof(float));
    uint32_t *rows = malloc(n * sizeof(uint32_t));
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        kd_quant_encode(&q, x + i * dim, codes + i * q.code_size, refined + i * q.refine_size,
                        work);
        rows[i] = (uint32_t)((i * 7919) % n); /* scattered order */
    }
    CHECK(!kd_qcode_alloc(&qc, &q), "qcode alloc");
    kd_qcode_prepare(&q, query, &qc);
    kd_estimator_named("scalar")(&q, &qc, codes, rows, n, ref);

    /* The reference tracks the true distances: mean error small next to
     * the spread of the distances. */
    double spread, coarse = mean_error(x, query, dim, metric, rows, ref, n, &spread);
    CHECK(coarse < 0.25 * spread, "dim %u metric %d: mean error %.4g vs spread %.4g", dim, metric,
          coarse, spread);
    /* In one dimension o-c and q-c are parallel, where the 1-bit estimate
     * is exact: only there is it not the looser one. */
    if (refine && dim > 1)
        refined_case(&q, &qc, x, query, codes, refined, rows, n, metric, coarse);

    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        kd_estimate_fn f = kd_estimator_named(variants[v]);
        if (!f) {
            printf("skip %s: this CPU lacks it\n", variants[v]);
            continue;
        }
        memset(got, 0xff, n * sizeof(float));
        f(&q, &qc, codes, rows, n, got);
        CHECK(memcmp(got, ref, n * sizeof(float)) == 0, "%s differs from scalar at dim %u",
              variants[v], dim);
        /* An odd count (AVX-512 pairs rows up to 256 bits): the last alone. */
        memset(got, 0xff, n * sizeof(float));
        f(&q, &qc, codes, rows + 1, n - 1, got);
        CHECK(memcmp(got, ref + 1, (n - 1) * sizeof(float)) == 0,
              "%s differs from scalar at dim %u, %zu rows", variants[v], dim, n - 1);
    }
    kd_qcode_free(&qc);
    free(codes);
    free(refined);
    free(work);
    free(rows);
    free(ref);
    free(got);
    kd_quant_free(&q);
out_free:
    free(x);
    free(query);
}

/* kd_quant_nearest over a batch finds for every row the centre that
 * kd_quant_encode finds for it alone (the same bits whatever the block), and
 * the nearest by a double-precision scan wherever that one is nearer by a
 * margin rounding cannot cross; encoding with the centre given writes the
 * same code. 40 centres: a full panel of 32 and a partial one. */
static void nearest_case(uint32_t dim, uint32_t pdim, int metric)
{
    const size_t n = 40 * 64 + 5, stride = dim + 3; /* rows not packed */
    struct kd_quant q;
    float *x = malloc(n * stride * sizeof(float)), *work = NULL;
    for (size_t i = 0; i < n * stride; i++)
        x[i] = uniform() + (float)(i / stride % 5);
    int err = kd_quant_init(&q, 1, 0, dim, pdim, metric, 1, NULL, NULL, 3);
    CHECK(!err, "init dim %u: %d", dim, err);
    if (err)
        goto out_free;
    float *packed = malloc(n * dim * sizeof(float));
    for (size_t i = 0; i < n; i++)
        memcpy(packed + i * dim, x + i * stride, dim * sizeof(float));
    CHECK(!(err = kd_quant_train(&q, packed, n, 3, 2)), "train dim %u: %d", dim, err);
    CHECK(q.ncentres == 40, "dim %u: %u centres", dim, q.ncentres);
    uint32_t *near = malloc(n * sizeof(uint32_t));
    uint8_t *code = malloc(q.code_size), *again = malloc(q.code_size);
    work = malloc(q.pdim * sizeof(float));
    kd_quant_nearest(&q, x, stride, n, near);
    int same = 1, exact = 1, codes = 1;
    for (size_t i = 0; i < n; i++) {
        const float *v = x + i * stride;
        kd_quant_encode(&q, v, code, NULL, work);
        same &= kd_quant_centre_of(&q, code) == near[i];
        kd_quant_encode_near(&q, v, near[i], again, NULL, work);
        codes &= memcmp(code, again, q.code_size) == 0;
        double best = INFINITY, second = INFINITY;
        uint32_t arg = 0;
        for (uint32_t j = 0; j < q.ncentres; j++) {
            double s = 0;
            for (uint32_t t = 0; t < dim; t++) {
                double e = (double)v[t] - q.centres[(size_t)j * dim + t];
                s += e * e;
            }
            if (s < best) {
                second = best;
                best = s;
                arg = j;
            } else if (s < second) {
                second = s;
            }
        }
        if (second - best > 1e-3 * (best + 1))
            exact &= arg == near[i];
    }
    CHECK(same, "dim %u: a batch's nearest centres differ from a row's alone", dim);
    CHECK(exact, "dim %u: a nearest centre is not the nearest", dim);
    CHECK(codes, "dim %u: encoding with the centre given differs", dim);
    free(near);
    free(code);
    free(again);
    free(packed);
    kd_quant_free(&q);
out_free:
    free(work);
    free(x);
}

/* Agreement of a float sum with its reference, given the sum of the
 * magnitudes of its terms: only the order of the additions may differ. */
static int close_sum(float got, float ref, double magnitude)
{
    return fabs((double)got - ref) <= 1e-5 * magnitude + 1e-30;
}

static void kernel_variant(const char *name)
{
    const struct kd_kernels *ref = kd_kernels_named("scalar"), *k = kd_kernels_named(name);
    if (!k) {
        printf("skip %s kernels: this CPU or build lacks it\n", name);
        return;
    }
    /* Lengths around every vector width and tail length of the variants. */
    const size_t dims[] = {1,  3,  7,  8,  9,   15,  16,  17,  31,  32,
                           33, 63, 64, 65, 100, 128, 384, 769, 1024};
    const size_t maxd = 1024;
    float *a = malloc(maxd * sizeof(float)), *q[4];
    for (int j = 0; j < 4; j++)
        q[j] = malloc(maxd * sizeof(float));
    size_t checked = 0;
    for (size_t t = 0; t < sizeof dims / sizeof *dims; t++) {
        size_t d = dims[t];
        for (size_t i = 0; i < d; i++) {
            a[i] = 4 * uniform();
            for (int j = 0; j < 4; j++)
                q[j][i] = 4 * uniform() + (float)j;
        }
        double mag_l2 = 0, mag_dot = 0, mag_xx = 0;
        for (size_t i = 0; i < d; i++) {
            mag_l2 += ((double)a[i] - q[0][i]) * ((double)a[i] - q[0][i]);
            mag_dot += fabs((double)a[i] * q[0][i]);
            mag_xx += (double)a[i] * a[i];
        }
        float r = ref->l2sq(a, q[0], d), g = k->l2sq(a, q[0], d);
        CHECK(close_sum(g, r, mag_l2), "%s l2sq d=%zu: %.9g vs scalar %.9g", name, d, g, r);
        r = ref->dot(a, q[0], d), g = k->dot(a, q[0], d);
        CHECK(close_sum(g, r, mag_dot), "%s dot d=%zu: %.9g vs scalar %.9g", name, d, g, r);
        const float *const qs[4] = {q[0], q[1], q[2], q[3]};
        float ro[4], go[4], rxx, gxx;
        ref->dot4(qs, a, d, ro, &rxx);
        k->dot4(qs, a, d, go, &gxx);
        CHECK(close_sum(gxx, rxx, mag_xx), "%s dot4 |x|^2 d=%zu", name, d);
        for (int j = 0; j < 4; j++) {
            double m = 0, m2 = 0;
            for (size_t i = 0; i < d; i++) {
                m += fabs((double)a[i] * q[j][i]);
                m2 += ((double)a[i] - q[j][i]) * ((double)a[i] - q[j][i]);
            }
            CHECK(close_sum(go[j], ro[j], m), "%s dot4[%d] d=%zu: %.9g vs %.9g", name, j, d, go[j],
                  ro[j]);
            ref->l2sq4(qs, a, d, ro);
            k->l2sq4(qs, a, d, go);
            CHECK(close_sum(go[j], ro[j], m2), "%s l2sq4[%d] d=%zu: %.9g vs %.9g", name, j, d,
                  go[j], ro[j]);
        }
        checked++;
    }
    for (size_t n = 1; n <= maxd; n <<= 1) {
        for (size_t i = 0; i < n; i++)
            a[i] = q[0][i] = uniform();
        ref->fwht(a, n);
        k->fwht(q[0], n);
        CHECK(memcmp(a, q[0], n * sizeof(float)) == 0, "%s fwht n=%zu differs from scalar", name,
              n);
    }
    printf("ran %s kernels: %zu lengths, fwht up to %zu\n", name, checked, maxd);
    free(a);
    for (int j = 0; j < 4; j++)
        free(q[j]);
}

int main(void)
{
    kernel_variant("avx2");
    kernel_variant("avx512");
    /* Every width the popcnt variant unrolls (2, 4, 6, 8, 12, 16 words) and
     * some it loops over (1, 3, 13). */
    const uint32_t dims[] = {1, 17, 64, 100, 192, 256, 384, 512, 768, 769, 1024};
    /* Both widths: format 4's (dim rounded up to 64), which files keep, and
     * the padded one new codes take from 256 dims down. */
    const uint32_t versions[] = {KD_FORMAT_CODE_TAIL16, KD_FORMAT_WIDE_CODES};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        for (size_t v = 0; v < 2; v++) {
            for (uint32_t refine = 0; refine <= 4; refine += 4) {
                uint32_t pdim = kd_quant_padded_dim(1, refine, dims[i], versions[v]);
                if (v && pdim == kd_quant_padded_dim(1, refine, dims[i], versions[0]))
                    continue;
                one_case(dims[i], pdim, KD_L2, refine);
                one_case(dims[i], pdim, KD_IP, refine);
                if (!refine)
                    nearest_case(dims[i], pdim, i % 2 ? KD_IP : KD_L2);
            }
        }
    }
    CHECK(kd_quant_padded_dim(1, 0, 100, KD_FORMAT_WIDE_CODES) == 512 &&
              kd_quant_padded_dim(1, 0, 100, KD_FORMAT_CODE_TAIL16) == 128 &&
              kd_quant_padded_dim(4, 0, 100, KD_FORMAT_WIDE_CODES) == 128 &&
              kd_quant_padded_dim(1, 4, 100, KD_FORMAT_WIDE_CODES) == 128 &&
              kd_quant_padded_dim(1, 0, 256, KD_FORMAT_WIDE_CODES) == 512 &&
              kd_quant_padded_dim(1, 0, 257, KD_FORMAT_WIDE_CODES) == 320 &&
              kd_quant_padded_dim(1, 0, 769, KD_FORMAT_WIDE_CODES) == 832,
          "padded widths");
    struct kd_quant bad;
    CHECK(kd_quant_init(&bad, 1, 0, 100, 256, KD_L2, 1, NULL, NULL, 1) == -EINVAL,
          "a width neither format gives is refused");
    /* The timed pick: a variant this CPU has, the same on every call for a
     * width. */
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        uint32_t pdim = kd_quant_padded_dim(1, 0, dims[i], KD_FORMAT_CODE_TAIL16);
        const char *v = kd_estimator_variant(pdim);
        CHECK(kd_estimator_named(v) != NULL, "width %u picked %s", pdim, v);
        CHECK(strcmp(v, kd_estimator_variant(pdim)) == 0, "width %u: the pick changed", pdim);
    }
    CHECK(kd_estimator_named("no such variant") == NULL, "unknown name");
    CHECK(kd_refiner_named("no such variant") == NULL, "unknown name");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}

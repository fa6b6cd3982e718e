/* buildcode.c — 8-bit codes with one step for every dimension, and their
 * integer distances (see buildcode.h). */
#include "buildcode.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "distance.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define FIT_BINS 4096
/* Share of sampled values the step may clamp: a few outliers must not
 * coarsen every other dimension's levels. */
#define FIT_CLAMPED 1e-5

/* Each loop returns <q_a, q_b> of stored codes a and b (bytes q + 128).
 * Those that multiply q_a by the stored byte q_b + 128 take off `shift`,
 * the node's 128 sum(q_a), which its row keeps. */
static void dot4_scalar(const uint8_t *a, int64_t shift, const uint8_t *const rows[4], size_t width,
                        int64_t out[4])
{
    for (int r = 0; r < 4; r++) {
        int64_t acc = 0;
        for (size_t j = 0; j < width; j++)
            acc += (int8_t)(a[j] ^ 0x80) * (int32_t)rows[r][j];
        out[r] = acc - shift;
    }
}

static int64_t dot1_scalar(const uint8_t *a, int64_t shift, const uint8_t *row, size_t width)
{
    int64_t acc = 0;
    for (size_t j = 0; j < width; j++)
        acc += (int8_t)(a[j] ^ 0x80) * (int32_t)row[j];
    return acc - shift;
}

#if defined(__x86_64__) || defined(__i386__)
/* The lanes of four sums added up together: interleaves pair the rows'
 * partial sums, so the four cost about what one reduction alone would
 * (integers: the order does not change the result). */
__attribute__((target("avx2"))) static inline void sum4(const __m256i y[4], int64_t out[4])
{
    __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(y[0], y[1]),
                                 _mm256_unpackhi_epi32(y[0], y[1]));
    __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(y[2], y[3]),
                                 _mm256_unpackhi_epi32(y[2], y[3]));
    __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    int32_t v[4];
    _mm_storeu_si128((__m128i *)v, t);
    for (int r = 0; r < 4; r++)
        out[r] = v[r];
}

__attribute__((target("avx2"))) static inline __m256i load_signed(const uint8_t *p)
{
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8((char)0x80));
}

/* q stays within [-127, 127], so q_a q_b is exact in 16 bits as |q_a|
 * times q_b signed like q_a (127 * 127 twice is under 2^15): 32 byte pairs
 * an instruction, with no widening of the bytes first. */
__attribute__((target("avx2"))) static inline __m256i dot_step(__m256i qa, __m256i abs_a,
                                                               const uint8_t *row)
{
    __m256i p = _mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(load_signed(row), qa));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* A width that is an odd multiple of 16 ends with 16 bytes widened to 16
 * bits. */
__attribute__((target("avx2"))) static inline __m256i tail16(const uint8_t *a, const uint8_t *row)
{
    const __m128i flip = _mm_set1_epi8((char)0x80);
    __m128i qa = _mm_xor_si128(_mm_loadu_si128((const __m128i *)a), flip);
    __m128i qb = _mm_xor_si128(_mm_loadu_si128((const __m128i *)row), flip);
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(qa), _mm256_cvtepi8_epi16(qb));
}

__attribute__((target("avx2"))) static void dot4_avx2(const uint8_t *a, int64_t shift,
                                                      const uint8_t *const rows[4], size_t width,
                                                      int64_t out[4])
{
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    size_t j = 0;
    for (; j + 32 <= width; j += 32) {
        __m256i qa = load_signed(a + j), abs_a = _mm256_abs_epi8(qa);
        for (int r = 0; r < 4; r++)
            acc[r] = _mm256_add_epi32(acc[r], dot_step(qa, abs_a, rows[r] + j));
    }
    for (int r = 0; j < width && r < 4; r++)
        acc[r] = _mm256_add_epi32(acc[r], tail16(a + j, rows[r] + j));
    sum4(acc, out);
}

__attribute__((target("avx2"))) static int64_t dot1_avx2(const uint8_t *a, int64_t shift,
                                                         const uint8_t *row, size_t width)
{
    __m256i acc = _mm256_setzero_si256();
    size_t j = 0;
    for (; j + 32 <= width; j += 32) {
        __m256i qa = load_signed(a + j);
        acc = _mm256_add_epi32(acc, dot_step(qa, _mm256_abs_epi8(qa), row + j));
    }
    if (j < width)
        acc = _mm256_add_epi32(acc, tail16(a + j, row + j));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return _mm_cvtsi128_si32(t);
}

/* 64 dimensions an instruction, four rows a pass sharing the node's load. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
dot4_vnni(const uint8_t *a, int64_t shift, const uint8_t *const rows[4], size_t width,
          int64_t out[4])
{
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (size_t j = 0; j < width; j += 64) {
        /* The last step may be short: lanes past the width load as 0 and
         * multiply a row's 0, adding nothing. */
        __mmask64 k = width - j >= 64 ? ~0ull : (1ull << (width - j)) - 1;
        __m512i qa = _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, a + j), flip);
        for (int r = 0; r < 4; r++)
            acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_maskz_loadu_epi8(k, rows[r] + j), qa);
    }
    __m256i half[4];
    for (int r = 0; r < 4; r++)
        half[r] = _mm256_add_epi32(_mm512_castsi512_si256(acc[r]),
                                   _mm512_extracti64x4_epi64(acc[r], 1));
    sum4(half, out);
    for (int r = 0; r < 4; r++)
        out[r] -= shift;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int64_t
dot1_vnni(const uint8_t *a, int64_t shift, const uint8_t *row, size_t width)
{
    __m512i acc = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (size_t j = 0; j < width; j += 64) {
        __mmask64 k = width - j >= 64 ? ~0ull : (1ull << (width - j)) - 1;
        __m512i qa = _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, a + j), flip);
        acc = _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi8(k, row + j), qa);
    }
    return _mm512_reduce_add_epi32(acc) - shift;
}

static int has_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
#endif

int kd_bcode_use_tier(struct kd_bcode *b, int tier)
{
    switch (tier) {
    case KD_BCODE_SCALAR:
        b->dot4 = dot4_scalar;
        b->dot1 = dot1_scalar;
        break;
#if defined(__x86_64__) || defined(__i386__)
    case KD_BCODE_AVX2:
        if (!kd_cpu_has_avx2())
            return 0;
        b->dot4 = dot4_avx2;
        b->dot1 = dot1_avx2;
        break;
    case KD_BCODE_VNNI:
        if (!has_vnni())
            return 0;
        b->dot4 = dot4_vnni;
        b->dot1 = dot1_vnni;
        break;
#endif
    default:
        return 0;
    }
    return 1;
}

static int widest_tier(struct kd_bcode *b)
{
    for (int t = KD_BCODE_TIERS - 1; t > KD_BCODE_SCALAR; t--)
        if (kd_bcode_use_tier(b, t))
            return t;
    return kd_bcode_use_tier(b, KD_BCODE_SCALAR);
}

uint64_t kd_bcode_row_bytes(uint32_t dim)
{
    /* The code, then sum(q) and |q|^2 or the bias. */
    return dim > KD_BCODE_MAX_DIM ? 0 : kd_round_up(dim, 16) + 2 * sizeof(int32_t);
}

static inline float value_at(const float *x, const float *mul, size_t i, uint32_t dim, uint32_t j)
{
    return x[i * dim + j] * (mul ? mul[i] : 1.0f);
}

int kd_bcode_fit(struct kd_bcode *b, uint32_t dim, int l2, const float *x, const float *mul,
                 size_t n)
{
    memset(b, 0, sizeof *b);
    if (dim > KD_BCODE_MAX_DIM || n == 0)
        return kd_fail(-EINVAL, "build codes need 1 to %d dimensions and some rows",
                       KD_BCODE_MAX_DIM);
    b->dim = dim;
    b->width = (uint32_t)kd_round_up(dim, 16);
    b->stride = (uint32_t)kd_bcode_row_bytes(dim);
    b->l2 = l2;
    widest_tier(b);
    b->fitted = n;
    size_t s = n < KD_BCODE_FIT_SAMPLE ? n : KD_BCODE_FIT_SAMPLE;
    double *acc = calloc(dim, sizeof(double));
    uint64_t *bins = calloc(FIT_BINS, sizeof(uint64_t));
    b->mean = malloc(dim * sizeof(float));
    if (!acc || !bins || !b->mean) {
        free(acc);
        free(bins);
        kd_bcode_free(b);
        return kd_fail(-ENOMEM, "out of memory fitting the build codes");
    }
    for (size_t t = 0; t < s; t++)
        for (uint32_t j = 0; j < dim; j++)
            acc[j] += value_at(x, mul, t * n / s, dim, j);
    double msq = 0;
    for (uint32_t j = 0; j < dim; j++) {
        b->mean[j] = (float)(acc[j] / (double)s);
        msq += (double)b->mean[j] * b->mean[j];
    }
    b->mean_sq = (float)msq;
    /* The step: the largest deviation left once FIT_CLAMPED of them clamp. */
    float top = 0;
    for (size_t t = 0; t < s; t++)
        for (uint32_t j = 0; j < dim; j++)
            top = fmaxf(top, fabsf(value_at(x, mul, t * n / s, dim, j) - b->mean[j]));
    float edge = top;
    if (top > 0) {
        for (size_t t = 0; t < s; t++)
            for (uint32_t j = 0; j < dim; j++) {
                float dev = fabsf(value_at(x, mul, t * n / s, dim, j) - b->mean[j]);
                size_t k = (size_t)(dev / top * (FIT_BINS - 1));
                bins[k]++;
            }
        uint64_t keep = (uint64_t)ceil((double)s * dim * (1 - FIT_CLAMPED)), seen = 0;
        for (size_t k = 0; k < FIT_BINS; k++)
            if ((seen += bins[k]) >= keep) {
                edge = top * (float)(k + 1) / (FIT_BINS - 1);
                break;
            }
    }
    b->step = edge > 0 ? fminf(edge, top) / 127.0f : 1.0f;
    free(acc);
    free(bins);
    return 0;
}

int kd_bcode_refit_due(const struct kd_bcode *b, uint64_t rows)
{
    return !b->mean || (b->fitted < KD_BCODE_FIT_SAMPLE && rows >= 2 * b->fitted);
}

void kd_bcode_free(struct kd_bcode *b)
{
    free(b->mean);
    free(b->rows);
    memset(b, 0, sizeof *b);
}

int kd_bcode_reserve(struct kd_bcode *b, uint64_t cap)
{
    if (cap <= b->cap)
        return 0;
    uint8_t *r = realloc(b->rows, cap * b->stride);
    if (!r)
        return kd_fail(-ENOMEM, "out of memory for the build codes (%llu bytes)",
                       (unsigned long long)(cap * b->stride));
    b->rows = r;
    b->cap = cap;
    kd_advise_huge(r, cap * b->stride);
    return 0;
}

static inline const uint8_t *code_of(const struct kd_bcode *b, uint64_t row)
{
    return b->rows + row * b->stride;
}

/* The row's two terms after its code: sum(q), then |q|^2 or the bias. */
static inline int32_t sum_of(const struct kd_bcode *b, uint64_t row)
{
    int32_t v;
    memcpy(&v, code_of(b, row) + b->width, sizeof v);
    return v;
}

static inline int32_t sq_of(const struct kd_bcode *b, uint64_t row)
{
    int32_t v;
    memcpy(&v, code_of(b, row) + b->width + 4, sizeof v);
    return v;
}

static inline float bias_of(const struct kd_bcode *b, uint64_t row)
{
    float v;
    memcpy(&v, code_of(b, row) + b->width + 4, sizeof v);
    return v;
}

void kd_bcode_encode(struct kd_bcode *b, uint64_t row, const float *x, float mul)
{
    uint8_t *c = b->rows + row * b->stride;
    float inv = 1.0f / b->step;
    int32_t sum = 0, sq = 0;
    double bias = 0;
    for (uint32_t j = 0; j < b->dim; j++) {
        int q = (int)lrintf((x[j] * mul - b->mean[j]) * inv);
        q = q < -127 ? -127 : (q > 127 ? 127 : q); /* never -128: see dot_step */
        c[j] = (uint8_t)(q + 128);
        sum += q;
        sq += q * q;
        bias += (double)b->mean[j] * q;
    }
    memset(c + b->dim, 128, b->width - b->dim);
    float fb = (float)(bias * b->step);
    memcpy(c + b->width, &sum, 4);
    if (b->l2)
        memcpy(c + b->width + 4, &sq, 4);
    else
        memcpy(c + b->width + 4, &fb, 4);
}

void kd_bcode_decode(const struct kd_bcode *b, uint64_t row, float *out)
{
    const uint8_t *c = code_of(b, row);
    for (uint32_t j = 0; j < b->dim; j++)
        out[j] = b->mean[j] + b->step * (float)((int)c[j] - 128);
}

void kd_bcode_from(const struct kd_bcode *b, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    const uint8_t *ca = code_of(b, a);
    int64_t shift = 128 * (int64_t)sum_of(b, a), sq_a = b->l2 ? sq_of(b, a) : 0;
    float bias_a = b->l2 ? 0 : bias_of(b, a);
    float s2 = b->step * b->step;
    /* The rows are scattered: ask for all of their lines first, so that
     * the misses overlap (measured 14% faster builds than four rows at a
     * time, 116k x 384 with 2 threads). */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < b->stride; j += 64)
            __builtin_prefetch(code_of(b, rows[i]) + j);
    int64_t dot[4];
    for (size_t i = 0; i < n; i += 4) {
        size_t m = n - i < 4 ? n - i : 4;
        if (m == 4) {
            const uint8_t *c[4] = {code_of(b, rows[i]), code_of(b, rows[i + 1]),
                                   code_of(b, rows[i + 2]), code_of(b, rows[i + 3])};
            b->dot4(ca, shift, c, b->width, dot);
        } else { /* the last 1-3 rows: a pass of four would score rows twice */
            for (size_t t = 0; t < m; t++)
                dot[t] = b->dot1(ca, shift, code_of(b, rows[i + t]), b->width);
        }
        for (size_t t = 0; t < m; t++) {
            uint32_t r = rows[i + t];
            int64_t ip = dot[t];
            out[i + t] = b->l2 ? s2 * (float)(sq_a + sq_of(b, r) - 2 * ip)
                               : -(b->mean_sq + bias_a + bias_of(b, r) + s2 * (float)ip);
        }
    }
}

int kd_bcode_pairwise(const float *x, size_t n, uint32_t dim, int l2, int tier, float *out,
                      float *step)
{
    struct kd_bcode b;
    int err = kd_bcode_fit(&b, dim, l2, x, NULL, n);
    if (err)
        return err;
    if (!kd_bcode_use_tier(&b, tier)) {
        err = kd_fail(-ENOTSUP, "build-code tier %d is unavailable on this CPU", tier);
        goto out;
    }
    uint32_t *rows = malloc(n * sizeof(uint32_t));
    if (!rows || (err = kd_bcode_reserve(&b, n))) {
        free(rows);
        err = err ? err : kd_fail(-ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        kd_bcode_encode(&b, i, x + i * dim, 1.0f);
        rows[i] = (uint32_t)i;
    }
    for (size_t i = 0; i < n; i++)
        kd_bcode_from(&b, (uint32_t)i, rows, n, out + i * n);
    *step = b.step;
    free(rows);
out:
    kd_bcode_free(&b);
    return err;
}

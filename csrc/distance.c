#include "distance.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KD_X86 1
#endif

static float l2sq_scalar(const float *a, const float *b, size_t d)
{
    /* Four accumulators keep the reference close to the SIMD sums' rounding. */
    float s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= d; i += 4)
        for (int j = 0; j < 4; j++) {
            float t = a[i + j] - b[i + j];
            s[j] += t * t;
        }
    for (; i < d; i++) {
        float t = a[i] - b[i];
        s[0] += t * t;
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static float dot_scalar(const float *a, const float *b, size_t d)
{
    float s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= d; i += 4)
        for (int j = 0; j < 4; j++)
            s[j] += a[i + j] * b[i + j];
    for (; i < d; i++)
        s[0] += a[i] * b[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void dot4_scalar(const float *const q[4], const float *x, size_t d, float out[4], float *xx)
{
    for (int j = 0; j < 4; j++)
        out[j] = dot_scalar(q[j], x, d);
    *xx = dot_scalar(x, x, d);
}

static void l2sq4_scalar(const float *const q[4], const float *x, size_t d, float out[4])
{
    for (int j = 0; j < 4; j++)
        out[j] = l2sq_scalar(q[j], x, d);
}

static void fwht_scalar(float *x, size_t n)
{
    for (size_t h = 1; h < n; h <<= 1)
        for (size_t i = 0; i < n; i += h << 1)
            for (size_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

/* The panels' reference: each sum one fused multiply-add a term, in order,
 * which every variant repeats lane by lane. */
static void panel_dot_scalar(const float *q, size_t qstride, size_t nq, const float *panel,
                             size_t d, float *out)
{
    for (size_t j = 0; j < nq; j++) {
        float *acc = out + j * KD_PANEL_ROWS;
        for (int r = 0; r < KD_PANEL_ROWS; r++)
            acc[r] = 0;
        for (size_t i = 0; i < d; i++) {
            float b = q[j * qstride + i];
            const float *x = panel + i * KD_PANEL_ROWS;
            for (int r = 0; r < KD_PANEL_ROWS; r++)
                acc[r] = fmaf(b, x[r], acc[r]);
        }
    }
}

static void panel_norms_scalar(const float *panel, size_t d, float out[KD_PANEL_ROWS])
{
    for (int r = 0; r < KD_PANEL_ROWS; r++)
        out[r] = 0;
    for (size_t i = 0; i < d; i++)
        for (int r = 0; r < KD_PANEL_ROWS; r++)
            out[r] = fmaf(panel[i * KD_PANEL_ROWS + r], panel[i * KD_PANEL_ROWS + r], out[r]);
}

static void panel_pack_scalar(const float *const *rows, size_t n, size_t d, float *panel)
{
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < d; i++)
            panel[i * KD_PANEL_ROWS + r] = rows[r][i];
    for (size_t r = n; r < KD_PANEL_ROWS; r++)
        for (size_t i = 0; i < d; i++)
            panel[i * KD_PANEL_ROWS + r] = 0;
}

#ifdef FP_FAST_FMAF /* fmaf is one instruction (aarch64, or built with -mfma) */
#define SCALAR_FUSED 1
#else
#define SCALAR_FUSED 0
#endif

static const struct kd_kernels scalar_kernels = {"scalar",           l2sq_scalar,
                                                 dot_scalar,         dot4_scalar,
                                                 l2sq4_scalar,       fwht_scalar,
                                                 panel_pack_scalar,  panel_dot_scalar,
                                                 panel_norms_scalar, SCALAR_FUSED};

#ifdef KD_X86
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* Mask for the last d%8 lanes, so odd dims need no scalar tail. */
AVX2 static inline __m256i tail_mask(size_t r)
{
    static const int ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(ones + 8 - r));
}

AVX2 static float l2sq_avx2(const float *a, const float *b, size_t d)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 t0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        __m256 t1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
        s0 = _mm256_fmadd_ps(t0, t0, s0);
        s1 = _mm256_fmadd_ps(t1, t1, s1);
    }
    for (; i + 8 <= d; i += 8) {
        __m256 t = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        s0 = _mm256_fmadd_ps(t, t, s0);
    }
    if (i < d) {
        __m256i m = tail_mask(d - i);
        __m256 t = _mm256_sub_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m));
        s1 = _mm256_fmadd_ps(t, t, s1);
    }
    return hsum256(_mm256_add_ps(s0, s1));
}

AVX2 static float dot_avx2(const float *a, const float *b, size_t d)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= d; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < d) {
        __m256i m = tail_mask(d - i);
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
    }
    return hsum256(_mm256_add_ps(s0, s1));
}

/* Two accumulators per query: an FMA's latency is several cycles, so one
 * chain per query would leave the FMA units idle. */
AVX2 static void dot4_avx2(const float *const q[4], const float *x, size_t d, float out[4],
                           float *xx)
{
    __m256 a[4], b[4], xa = _mm256_setzero_ps(), xb = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++)
        a[j] = b[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
        for (int j = 0; j < 4; j++) {
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i), v, a[j]);
            b[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i + 8), w, b[j]);
        }
        xa = _mm256_fmadd_ps(v, v, xa);
        xb = _mm256_fmadd_ps(w, w, xb);
    }
    for (; i < d; i += 8) {
        __m256i m = tail_mask(d - i >= 8 ? 8 : d - i);
        __m256 v = _mm256_maskload_ps(x + i, m);
        for (int j = 0; j < 4; j++)
            a[j] = _mm256_fmadd_ps(_mm256_maskload_ps(q[j] + i, m), v, a[j]);
        xa = _mm256_fmadd_ps(v, v, xa);
    }
    for (int j = 0; j < 4; j++)
        out[j] = hsum256(_mm256_add_ps(a[j], b[j]));
    *xx = hsum256(_mm256_add_ps(xa, xb));
}

AVX2 static void l2sq4_avx2(const float *const q[4], const float *x, size_t d, float out[4])
{
    __m256 a[4], b[4];
    for (int j = 0; j < 4; j++)
        a[j] = b[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
        for (int j = 0; j < 4; j++) {
            __m256 s = _mm256_sub_ps(_mm256_loadu_ps(q[j] + i), v);
            __m256 t = _mm256_sub_ps(_mm256_loadu_ps(q[j] + i + 8), w);
            a[j] = _mm256_fmadd_ps(s, s, a[j]);
            b[j] = _mm256_fmadd_ps(t, t, b[j]);
        }
    }
    for (; i < d; i += 8) {
        __m256i m = tail_mask(d - i >= 8 ? 8 : d - i);
        __m256 v = _mm256_maskload_ps(x + i, m);
        for (int j = 0; j < 4; j++) {
            __m256 s = _mm256_sub_ps(_mm256_maskload_ps(q[j] + i, m), v);
            a[j] = _mm256_fmadd_ps(s, s, a[j]);
        }
    }
    for (int j = 0; j < 4; j++)
        out[j] = hsum256(_mm256_add_ps(a[j], b[j]));
}

/* The first three stages (h = 1, 2, 4) stay inside one register: swap lanes,
 * then blend the sums with the differences; later stages pair registers. */
AVX2 static void fwht_avx2(float *x, size_t n)
{
    if (n < 8) {
        fwht_scalar(x, n);
        return;
    }
    for (size_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), w;
        w = _mm256_permute_ps(v, 0xB1);
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xAA);
        w = _mm256_permute_ps(v, 0x4E);
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xCC);
        w = _mm256_permute2f128_ps(v, v, 1);
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xF0);
        _mm256_storeu_ps(x + i, v);
    }
    for (size_t h = 8; h < n; h <<= 1)
        for (size_t i = 0; i < n; i += h << 1)
            for (size_t j = i; j < i + h; j += 8) {
                __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
            }
    __m256 s = _mm256_set1_ps(1.0f / sqrtf((float)n));
    for (size_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
}

/* Panels by three queries: twelve sums of eight rows in registers. */
AVX2 static inline __attribute__((always_inline)) void
panel_group_avx2(const float *q, size_t qstride, size_t n, const float *panel, size_t d, float *out)
{
    __m256 a[3][4];
    for (size_t j = 0; j < n; j++)
        for (int v = 0; v < 4; v++)
            a[j][v] = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i++) {
        const float *x = panel + i * KD_PANEL_ROWS;
        for (size_t j = 0; j < n; j++) {
            __m256 b = _mm256_broadcast_ss(q + j * qstride + i);
            for (int v = 0; v < 4; v++)
                a[j][v] = _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8 * v), a[j][v]);
        }
    }
    for (size_t j = 0; j < n; j++)
        for (int v = 0; v < 4; v++)
            _mm256_storeu_ps(out + j * KD_PANEL_ROWS + 8 * v, a[j][v]);
}

AVX2 static void panel_dot_avx2(const float *q, size_t qstride, size_t nq, const float *panel,
                                size_t d, float *out)
{
    for (size_t j = 0; j < nq; j += 3) {
        const float *qj = q + j * qstride;
        float *o = out + j * KD_PANEL_ROWS;
        if (nq - j >= 3)
            panel_group_avx2(qj, qstride, 3, panel, d, o);
        else if (nq - j == 2)
            panel_group_avx2(qj, qstride, 2, panel, d, o);
        else
            panel_group_avx2(qj, qstride, 1, panel, d, o);
    }
}

AVX2 static void panel_norms_avx2(const float *panel, size_t d, float out[KD_PANEL_ROWS])
{
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (size_t i = 0; i < d; i++)
        for (int v = 0; v < 4; v++) {
            __m256 x = _mm256_loadu_ps(panel + i * KD_PANEL_ROWS + 8 * v);
            a[v] = _mm256_fmadd_ps(x, x, a[v]);
        }
    for (int v = 0; v < 4; v++)
        _mm256_storeu_ps(out + 8 * v, a[v]);
}

static const struct kd_kernels avx2_kernels = {
    "avx2",    l2sq_avx2,         dot_avx2,       dot4_avx2,        l2sq4_avx2,
    fwht_avx2, panel_pack_scalar, panel_dot_avx2, panel_norms_avx2, 1};

/* AVX-512: masked loads handle any tail. */
#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __mmask16 mask16(size_t r) { return (__mmask16)((1u << r) - 1u); }

AVX512 static float l2sq_avx512(const float *a, const float *b, size_t d)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        __m512 t0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
        __m512 t1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
        s0 = _mm512_fmadd_ps(t0, t0, s0);
        s1 = _mm512_fmadd_ps(t1, t1, s1);
    }
    for (; i < d; i += 16) {
        __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : mask16(d - i);
        __m512 t = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
        s0 = _mm512_fmadd_ps(t, t, s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

AVX512 static float dot_avx512(const float *a, const float *b, size_t d)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < d; i += 16) {
        __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : mask16(d - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

AVX512 static void dot4_avx512(const float *const q[4], const float *x, size_t d, float out[4],
                               float *xx)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps();
    __m512 s3 = _mm512_setzero_ps(), sx = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i += 16) {
        __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : mask16(d - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q[0] + i), v, s0);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q[1] + i), v, s1);
        s2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q[2] + i), v, s2);
        s3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q[3] + i), v, s3);
        sx = _mm512_fmadd_ps(v, v, sx);
    }
    out[0] = _mm512_reduce_add_ps(s0);
    out[1] = _mm512_reduce_add_ps(s1);
    out[2] = _mm512_reduce_add_ps(s2);
    out[3] = _mm512_reduce_add_ps(s3);
    *xx = _mm512_reduce_add_ps(sx);
}

AVX512 static void l2sq4_avx512(const float *const q[4], const float *x, size_t d, float out[4])
{
    __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (size_t i = 0; i < d; i += 16) {
        __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : mask16(d - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        for (int j = 0; j < 4; j++) {
            __m512 t = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, q[j] + i), v);
            s[j] = _mm512_fmadd_ps(t, t, s[j]);
        }
    }
    for (int j = 0; j < 4; j++)
        out[j] = _mm512_reduce_add_ps(s[j]);
}

/* Panels by up to twelve queries: 24 sums of sixteen rows in registers, two
 * loads and twelve broadcasts for 24 FMAs. The count is a constant in each
 * copy, so the sums stay in registers. */
AVX512 static inline __attribute__((always_inline)) void
panel_group_avx512(const float *q, size_t qstride, size_t n, const float *panel, size_t d,
                   float *out)
{
    __m512 a[KD_PANEL_QUERIES][2];
    for (size_t j = 0; j < n; j++)
        a[j][0] = a[j][1] = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i++) {
        __m512 x0 = _mm512_loadu_ps(panel + i * KD_PANEL_ROWS);
        __m512 x1 = _mm512_loadu_ps(panel + i * KD_PANEL_ROWS + 16);
        for (size_t j = 0; j < n; j++) {
            __m512 b = _mm512_set1_ps(q[j * qstride + i]);
            a[j][0] = _mm512_fmadd_ps(b, x0, a[j][0]);
            a[j][1] = _mm512_fmadd_ps(b, x1, a[j][1]);
        }
    }
    for (size_t j = 0; j < n; j++) {
        _mm512_storeu_ps(out + j * KD_PANEL_ROWS, a[j][0]);
        _mm512_storeu_ps(out + j * KD_PANEL_ROWS + 16, a[j][1]);
    }
}

#define PANEL_CASE(n)                                                                              \
    case n:                                                                                        \
        panel_group_avx512(q, qstride, n, panel, d, out);                                          \
        break

AVX512 static void panel_dot_avx512(const float *q, size_t qstride, size_t nq, const float *panel,
                                    size_t d, float *out)
{
    switch (nq) {
        PANEL_CASE(1);
        PANEL_CASE(2);
        PANEL_CASE(3);
        PANEL_CASE(4);
        PANEL_CASE(5);
        PANEL_CASE(6);
        PANEL_CASE(7);
        PANEL_CASE(8);
        PANEL_CASE(9);
        PANEL_CASE(10);
        PANEL_CASE(11);
    default:
        panel_group_avx512(q, qstride, KD_PANEL_QUERIES, panel, d, out);
    }
}

/* A 16 x 16 block transposed in registers: 32-bit, then 64-bit interleaves
 * within 128-bit lanes, then two rounds of lane shuffles. */
AVX512 static inline void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int h = 0; h < 2; h++) {
            __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + h + 2]);
            u[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    /* u[4g + c], lane L: column 4L + c of rows 4g..4g+3. */
    for (int c = 0; c < 4; c++) {
        __m512 lo0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        __m512 hi0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 lo1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        __m512 hi1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(lo0, lo1, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(lo0, lo1, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(hi0, hi1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(hi0, hi1, 0xDD);
    }
}

AVX512 static void panel_pack_avx512(const float *const *rows, size_t n, size_t d, float *panel)
{
    for (size_t half = 0; half < KD_PANEL_ROWS / 16; half++) {
        float *to = panel + 16 * half;
        if (n <= 16 * half) {
            for (size_t i = 0; i < d; i++)
                _mm512_storeu_ps(to + i * KD_PANEL_ROWS, _mm512_setzero_ps());
            continue;
        }
        for (size_t i = 0; i < d; i += 16) {
            __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : mask16(d - i);
            __m512 r[16];
            for (size_t t = 0; t < 16; t++)
                r[t] = 16 * half + t < n ? _mm512_maskz_loadu_ps(m, rows[16 * half + t] + i)
                                         : _mm512_setzero_ps();
            transpose16(r);
            for (size_t c = 0; c < 16 && i + c < d; c++)
                _mm512_storeu_ps(to + (i + c) * KD_PANEL_ROWS, r[c]);
        }
    }
}

AVX512 static void panel_norms_avx512(const float *panel, size_t d, float out[KD_PANEL_ROWS])
{
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i++) {
        __m512 x0 = _mm512_loadu_ps(panel + i * KD_PANEL_ROWS);
        __m512 x1 = _mm512_loadu_ps(panel + i * KD_PANEL_ROWS + 16);
        a0 = _mm512_fmadd_ps(x0, x0, a0);
        a1 = _mm512_fmadd_ps(x1, x1, a1);
    }
    _mm512_storeu_ps(out, a0);
    _mm512_storeu_ps(out + 16, a1);
}

/* The transform is short and cache-resident: the AVX2 one serves here. */
static const struct kd_kernels avx512_kernels = {"avx512",           l2sq_avx512,
                                                 dot_avx512,         dot4_avx512,
                                                 l2sq4_avx512,       fwht_avx2,
                                                 panel_pack_avx512,  panel_dot_avx512,
                                                 panel_norms_avx512, 1};

int kd_cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int kd_cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}
#else
int kd_cpu_has_avx2(void) { return 0; }
int kd_cpu_has_avx512(void) { return 0; }
#endif

const struct kd_kernels *kd_kernels_named(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return &scalar_kernels;
#ifdef KD_X86
    if (strcmp(name, "avx2") == 0 && kd_cpu_has_avx2())
        return &avx2_kernels;
    if (strcmp(name, "avx512") == 0 && kd_cpu_has_avx512())
        return &avx512_kernels;
#endif
    return NULL;
}

const struct kd_kernels *kd_kernels(void)
{
    static const struct kd_kernels *chosen;
    const struct kd_kernels *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (!k) {
        k = kd_kernels_named("avx512");
        if (!k)
            k = kd_kernels_named("avx2");
        if (!k)
            k = &scalar_kernels;
        __atomic_store_n(&chosen, k, __ATOMIC_RELEASE);
    }
    return k;
}

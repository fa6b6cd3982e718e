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

/* Four rows, each through the variant's block kernel: the reference the
 * tiled AVX-512 kernels equal bit for bit, and the AVX2 variants' tiles. */
#define ROW_TILES(tier)                                                                            \
    static void dot4x4_##tier(const float *const q[4], const float *const x[4], size_t d,          \
                              float out[16], float xx[4])                                          \
    {                                                                                              \
        for (int r = 0; r < 4; r++)                                                                \
            dot4_##tier(q, x[r], d, out + 4 * r, xx + r);                                          \
    }                                                                                              \
    static void l2sq4x4_##tier(const float *const q[4], const float *const x[4], size_t d,         \
                               float out[16])                                                      \
    {                                                                                              \
        for (int r = 0; r < 4; r++)                                                                \
            l2sq4_##tier(q, x[r], d, out + 4 * r);                                                 \
    }

ROW_TILES(scalar)

static const struct kd_kernels scalar_kernels = {"scalar",      l2sq_scalar,   dot_scalar,
                                                 dot4_scalar,   l2sq4_scalar,  fwht_scalar,
                                                 dot4x4_scalar, l2sq4x4_scalar};

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

ROW_TILES(avx2)

static const struct kd_kernels avx2_kernels = {"avx2",     l2sq_avx2, dot_avx2,    dot4_avx2,
                                               l2sq4_avx2, fwht_avx2, dot4x4_avx2, l2sq4x4_avx2};

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

/* Four queries by four rows: the same sums as four dot4_avx512 calls, in
 * sixteen named registers (arrays of them end up on the stack), each block
 * of a query loaded once for four rows. */
#define TILE_ROW(r, v, STEP)                                                                       \
    STEP(s##r##0, q0, v);                                                                          \
    STEP(s##r##1, q1, v);                                                                          \
    STEP(s##r##2, q2, v);                                                                          \
    STEP(s##r##3, q3, v)
#define TILE_STORE(r)                                                                              \
    out[4 * r + 0] = _mm512_reduce_add_ps(s##r##0);                                                \
    out[4 * r + 1] = _mm512_reduce_add_ps(s##r##1);                                                \
    out[4 * r + 2] = _mm512_reduce_add_ps(s##r##2);                                                \
    out[4 * r + 3] = _mm512_reduce_add_ps(s##r##3)
#define TILE_SUMS                                                                                  \
    __m512 s00 = _mm512_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00,       \
           s12 = s00, s13 = s00, s20 = s00, s21 = s00, s22 = s00, s23 = s00, s30 = s00, s31 = s00, \
           s32 = s00, s33 = s00
#define TILE_LOADS                                                                                 \
    __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : mask16(d - i);                                 \
    __m512 q0 = _mm512_maskz_loadu_ps(m, q[0] + i), q1 = _mm512_maskz_loadu_ps(m, q[1] + i);       \
    __m512 q2 = _mm512_maskz_loadu_ps(m, q[2] + i), q3 = _mm512_maskz_loadu_ps(m, q[3] + i);       \
    __m512 v0 = _mm512_maskz_loadu_ps(m, x[0] + i), v1 = _mm512_maskz_loadu_ps(m, x[1] + i);       \
    __m512 v2 = _mm512_maskz_loadu_ps(m, x[2] + i), v3 = _mm512_maskz_loadu_ps(m, x[3] + i)
#define DOT_STEP(s, qv, v) s = _mm512_fmadd_ps(qv, v, s)
#define L2_STEP(s, qv, v)                                                                          \
    do {                                                                                           \
        __m512 t_ = _mm512_sub_ps(qv, v);                                                          \
        s = _mm512_fmadd_ps(t_, t_, s);                                                            \
    } while (0)

AVX512 static void dot4x4_avx512(const float *const q[4], const float *const x[4], size_t d,
                                 float out[16], float xx[4])
{
    TILE_SUMS;
    __m512 x0 = s00, x1 = s00, x2 = s00, x3 = s00;
    for (size_t i = 0; i < d; i += 16) {
        TILE_LOADS;
        TILE_ROW(0, v0, DOT_STEP);
        TILE_ROW(1, v1, DOT_STEP);
        TILE_ROW(2, v2, DOT_STEP);
        TILE_ROW(3, v3, DOT_STEP);
        x0 = _mm512_fmadd_ps(v0, v0, x0);
        x1 = _mm512_fmadd_ps(v1, v1, x1);
        x2 = _mm512_fmadd_ps(v2, v2, x2);
        x3 = _mm512_fmadd_ps(v3, v3, x3);
    }
    TILE_STORE(0);
    TILE_STORE(1);
    TILE_STORE(2);
    TILE_STORE(3);
    xx[0] = _mm512_reduce_add_ps(x0);
    xx[1] = _mm512_reduce_add_ps(x1);
    xx[2] = _mm512_reduce_add_ps(x2);
    xx[3] = _mm512_reduce_add_ps(x3);
}

AVX512 static void l2sq4x4_avx512(const float *const q[4], const float *const x[4], size_t d,
                                  float out[16])
{
    TILE_SUMS;
    for (size_t i = 0; i < d; i += 16) {
        TILE_LOADS;
        TILE_ROW(0, v0, L2_STEP);
        TILE_ROW(1, v1, L2_STEP);
        TILE_ROW(2, v2, L2_STEP);
        TILE_ROW(3, v3, L2_STEP);
    }
    TILE_STORE(0);
    TILE_STORE(1);
    TILE_STORE(2);
    TILE_STORE(3);
}

/* The transform is short and cache-resident: the AVX2 one serves here. */
static const struct kd_kernels avx512_kernels = {"avx512",      l2sq_avx512,   dot_avx512,
                                                 dot4_avx512,   l2sq4_avx512,  fwht_avx2,
                                                 dot4x4_avx512, l2sq4x4_avx512};

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

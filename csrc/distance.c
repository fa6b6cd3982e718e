#include "distance.h"

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

static const struct kd_kernels scalar_kernels = {"scalar", l2sq_scalar, dot_scalar};

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

static const struct kd_kernels avx2_kernels = {"avx2", l2sq_avx2, dot_avx2};

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
#endif
    return NULL;
}

const struct kd_kernels *kd_kernels(void)
{
    static const struct kd_kernels *chosen;
    const struct kd_kernels *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (!k) {
        k = kd_kernels_named("avx2");
        if (!k)
            k = &scalar_kernels;
        __atomic_store_n(&chosen, k, __ATOMIC_RELEASE);
    }
    return k;
}

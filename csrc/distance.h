/* distance.h — float32 distance kernels with run-time SIMD dispatch.
 * Every kernel has a scalar reference; kd_distance_use() picks the variant
 * (tests compare each variant with the scalar one). */
#ifndef KD_DISTANCE_H
#define KD_DISTANCE_H

#include <stddef.h>

typedef float (*kd_pair_fn)(const float *a, const float *b, size_t d);

struct kd_kernels {
    const char *name;     /* "scalar", "avx2" */
    kd_pair_fn l2sq;      /* sum (a-b)^2 */
    kd_pair_fn dot;       /* sum a*b */
};

/* The kernels in use (chosen once, on first call, from the CPU's features). */
const struct kd_kernels *kd_kernels(void);
/* A named variant, or NULL if this CPU or build lacks it. */
const struct kd_kernels *kd_kernels_named(const char *name);

int kd_cpu_has_avx2(void);
int kd_cpu_has_avx512(void);

#endif

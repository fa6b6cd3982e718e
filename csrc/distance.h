/* distance.h — float32 distance kernels with run-time SIMD dispatch.
 * Every kernel has a scalar reference; kd_distance_use() picks the variant
 * (tests compare each variant with the scalar one). */
#ifndef KD_DISTANCE_H
#define KD_DISTANCE_H

#include <stddef.h>

typedef float (*kd_pair_fn)(const float *a, const float *b, size_t d);
/* Inner products of four queries with x, and |x|^2, in one pass over x: the
 * block that lets exact search reuse each loaded vector four times. */
typedef void (*kd_block_fn)(const float *const q[4], const float *x, size_t d, float out[4],
                            float *xx);
/* Squared distances of four queries to x in one pass over x. */
typedef void (*kd_block_l2_fn)(const float *const q[4], const float *x, size_t d, float out[4]);
/* The same for four vectors x[0..4) at once: out[4 * r + j] is query j
 * against x[r], xx[r] = |x[r]|^2. Sixteen sums kept apart: each loaded block
 * serves four FMAs, and no chain waits on another. Bit-identical to four
 * calls of the block kernel of the same variant. */
typedef void (*kd_tile_fn)(const float *const q[4], const float *const x[4], size_t d,
                           float out[16], float xx[4]);
typedef void (*kd_tile_l2_fn)(const float *const q[4], const float *const x[4], size_t d,
                              float out[16]);
/* Orthonormal Walsh-Hadamard transform of n floats in place, n a power of
 * two. Every variant does the same butterflies in the same order, so the
 * results are bit-identical (codes written on one CPU are read on another). */
typedef void (*kd_fwht_fn)(float *x, size_t n);

struct kd_kernels {
    const char *name; /* "scalar", "avx2", "avx512" */
    kd_pair_fn l2sq;  /* sum (a-b)^2 */
    kd_pair_fn dot;   /* sum a*b */
    kd_block_fn dot4;
    kd_block_l2_fn l2sq4;
    kd_fwht_fn fwht;
    kd_tile_fn dot4x4;
    kd_tile_l2_fn l2sq4x4;
};

/* The kernels in use (chosen once, on first call, from the CPU's features). */
const struct kd_kernels *kd_kernels(void);
/* A named variant ("scalar", "avx2", "avx512"), or NULL if this CPU or
 * build lacks it. */
const struct kd_kernels *kd_kernels_named(const char *name);

int kd_cpu_has_avx2(void);
int kd_cpu_has_avx512(void);

#endif

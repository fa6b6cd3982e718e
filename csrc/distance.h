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
/* Exact search scores panels: KD_PANEL_ROWS rows stored dim-major (element i
 * of row r at panel[i * KD_PANEL_ROWS + r]), so that one register holds an
 * element of many rows and no sum ends in a horizontal reduction. panel_dot
 * gives the inner products of nq <= KD_PANEL_QUERIES queries (query j at
 * q + j * qstride) with the panel's rows, out[j * KD_PANEL_ROWS + r]. Each
 * sum adds its d terms in order, one fused multiply-add a term, so every
 * variant gives the same bits, whatever the batch or the row's place in it.
 * (l2 takes its bound from these and scores the few rows that pass it by
 * (q - x)^2: exact.c.) */
#define KD_PANEL_ROWS 32
#define KD_PANEL_QUERIES 12
typedef void (*kd_panel_fn)(const float *q, size_t qstride, size_t nq, const float *panel, size_t d,
                            float *out);
/* Pack n <= KD_PANEL_ROWS rows of d floats into a panel (d * KD_PANEL_ROWS
 * floats), rows past n zero. */
typedef void (*kd_panel_pack_fn)(const float *const *rows, size_t n, size_t d, float *panel);
/* |x|^2 of each of a panel's rows, summed the same way. */
typedef void (*kd_panel_norms_fn)(const float *panel, size_t d, float out[KD_PANEL_ROWS]);
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
    kd_panel_pack_fn panel_pack;
    kd_panel_fn panel_dot;
    kd_panel_norms_fn panel_norms;
    /* Whether panel_dot runs on hardware FMAs. The scalar reference calls
     * fmaf, a library routine on x86-64 without FMA: there exact search
     * scores rows where they lie instead. */
    int fused_panels;
};

/* The kernels in use (chosen once, on first call, from the CPU's features). */
const struct kd_kernels *kd_kernels(void);
/* A named variant ("scalar", "avx2", "avx512"), or NULL if this CPU or
 * build lacks it. */
const struct kd_kernels *kd_kernels_named(const char *name);

int kd_cpu_has_avx2(void);
int kd_cpu_has_avx512(void);

#endif

/* buildcode.h — the 8-bit codes that graph insertion scores with.
 *
 * Every dimension shares one step, so the distance of two codes is an
 * integer inner product, exact in every SIMD tier (VNNI, AVX2, scalar):
 *
 *   x ~= mean + step * q,   q in [-127, 127]
 *   |x - y|^2 ~= step^2 (|qx|^2 + |qy|^2 - 2 <qx, qy>)
 *   <x, y>    ~= |mean|^2 + bx + by + step^2 <qx, qy>,  bx = step <mean, qx>
 *
 * A code is a quarter of the float32 vector, and a four-row VNNI pass
 * covers 64 dimensions an instruction: insertion reads and multiplies a
 * fraction of what float32 distances cost. Codes are stored as q + 128
 * (unsigned), which is what VNNI multiplies by the signed node code. */
#ifndef KD_BUILDCODE_H
#define KD_BUILDCODE_H

#include <stddef.h>
#include <stdint.h>

/* Past this many dimensions the integer sums could overflow. */
#define KD_BCODE_MAX_DIM 65536

enum { KD_BCODE_SCALAR, KD_BCODE_AVX2, KD_BCODE_VNNI, KD_BCODE_TIERS };

/* <q_a, q_b> of code a with four rows' codes; shift is a's 128 sum(q_a). */
typedef void (*kd_bcode_dot4_fn)(const uint8_t *a, int64_t shift, const uint8_t *const rows[4],
                                 size_t width, int64_t out[4]);
/* One row's: a batch's last 1-3 rows, and selection's single checks. */
typedef int64_t (*kd_bcode_dot1_fn)(const uint8_t *a, int64_t shift, const uint8_t *row,
                                    size_t width);

struct kd_bcode {
    uint32_t dim, width; /* width: dim rounded up to 16, pads code 0 */
    int l2;              /* squared l2, else minus the inner product */
    float step, mean_sq;
    float *mean;
    uint64_t fitted; /* rows the fit sampled from */
    uint64_t cap;
    uint32_t stride; /* bytes a row: the code, then its two terms */
    /* Per row: q + 128 (width bytes), then sum(q) as int32, then |q|^2
     * (l2, int32) or step <mean, q> (float): one row's misses bring all. */
    uint8_t *rows;
    kd_bcode_dot4_fn dot4;
    kd_bcode_dot1_fn dot1;
};

/* Bytes a row's build code takes in RAM while the index can grow; 0 past
 * KD_BCODE_MAX_DIM (insertion then scores with float32 distances). */
uint64_t kd_bcode_row_bytes(uint32_t dim);
/* Rows a fit samples at most. */
#define KD_BCODE_FIT_SAMPLE 8192
/* Fit mean and step to rows x[0..n) (scaled by mul[i] where mul is not
 * NULL: cosine codes unit vectors); a sample of at most
 * KD_BCODE_FIT_SAMPLE rows is read. No codes are kept yet. */
int kd_bcode_fit(struct kd_bcode *b, uint32_t dim, int l2, const float *x, const float *mul,
                 size_t n);
void kd_bcode_free(struct kd_bcode *b);
/* Whether codes for `rows` rows want a new fit: none yet, or one on fewer
 * than KD_BCODE_FIT_SAMPLE rows that the rows have since doubled (a small
 * first add must not set the step for all that follows). */
int kd_bcode_refit_due(const struct kd_bcode *b, uint64_t rows);
/* Room for cap rows. */
int kd_bcode_reserve(struct kd_bcode *b, uint64_t cap);
/* Code row `row` from x scaled by mul (values past the range clamp). */
void kd_bcode_encode(struct kd_bcode *b, uint64_t row, const float *x, float mul);
/* Row `row`'s code decoded: mean + step * q, dim floats. */
void kd_bcode_decode(const struct kd_bcode *b, uint64_t row, float *out);
/* Distances from row a to rows[0..n), smaller is nearer. */
void kd_bcode_from(const struct kd_bcode *b, uint32_t a, const uint32_t *rows, size_t n,
                   float *out);
/* Use the given tier's loop (tests); 0 when the CPU lacks it. */
int kd_bcode_use_tier(struct kd_bcode *b, int tier);
/* Test hook: codes fitted to x[0..n) (unit rows for cosine), then every
 * pair's distance at the given tier into out (n x n), and the step. */
int kd_bcode_pairwise(const float *x, size_t n, uint32_t dim, int l2, int tier, float *out,
                      float *step);

#endif

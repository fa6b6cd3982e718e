/* quant.h — 1-bit codes with per-vector corrections (RaBitQ family).
 *
 * Vectors are assigned to the nearest of a few k-means centres c (one centre
 * leaves |o-c| large on clustered data and the estimates loose). o-c is padded
 * to a multiple of 64 dims and turned by a fixed random orthogonal rotation P
 * (rounds of random sign flips and fast Walsh-Hadamard transforms). The code
 * is the sign bits s of P(o-c) plus corrections. A query is rotated once,
 * relative to the mean g of the centres, and scalar-quantized to 4 bits, so
 * <o-c, q-c> is estimated with popcounts over bit planes:
 *
 *   <o-c, q-c> ~= |o-c|^2 / sum|P(o-c)| * (<s, P(q-g)> - <s, P(c-g)>)
 *
 * where the last term is stored per vector.
 *
 * The 4- and 8-bit options are per-dimension scalar codes (min/max learnt on
 * a sample), estimated against the float query: slower, closer estimates.
 *
 * A 1-bit code may carry a refinement: 4 bits per dimension of the same
 * rotated residual P(o-c), symmetric levels -7..7 times a per-row step
 * fitted by least squares. It re-orders the beam's best before the reads
 * (search.c); the beam itself runs on the sign bits alone:
 *
 *   <o-c, q-c> ~= step * <lev - 7, P(q-g)> - <r^, P(c-g)>
 */
#ifndef KD_QUANT_H
#define KD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "metric.h"

#define KD_ROT_ROUNDS 2
#define KD_QUERY_BITS 4


/* Trailer of every 1-bit code, after pdim/8 bytes of sign bits. Only one
 * correction serves a metric, so it is the one kept: at 384 dimensions a
 * code is then 64 bytes, one cache line a beam step instead of two. */
struct kd_code_tail {
    float scale;     /* |o-c|^2 / sum|P(o-c)| */
    float corr;      /* |o-c|^2 for l2, else <o-c, c> */
    float shift;     /* <s, P(c-g)> */
    uint16_t ones;   /* number of 1 bits */
    uint16_t centre; /* index of c */
};

/* Stored in the codes section of index files (format 4 on). */
_Static_assert(sizeof(struct kd_code_tail) == 16, "code tails are stored in files");
_Static_assert(offsetof(struct kd_code_tail, ones) == 12, "code tails are stored in files");

/* Formats 1 to 3 stored a 20-byte tail: scale, |o-c|^2, <o-c, c>, shift
 * (floats), ones, centre (u16). */
#define KD_CODE_TAIL_V3 20
/* The first format with the 16-byte tail. */
#define KD_FORMAT_CODE_TAIL16 4
/* The first format whose 1-bit codes of 256 or fewer dimensions carry
 * KD_CODE_BITS_WIDE bits: the vector is padded with zeros before the
 * rotation. */
#define KD_FORMAT_WIDE_CODES 5
#define KD_CODE_BITS_WIDE 512u

/* A refinement, kept apart from the codes so that the beam's codes stay
 * dense: this head, then pdim/2 bytes of levels, dimension 2i in the low
 * nibble of byte i. The code's tail gives the centre and corrections. */
struct kd_refine_head {
    float step;  /* r^ = step * (level - 7) */
    float shift; /* <r^, P(c-g)> */
};

_Static_assert(sizeof(struct kd_refine_head) == 8, "refined codes are stored in files");

#define KD_REFINE_MID 7 /* the level of 0 */
#define KD_MAX_CENTRES 256

struct kd_quant {
    uint32_t bits;        /* 1, 4 or 8 */
    uint32_t refine;      /* 1-bit codes: 4 when they carry a refinement, else 0 */
    uint32_t refine_size; /* bytes of a refinement, 0 without */
    uint32_t dim;         /* input dims */
    uint32_t pdim;        /* padded dims, a multiple of 64 */
    uint32_t code_size;   /* pdim/8 + sizeof(struct kd_code_tail) */
    int metric;
    uint32_t ncentres;
    float *centres;       /* ncentres x dim */
    float *centres_sq;    /* |c|^2 */
    float *mean;          /* g: mean of the centres, dim */
    float *rot_centres;   /* P(c-g), ncentres x pdim */
    float *centre_panels; /* the centres as distance.h's panels, for the nearest */
    uint8_t *signs;       /* KD_ROT_ROUNDS * 2 * pdim bytes, each 0 or 1 */
    float *sq_lo;         /* scalar codes: value = lo + step * level, dim each */
    float *sq_step;
};

/* Query prepared for estimates against codes. */
struct kd_qcode {
    uint64_t *planes; /* KD_QUERY_BITS planes of pdim bits */
    float lo, delta;  /* dequantized value = lo + delta * level */
    float sum_q;      /* sum of dequantized rotated query */
    /* Per-centre terms, computed the first time a code of that centre is
     * scored (a search touches few of the centres). */
    float *norm_sq;       /* |q-c|^2 per centre */
    float *dot_c;         /* <q, c> per centre */
    uint32_t *centre_gen; /* == gen when the centre's terms are current */
    uint32_t gen;
    const float *x;  /* the query, valid while it is being searched */
    float x_sq;      /* |q|^2 */
    float *work;     /* pdim floats of scratch */
    uint8_t *levels; /* pdim quantized levels */
    float *rot;      /* refined codes: P(q-g), pdim floats */
    float *sq;       /* scalar codes: 2 * dim per-query factors */
    float sq_const;
};

/* The rotated width of bits-bit codes (refined by refine bits) of dim
 * dimensions in files of the given format version (and in memory, at
 * KD_FORMAT_VERSION): dim rounded up to a multiple of 64, and for 1-bit codes
 * without refinements from format 5 on KD_CODE_BITS_WIDE where that is at
 * least twice as wide (a refinement has 4 bits a rotated dimension: padded,
 * it would double). */
uint32_t kd_quant_padded_dim(uint32_t bits, uint32_t refine, uint32_t dim, uint32_t version);
/* The lowest 1-bit code format that holds q's width: KD_FORMAT_WIDE_CODES
 * where its codes are padded, else KD_FORMAT_CODE_TAIL16. */
uint32_t kd_quant_code_format(const struct kd_quant *q);
/* Bytes a code takes in a file of the given format version. */
uint32_t kd_quant_file_code_size(uint32_t bits, uint32_t refine, uint32_t dim, uint32_t version);
/* n 1-bit codes of q as a file of a version before 4 stores them (from),
 * with the 20-byte tail, into q's layout (to, n * q->code_size bytes);
 * from == to is not allowed. Callers read files of q's own layout as is. */
void kd_quant_codes_from_file(const struct kd_quant *q, uint32_t version, const uint8_t *from,
                              uint8_t *to, uint64_t n);
uint32_t kd_quant_refine_size(uint32_t refine, uint32_t pdim);

/* Set up a quantizer; centres NULL means one zero centre, signs NULL draws
 * the rotation from seed. refine: 0, or 4 with bits 1. pdim: the rotated
 * width, a multiple of 64 no less than dim (kd_quant_padded_dim). */
int kd_quant_init(struct kd_quant *q, uint32_t bits, uint32_t refine, uint32_t dim, uint32_t pdim,
                  int metric, uint32_t ncentres, const float *centres, const uint8_t *signs,
                  uint64_t seed);
/* Scalar-code ranges (dim floats each), when restoring a saved quantizer. */
void kd_quant_set_ranges(struct kd_quant *q, const float *lo, const float *step);
/* A deep copy of src (dst uninitialized), so that codes of both agree. */
int kd_quant_copy(struct kd_quant *dst, const struct kd_quant *src);
/* 1 when a and b encode every vector identically. */
int kd_quant_equal(const struct kd_quant *a, const struct kd_quant *b);
/* Fit the centres by k-means to x (n rows, already normalized for cosine). */
int kd_quant_train(struct kd_quant *q, const float *x, size_t n, uint64_t seed, unsigned threads);
/* The centres a 1-bit quantizer trained on n rows gets. */
uint32_t kd_quant_centres_for(size_t n);
void kd_quant_free(struct kd_quant *q);
size_t kd_quant_signs_bytes(const struct kd_quant *q);

/* The centre a code was encoded against (0 for scalar codes, which have
 * none but the zero one). */
uint32_t kd_quant_centre_of(const struct kd_quant *q, const uint8_t *code);
/* Encode one vector (already normalized for cosine), and its refinement
 * when q has one; work holds pdim floats. */
void kd_quant_encode(const struct kd_quant *q, const float *x, uint8_t *code, uint8_t *refined,
                     float *work);
/* The same, given x's nearest centre j (kd_quant_nearest's; ignored by
 * scalar codes). */
void kd_quant_encode_near(const struct kd_quant *q, const float *x, uint32_t j, uint8_t *code,
                          uint8_t *refined, float *work);
/* The nearest centre of each of n rows (row i at x + i * stride floats),
 * scored in blocks: what kd_quant_encode finds for each alone. */
void kd_quant_nearest(const struct kd_quant *q, const float *x, size_t stride, size_t n,
                      uint32_t *best);
/* <x_i, c_j> of n rows (row i at x + i * stride floats) with every centre,
 * at out[i * ncentres + j], scored twelve rows a pass over the centres. */
void kd_quant_centre_dots(const struct kd_quant *q, const float *x, size_t stride, size_t n,
                          float *out);

int kd_qcode_alloc(struct kd_qcode *qc, const struct kd_quant *q);
void kd_qcode_free(struct kd_qcode *qc);
/* Prepare a query (already normalized for cosine). */
void kd_qcode_prepare(const struct kd_quant *q, const float *x, struct kd_qcode *qc);
/* After kd_qcode_prepare: every centre's terms from the query's inner
 * products with the centres (kd_quant_centre_dots), instead of each made
 * the first time a code of that centre is scored. */
void kd_qcode_take_centre_dots(const struct kd_quant *q, struct kd_qcode *qc, const float *dots);

/* Estimated distance (smaller is better: l2 -> squared distance, ip/cosine ->
 * minus the inner product) of each code rows[i] in codes. */
typedef void (*kd_estimate_fn)(const struct kd_quant *q, const struct kd_qcode *qc,
                               const uint8_t *codes, const uint32_t *rows, size_t n, float *out);
/* The estimator for q's code type, SIMD where the CPU has it. */
kd_estimate_fn kd_estimator(const struct kd_quant *q);
/* A named 1-bit variant, "scalar", "popcnt", "avx2" or "avx512" (with
 * VPOPCNTQ), or NULL where the CPU lacks it (tests). */
kd_estimate_fn kd_estimator_named(const char *name);
/* The name of the 1-bit variant kd_estimator picks for codes of pdim bits
 * on this CPU: the widest within 5% of the fastest, timed once per code
 * width in the process. */
const char *kd_estimator_variant(uint32_t pdim);
/* The estimate from the refinements of rows (refined: refine_size bytes a
 * row), with the codes' tails. */
typedef void (*kd_refine_fn)(const struct kd_quant *q, const struct kd_qcode *qc,
                             const uint8_t *codes, const uint8_t *refined, const uint32_t *rows,
                             size_t n, float *out);
/* "scalar", "avx2" or "avx512" (NULL where the CPU lacks it); kd_refiner
 * picks the best, NULL when q has no refinement. */
kd_refine_fn kd_refiner_named(const char *name);
/* The name of the variant kd_refiner picks on this CPU. */
const char *kd_refiner_variant(void);
kd_refine_fn kd_refiner(const struct kd_quant *q);

#endif

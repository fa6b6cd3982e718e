/* merge.c — several indexes written as one new index file (see merge.h).
 *
 * Phases, each input's vectors being read front to back in large chunks:
 *   fit     one pass: a sample of the live vectors (unit length first for
 *           cosine) for 8-bit build codes, or the range of every dimension
 *           over all of them for 4-bit ones; and the search code of each
 *           row whose input's quantizer differs from the output's (the
 *           base's, or the one the caller gives);
 *   encode  a second pass: the build code of every live vector;
 *   repair  the base's graph renumbered, its removed nodes dropped; a list
 *           that lost a neighbour keeps the others and takes in, from the
 *           live neighbours of the ones it lost (the consolidation of
 *           FreshDiskANN), those insertion's diversity rule admits, which
 *           link back to it as insertion's choices do, then the nearest up
 *           to the length it had; a level-0 list left under m/2 is searched
 *           for again from the entry;
 *   insert  the other inputs' live rows, as kd_index_add inserts, their
 *           levels drawn from their ids;
 *   write   the output through the normal save path, its vector section
 *           streamed from the inputs in a third pass.
 * Graph distances come from the build codes: with 8 bits those insertion
 * uses (buildcode.h), with 4 (or past KD_BCODE_MAX_DIM dimensions) the
 * residual codes below; smaller is closer (squared l2, minus the inner
 * product). Past 1.2 times the cache, or where the centres explain little
 * of the rows' spread (kd_beam_spread), insertion's beam reads the 1-bit
 * search codes, each node prepared from its decoded build code.
 * Memory: the output's graph, codes and ids, the build codes (before them,
 * their fit's sample, no larger), a map from each input row to its output
 * row, and the stream buffers. */
#include "merge.h"
#include "common.h"
#include "index_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define CHUNK_BYTES (8u << 20) /* vectors of an in-memory input per chunk */
#define WRITE_BYTES (4u << 20) /* records gathered per write of the output */
#define GRAPH_STEP 10000       /* nodes repaired or inserted between progress calls */
#define CACHED_DIMS 8192       /* a decoded code this long is kept per thread */
#define ROWS_PER_THREAD 256    /* fewer rows than this a thread: fewer threads */

/* ---- residual build codes
 *
 * Per-dimension scalar codes of each vector's residual from its centre in
 * the output's quantizer: value = offset + step * level, where a centre's
 * offset is the centre plus lo. Residuals spread far less than the vectors
 * on clustered data, so the same levels land closer (measured at
 * fit_ranges). The code of a vector is `width` bytes, a multiple of 8.
 * With 8 bits, byte j is dimension j. With 4 bits, byte j holds dimension
 * j in its low nibble and dimension j + width in its high one, so both
 * halves are read contiguously. Positions past dim (padding) have offset =
 * step = 0 and add nothing.
 *
 * One loop serves every metric: the inner product of a decoded vector a
 * with row b is a's inner product with b's offset (one per centre, kept
 * while a is scored) plus sum(a * step * level_b); squared l2 adds the two
 * decoded norms, which are kept per row. */

/* The sum over a code c of width bytes of w * level (w holds pd floats). */
typedef float (*bc_row_fn)(const float *w, const uint8_t *c, size_t width);
typedef void (*bc_row4_fn)(const float *w, const uint8_t *const c[4], size_t width, float out[4]);

struct bcodes {
    uint32_t bits, dim;
    uint32_t width;    /* bytes per code */
    uint32_t pd;       /* dimensions a code can hold: width or 2 * width */
    int l2;            /* squared l2, else minus the inner product */
    uint8_t *codes;    /* one per output row */
    uint16_t *centre;  /* one per output row */
    float *norm;       /* one per output row, l2 only: |decoded|^2 */
    uint32_t ncentres; /* the output quantizer's */
    const float *centres;
    float *lo, *step;
    float *offset; /* per centre, pd floats: centre + lo (0 past dim) */
    bc_row_fn row;
    bc_row4_fn row4; /* NULL: row at a time */
    uint64_t serial; /* names these codes in the oracle's per-thread cache */
};

/* A row of these codes: the code, its centre and its decoded norm. */
static uint64_t residual_row_bytes(uint32_t bits, uint32_t dim)
{
    return kd_round_up(bits == 8 ? dim : (dim + 1) / 2, 8) + sizeof(uint16_t) + sizeof(float);
}

uint64_t kd_merge_row_bytes(uint32_t bits, uint32_t dim)
{
    uint64_t uniform = bits == 8 ? kd_bcode_row_bytes(dim) : 0;
    return uniform ? uniform : residual_row_bytes(bits, dim);
}

/* The scalar reference loops; the SIMD ones below compute the same sums. */
static float dot_8bit(const float *w, const uint8_t *c, size_t width)
{
    float acc = 0;
    for (size_t j = 0; j < width; j++)
        acc += w[j] * (float)c[j];
    return acc;
}

static float dot_4bit(const float *w, const uint8_t *c, size_t width)
{
    float acc = 0;
    for (size_t j = 0; j < width; j++)
        acc += w[j] * (float)(c[j] & 15) + w[width + j] * (float)(c[j] >> 4);
    return acc;
}

static const bc_row_fn rows_scalar[2] = {dot_8bit, dot_4bit};

#if defined(__x86_64__) || defined(__i386__)
#define AVX2 __attribute__((target("avx2,fma")))

/* Eight bytes of a code as 32-bit lanes. */
AVX2 static inline __m256i bytes8(const uint8_t *c)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c));
}

AVX2 static inline float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

AVX2 static float dot_8bit_avx2(const float *w, const uint8_t *c, size_t width)
{
    __m256 acc = _mm256_setzero_ps();
    for (size_t j = 0; j < width; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_cvtepi32_ps(bytes8(c + j)), acc);
    return hsum8(acc);
}

AVX2 static float dot_4bit_avx2(const float *w, const uint8_t *c, size_t width)
{
    __m256 acc = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi32(15);
    for (size_t j = 0; j < width; j += 8) {
        __m256i b = bytes8(c + j);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_cvtepi32_ps(_mm256_and_si256(b, low)),
                              acc);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + width + j),
                              _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), acc);
    }
    return hsum8(acc);
}

static const bc_row_fn rows_avx2[2] = {dot_8bit_avx2, dot_4bit_avx2};

/* Four rows a pass, sixteen bytes of code a step: w is loaded once for all
 * four, and four codes' cache misses overlap. A width that is an odd
 * multiple of 8 ends with a half step, the upper lanes of w loaded as
 * zero. */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

AVX512 static inline __m512i bytes16(const uint8_t *c, int half)
{
    __m128i v = half ? _mm_loadl_epi64((const __m128i *)c) : _mm_loadu_si128((const __m128i *)c);
    return _mm512_cvtepu8_epi32(v);
}

AVX512 static void dot_8bit_x4(const float *w, const uint8_t *const c[4], size_t width,
                               float out[4])
{
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (size_t j = 0; j < width; j += 16) {
        int half = width - j < 16;
        __m512 wj = _mm512_maskz_loadu_ps(half ? 0xff : 0xffff, w + j);
        for (int r = 0; r < 4; r++)
            acc[r] = _mm512_fmadd_ps(wj, _mm512_cvtepi32_ps(bytes16(c[r] + j, half)), acc[r]);
    }
    for (int r = 0; r < 4; r++)
        out[r] = _mm512_reduce_add_ps(acc[r]);
}

AVX512 static void dot_4bit_x4(const float *w, const uint8_t *const c[4], size_t width,
                               float out[4])
{
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    const __m512i low = _mm512_set1_epi32(15);
    for (size_t j = 0; j < width; j += 16) {
        int half = width - j < 16;
        __mmask16 k = half ? 0xff : 0xffff;
        __m512 wl = _mm512_maskz_loadu_ps(k, w + j), wh = _mm512_maskz_loadu_ps(k, w + width + j);
        for (int r = 0; r < 4; r++) {
            __m512i b = bytes16(c[r] + j, half);
            acc[r] = _mm512_fmadd_ps(wl, _mm512_cvtepi32_ps(_mm512_and_si512(b, low)), acc[r]);
            acc[r] = _mm512_fmadd_ps(wh, _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++)
        out[r] = _mm512_reduce_add_ps(acc[r]);
}

static const bc_row4_fn rows4_avx512[2] = {dot_8bit_x4, dot_4bit_x4};
#endif

/* The loops for a metric and width at a SIMD tier (BC_BEST: the widest
 * the CPU has): one row a call, or four (NULL: one at a time). A tier the
 * CPU lacks gives 0. */
enum { BC_SCALAR, BC_AVX2, BC_AVX512, BC_TIERS, BC_BEST = BC_TIERS };

static int bc_pick(struct bcodes *b, int tier)
{
    int i = b->bits == 4;
    b->row = rows_scalar[i];
    b->row4 = NULL;
#if defined(__x86_64__) || defined(__i386__)
    if ((tier == BC_BEST || tier == BC_AVX512) && kd_cpu_has_avx512() && kd_cpu_has_avx2()) {
        b->row4 = rows4_avx512[i];
        return 1;
    }
    if ((tier == BC_BEST || tier == BC_AVX2) && kd_cpu_has_avx2()) {
        b->row = rows_avx2[i];
        return 1;
    }
#endif
    return tier == BC_BEST || tier == BC_SCALAR;
}

/* centres: ncentres x dim, which the rows' centre numbers index. */
static int bc_init(struct bcodes *b, uint32_t bits, uint32_t dim, int metric, uint64_t rows,
                   uint32_t ncentres, const float *centres, int tier)
{
    memset(b, 0, sizeof *b);
    b->bits = bits;
    b->dim = dim;
    b->width = (uint32_t)kd_round_up(bits == 8 ? dim : (dim + 1) / 2, 8);
    b->pd = bits == 8 ? b->width : 2 * b->width;
    b->l2 = metric == KD_L2;
    b->ncentres = ncentres;
    b->centres = centres;
    static uint64_t serials;
    b->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    bc_pick(b, tier);
    b->lo = calloc(b->pd, sizeof(float));
    b->step = calloc(b->pd, sizeof(float));
    b->offset = calloc((size_t)ncentres * b->pd, sizeof(float));
    b->codes = calloc(rows ? rows : 1, b->width);
    b->centre = calloc(rows ? rows : 1, sizeof(uint16_t));
    b->norm = b->l2 ? calloc(rows ? rows : 1, sizeof(float)) : NULL;
    if (!b->lo || !b->step || !b->offset || !b->codes || !b->centre || (b->l2 && !b->norm))
        return kd_fail(-ENOMEM, "out of memory for the build codes (%llu bytes)",
                       (unsigned long long)(rows * residual_row_bytes(bits, dim)));
    return 0;
}

/* Once lo is set: each centre's offset. */
static void bc_offsets(struct bcodes *b)
{
    for (uint32_t k = 0; k < b->ncentres; k++)
        for (uint32_t j = 0; j < b->dim; j++)
            b->offset[(size_t)k * b->pd + j] = b->centres[(size_t)k * b->dim + j] + b->lo[j];
}

static void bc_free(struct bcodes *b)
{
    free(b->lo);
    free(b->step);
    free(b->offset);
    free(b->codes);
    free(b->centre);
    free(b->norm);
    memset(b, 0, sizeof *b);
}

/* The level of position j (a dimension) in code c. */
static inline unsigned bc_level(const struct bcodes *b, const uint8_t *c, uint32_t j)
{
    if (b->bits == 8)
        return c[j];
    return j < b->width ? c[j] & 15u : (unsigned)c[j - b->width] >> 4;
}

/* The code of residual r (x minus its centre). */
static void bc_encode(const struct bcodes *b, const float *r, uint8_t *c)
{
    int top = (1 << b->bits) - 1;
    memset(c, 0, b->width);
    for (uint32_t j = 0; j < b->dim; j++) {
        int u = (int)lrintf((r[j] - b->lo[j]) / b->step[j]);
        u = u < 0 ? 0 : (u > top ? top : u);
        if (b->bits == 8)
            c[j] = (uint8_t)u;
        else if (j < b->width)
            c[j] |= (uint8_t)u;
        else
            c[j - b->width] |= (uint8_t)(u << 4);
    }
}

static inline const float *bc_offset_of(const struct bcodes *b, uint32_t row)
{
    return b->offset + (size_t)b->centre[row] * b->pd;
}

/* Position j of row's decoded vector. */
static inline float bc_value(const struct bcodes *b, uint32_t row, uint32_t j)
{
    return bc_offset_of(b, row)[j] +
           b->step[j] * (float)bc_level(b, b->codes + (size_t)row * b->width, j);
}

/* The distance of two rows with no scratch, in double precision: the slow
 * path for codes longer than the per-thread cache holds, and the reference
 * of the test hook. */
static float bc_pair(const struct bcodes *b, uint32_t x, uint32_t y)
{
    double acc = 0;
    for (uint32_t j = 0; j < b->dim; j++) {
        double u = bc_value(b, x, j), v = bc_value(b, y, j);
        acc += b->l2 ? (u - v) * (u - v) : u * v;
    }
    return b->l2 ? (float)acc : (float)-acc;
}

/* Row's decoded vector (bc_value at every position) into dec, and times
 * step into w, pd floats each, in loops the compiler vectorizes. */
static void bc_decode(const struct bcodes *b, uint32_t row, float *restrict dec, float *restrict w)
{
    const uint8_t *restrict c = b->codes + (size_t)row * b->width;
    const float *restrict off = bc_offset_of(b, row), *restrict s = b->step;
    size_t wd = b->width;
    if (b->bits == 8) {
        for (size_t j = 0; j < wd; j++) {
            dec[j] = off[j] + s[j] * (float)c[j];
            w[j] = dec[j] * s[j];
        }
        return;
    }
    for (size_t j = 0; j < wd; j++) {
        size_t h = wd + j;
        dec[j] = off[j] + s[j] * (float)(c[j] & 15);
        dec[h] = off[h] + s[h] * (float)(c[j] >> 4);
        w[j] = dec[j] * s[j];
        w[h] = dec[h] * s[h];
    }
}

/* The squared norm of row's decoded vector, for l2. */
static void bc_set_norm(struct bcodes *b, uint32_t row)
{
    double acc = 0;
    for (uint32_t j = 0; j < b->pd; j++) {
        double v = bc_value(b, row, j);
        acc += v * v;
    }
    b->norm[row] = (float)acc;
}

/* What scoring from node a needs, kept per thread from one call to the
 * next: insertion scores batch after batch from the same node. */
struct bc_from_cache {
    uint64_t serial; /* of the build codes; 0: empty */
    uint32_t a;
    float dec[CACHED_DIMS + 16], w[CACHED_DIMS]; /* a decoded; times step (not 4 KiB apart) */
    float bias[KD_MAX_CENTRES];                  /* <dec, offset> per centre */
    uint8_t known[KD_MAX_CENTRES];
};

static _Thread_local struct bc_from_cache bc_cache;

/* The build oracle: node a is decoded once, then each row is one pass of
 * the vectorized loop over its code (four rows a pass where there is one). */
static void bc_from(void *ctx, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    const struct bcodes *b = ctx;
    struct bc_from_cache *k = &bc_cache;
    if (b->pd > CACHED_DIMS) { /* rare: dimensions past 8192 */
        for (size_t i = 0; i < n; i++)
            out[i] = bc_pair(b, a, rows[i]);
        return;
    }
    if (k->serial != b->serial || k->a != a) {
        k->serial = b->serial;
        k->a = a;
        bc_decode(b, a, k->dec, k->w);
        memset(k->known, 0, b->ncentres);
    }
    for (size_t i = 0; i < n;) {
        float r[4];
        size_t take = b->row4 ? 4 : 1;
        if (b->row4) {
            const uint8_t *c[4];
            for (size_t t = 0; t < 4; t++) /* past n: row i again, its sum unused */
                c[t] = b->codes + (size_t)rows[i + t < n ? i + t : i] * b->width;
            b->row4(k->w, c, b->width, r);
        } else {
            r[0] = b->row(k->w, b->codes + (size_t)rows[i] * b->width, b->width);
        }
        for (size_t t = 0; t < take && i < n; t++, i++) {
            uint32_t row = rows[i], c = b->centre[row];
            if (!k->known[c]) {
                k->bias[c] = kd_kernels()->dot(k->dec, b->offset + (size_t)c * b->pd, b->pd);
                k->known[c] = 1;
            }
            float ip = k->bias[c] + r[t];
            out[i] = b->l2 ? b->norm[a] + b->norm[row] - 2 * ip : -ip;
        }
    }
}

/* ---- test hook */

static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double kd_merge_kernel_gap(uint32_t bits, uint32_t dim, int metric, uint64_t seed)
{
    enum { ROWS = 64, CENTRES = 3 };
    struct bcodes b = {0};
    double gap = -1;
    float *centres = calloc((size_t)CENTRES * dim, sizeof(float));
    if (!centres)
        goto out;
    for (size_t i = 0; i < (size_t)CENTRES * dim; i++)
        centres[i] = (float)((int64_t)(next_random(&seed) % 2001) - 1000) / 250.0f;
    if (bc_init(&b, bits, dim, metric, ROWS, CENTRES, centres, BC_SCALAR))
        goto out;
    for (uint32_t j = 0; j < dim; j++) {
        b.lo[j] = (float)((int64_t)(next_random(&seed) % 2001) - 1000) / 500.0f;
        b.step[j] = (float)(next_random(&seed) % 1000 + 1) / 4000.0f;
    }
    bc_offsets(&b);
    for (size_t i = 0; i < (size_t)ROWS * b.width; i++)
        b.codes[i] = (uint8_t)next_random(&seed);
    for (uint32_t r = 0; r < ROWS; r++) {
        b.centre[r] = (uint16_t)(next_random(&seed) % CENTRES);
        /* The padding of a code is zero, as bc_encode leaves it. */
        for (uint32_t j = dim; j < b.pd; j++) {
            uint8_t *c = b.codes + (size_t)r * b.width;
            if (bits == 8)
                c[j] = 0;
            else
                c[j % b.width] &= j < b.width ? 0xf0 : 0x0f;
        }
    }
    uint32_t rows[ROWS];
    float got[ROWS];
    for (uint32_t r = 0; r < ROWS; r++) {
        rows[r] = r;
        if (b.l2)
            bc_set_norm(&b, r);
    }
    gap = 0;
    for (int tier = BC_SCALAR; tier < BC_TIERS; tier++) {
        if (!bc_pick(&b, tier))
            continue; /* the CPU lacks it */
        for (uint32_t node = 0; node < ROWS; node++) {
            uint32_t n = ROWS - node % 4; /* every remainder of four-row loops */
            bc_from(&b, node, rows, n, got);
            for (uint32_t r = 0; r < n; r++) {
                /* Relative to the sum of the terms' sizes: decoded values
                 * of a few units cancel in differences and signed sums. */
                double size = 0;
                for (uint32_t t = 0; t < dim; t++) {
                    double u = fabs(bc_value(&b, node, t)), v = fabs(bc_value(&b, r, t));
                    size += b.l2 ? (u + v) * (u + v) : u * v;
                }
                double e = fabs(got[r] - bc_pair(&b, node, r)) / (size + 1e-30);
                gap = e > gap ? e : gap;
            }
        }
    }
out:
    bc_free(&b);
    free(centres);
    return gap;
}

/* ---- the merge */

struct input {
    struct kd_index *ix;
    uint32_t *to_out;        /* output row of each row; KD_NONE when removed */
    uint64_t live;           /* live rows */
    uint64_t lo_row, hi_row; /* [lo_row, hi_row) holds every live row */
    int same_quant;          /* search codes can be copied */
};

struct merge {
    const struct kd_merge_params *mp;
    struct input *in; /* in output order: the base first */
    size_t n;
    struct kd_index *out;
    /* The build codes: with 8 bits those insertion uses (one step for all
     * dimensions, an integer inner product); with 4, or dimensions past
     * KD_BCODE_MAX_DIM, residuals from the centres. */
    int uniform;
    struct kd_bcode kb;
    struct bcodes bc;
    struct kd_build_oracle o; /* graph distances over whichever holds them */
    float *sample;            /* fit, uniform: every sample_every-th output row */
    uint64_t sample_every;
    unsigned threads;
    uint64_t done, total;       /* progress */
    float *lo_part, *hi_part;   /* fit: per worker slot, dim each */
    double *sum_part, *sq_part; /* sums of values and of their squares */
    /* write: records gathered for the container writer */
    struct kd_container_writer *cw;
    uint8_t *wbuf;
    size_t wfill, wcap;
};

static int tick(struct merge *m, uint64_t units)
{
    m->done += units;
    if (m->mp->progress && m->mp->progress(m->mp->progress_arg, m->done, m->total))
        return kd_fail(-ECANCELED, "merge cancelled by its progress callback");
    return 0;
}

static unsigned threads_for(const struct merge *m, uint64_t rows)
{
    uint64_t t = (rows + ROWS_PER_THREAD - 1) / ROWS_PER_THREAD;
    return t < m->threads ? (t ? (unsigned)t : 1) : m->threads;
}

static uint64_t live_in(const struct input *in, uint64_t first, uint64_t n)
{
    uint64_t live = 0;
    for (uint64_t r = first; r < first + n; r++)
        live += in->to_out[r] != KD_NONE;
    return live;
}

/* fn gets the records of rows [first, first+n) of one input, `stride` bytes
 * apart, in order and in large chunks. */
typedef int (*chunk_fn)(struct merge *m, struct input *in, const uint8_t *rec, size_t stride,
                        uint64_t first, uint64_t n);

static int each_chunk(struct merge *m, struct input *in, chunk_fn fn)
{
    struct kd_index *ix = in->ix;
    if (!in->live)
        return 0;
    if (ix->vectors) {
        size_t stride = ix->record_bytes, chunk = CHUNK_BYTES / stride;
        chunk = chunk ? chunk : 1;
        int err = 0;
        for (uint64_t at = in->lo_row; !err && at < in->hi_row; at += chunk) {
            uint64_t k = in->hi_row - at < chunk ? in->hi_row - at : chunk;
            err = fn(m, in, (const uint8_t *)(ix->vectors + at * ix->p.dim), stride, at, k);
        }
        return err;
    }
    struct kd_vecio_stream *s = NULL;
    struct kd_io_counters io = {0};
    int err = kd_vecio_stream_open(ix->vio, in->lo_row, in->hi_row - in->lo_row, &s);
    while (!err) {
        const void *buf;
        uint64_t first;
        int64_t got = kd_vecio_stream_next(s, &buf, &first, &io);
        if (got <= 0) {
            err = (int)got;
            break;
        }
        err = fn(m, in, buf, ix->record_stride, first, (uint64_t)got);
    }
    kd_vecio_stream_close(s);
    struct kd_stats st = {0};
    st.read_ops = io.read_ops;
    st.read_bytes = io.read_bytes;
    st.io_wait_ns = io.wait_ns;
    kd_index_stats_add(ix, &st);
    return err;
}

/* ---- fit and encode: the two passes over the vectors */

struct pass_job {
    struct merge *m;
    struct input *in;
    const uint8_t *rec;
    size_t stride;
    uint64_t first, n, next;
    unsigned slot;
    int encode; /* 0: fit the ranges */
    int err;
};

/* The fit pass also encodes the search codes that cannot be copied: a
 * row's centre, which its build code is relative to, is in its search
 * code. */
static void *pass_worker(void *arg)
{
    struct pass_job *j = arg;
    struct merge *m = j->m;
    struct bcodes *bc = &m->bc;
    const struct kd_index *ix = j->in->ix;
    uint32_t d = ix->p.dim;
    int normalized = ix->metric->normalized, reencode = !j->encode && !j->in->same_quant;
    const struct kd_quant *q = &m->out->quant;
    size_t at = (size_t)__atomic_fetch_add(&j->slot, 1, __ATOMIC_RELAXED) * d;
    float *lo = m->uniform ? NULL : m->lo_part + at, *hi = m->uniform ? NULL : m->hi_part + at;
    double *sum = m->uniform ? NULL : m->sum_part + at, *sq = m->uniform ? NULL : m->sq_part + at;
    float *tmp = malloc(d * sizeof(float)), *res = malloc(d * sizeof(float)),
          *work = reencode ? malloc(q->pdim * sizeof(float)) : NULL;
    if (!tmp || !res || (reencode && !work)) {
        __atomic_store_n(&j->err, kd_fail(-ENOMEM, "out of memory while merging"),
                         __ATOMIC_RELAXED);
        goto out;
    }
    for (;;) {
        uint64_t i = __atomic_fetch_add(&j->next, 64, __ATOMIC_RELAXED);
        if (i >= j->n)
            break;
        uint64_t end = i + 64 < j->n ? i + 64 : j->n;
        for (; i < end; i++) {
            uint32_t o = j->in->to_out[j->first + i];
            if (o == KD_NONE)
                continue;
            const float *v = (const float *)(j->rec + i * j->stride);
            if (normalized) {
                float inv = kd_inv_norm(ix, v);
                for (uint32_t t = 0; t < d; t++)
                    tmp[t] = v[t] * inv;
                v = tmp;
            }
            uint8_t *code = m->out->codes + (size_t)o * q->code_size;
            if (reencode)
                kd_quant_encode(q, v, code,
                                q->refine_size ? m->out->refined + (size_t)o * q->refine_size
                                               : NULL,
                                work);
            if (m->uniform) {
                if (j->encode)
                    kd_bcode_encode(&m->kb, o, v, 1.0f);
                else if (o % m->sample_every == 0)
                    memcpy(m->sample + (size_t)(o / m->sample_every) * d, v, d * sizeof(float));
                continue;
            }
            if (!j->encode)
                bc->centre[o] = (uint16_t)kd_quant_centre_of(q, code);
            const float *c = bc->centres + (size_t)bc->centre[o] * d;
            for (uint32_t t = 0; t < d; t++)
                res[t] = v[t] - c[t];
            if (j->encode) {
                bc_encode(bc, res, bc->codes + (size_t)o * bc->width);
                if (bc->l2)
                    bc_set_norm(bc, o);
                continue;
            }
            for (uint32_t t = 0; t < d; t++) {
                lo[t] = res[t] < lo[t] ? res[t] : lo[t];
                hi[t] = res[t] > hi[t] ? res[t] : hi[t];
                sum[t] += res[t];
                sq[t] += (double)res[t] * res[t];
            }
        }
    }
out:
    free(tmp);
    free(res);
    free(work);
    return NULL;
}

static int pass_chunk(struct merge *m, struct input *in, const uint8_t *rec, size_t stride,
                      uint64_t first, uint64_t n, int encode)
{
    struct pass_job j = {m, in, rec, stride, first, n, 0, 0, encode, 0};
    kd_run_workers(pass_worker, &j, threads_for(m, n));
    return j.err ? j.err : tick(m, live_in(in, first, n));
}

static int fit_chunk(struct merge *m, struct input *in, const uint8_t *rec, size_t stride,
                     uint64_t first, uint64_t n)
{
    return pass_chunk(m, in, rec, stride, first, n, 0);
}

static int encode_chunk(struct merge *m, struct input *in, const uint8_t *rec, size_t stride,
                        uint64_t first, uint64_t n)
{
    return pass_chunk(m, in, rec, stride, first, n, 1);
}

/* 8-bit build codes span each dimension's extremes (of the residuals).
 * Sixteen levels spread over the extremes are coarse where the values crowd
 * (measured: recall at small ef 0.01 to 0.04 under a fresh build's), so
 * 4-bit ones span the mean plus or minus CLIP_SIGMAS standard deviations
 * (within the extremes), and the few values outside are clamped. Coding
 * residuals rather than vectors (two halves of 100k x 768 clustered, 4
 * bits): recall@10's gap to the in-RAM build went from 0.008 to 0.002 at
 * the default search, from 0.022 to none at ef 24. */
#define CLIP_SIGMAS 2.5

/* The ranges of the build codes from what every worker slot gathered over
 * `rows` vectors. */
static void fit_ranges(struct merge *m, uint64_t rows)
{
    struct bcodes *b = &m->bc;
    float top = (float)((1u << b->bits) - 1);
    for (uint32_t t = 0; t < b->dim; t++) {
        float lo = INFINITY, hi = -INFINITY;
        double sum = 0, sq = 0;
        for (unsigned s = 0; s < m->threads; s++) {
            size_t at = (size_t)s * b->dim + t;
            lo = m->lo_part[at] < lo ? m->lo_part[at] : lo;
            hi = m->hi_part[at] > hi ? m->hi_part[at] : hi;
            sum += m->sum_part[at];
            sq += m->sq_part[at];
        }
        if (!(lo <= hi))
            lo = hi = 0;
        if (b->bits == 4 && rows) {
            double mean = sum / (double)rows, var = sq / (double)rows - mean * mean;
            double reach = CLIP_SIGMAS * (var > 0 ? sqrt(var) : 0);
            if (mean - reach > lo)
                lo = (float)(mean - reach);
            if (mean + reach < hi)
                hi = (float)(mean + reach);
        }
        b->lo[t] = lo;
        b->step[t] = hi > lo ? (hi - lo) / top : 1.0f;
    }
}

static void uniform_from(void *ctx, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    kd_bcode_from(ctx, a, rows, n, out);
}

/* What the fit pass gathers: with 8 bits (and dimensions
 * KD_BCODE_MAX_DIM at most), every sample_every-th output row, at most
 * KD_BCODE_FIT_SAMPLE of them, as an add fits insertion's codes; else
 * per worker slot, each dimension's range, sum and sum of squares. */
static int start_fit(struct merge *m, uint32_t bits, uint64_t total)
{
    uint32_t d = m->out->p.dim;
    m->uniform = bits == 8 && kd_bcode_row_bytes(d) > 0;
    if (m->uniform) {
        /* At most a quarter of the rows: the sample's float32 vectors then
         * take no more memory than the codes allocated after it is freed. */
        uint64_t want = total / 4 < KD_BCODE_FIT_SAMPLE ? total / 4 : KD_BCODE_FIT_SAMPLE;
        m->sample_every = (total + (want ? want : 1) - 1) / (want ? want : 1);
        m->sample = malloc((total + m->sample_every - 1) / m->sample_every * d * sizeof(float));
        return m->sample ? 0 : kd_fail(-ENOMEM, "out of memory while merging");
    }
    int err = bc_init(&m->bc, bits, d, m->out->p.metric, total, m->out->quant.ncentres,
                      m->out->quant.centres, BC_BEST);
    if (err)
        return err;
    m->lo_part = malloc((size_t)m->threads * d * sizeof(float));
    m->hi_part = malloc((size_t)m->threads * d * sizeof(float));
    m->sum_part = calloc((size_t)m->threads * d, sizeof(double));
    m->sq_part = calloc((size_t)m->threads * d, sizeof(double));
    if (!m->lo_part || !m->hi_part || !m->sum_part || !m->sq_part)
        return kd_fail(-ENOMEM, "out of memory while merging");
    for (size_t i = 0; i < (size_t)m->threads * d; i++) {
        m->lo_part[i] = INFINITY;
        m->hi_part[i] = -INFINITY;
    }
    return 0;
}

/* The build codes fitted to what the fit pass gathered, room for every row,
 * and the graph's distances over them. */
static int end_fit(struct merge *m, uint64_t total)
{
    if (!m->uniform) {
        fit_ranges(m, total);
        bc_offsets(&m->bc);
        m->o = (struct kd_build_oracle){bc_from, &m->bc, NULL, NULL};
        return 0;
    }
    uint64_t samples = (total + m->sample_every - 1) / m->sample_every;
    int err = kd_bcode_fit(&m->kb, m->out->p.dim, m->out->p.metric == KD_L2, m->sample, NULL,
                           samples);
    free(m->sample);
    m->sample = NULL;
    if (!err)
        err = kd_bcode_reserve(&m->kb, total);
    m->o = (struct kd_build_oracle){uniform_from, &m->kb, NULL, NULL};
    return err;
}

/* ---- the graph */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_item(const void *a, const void *b)
{
    const struct kd_heap_item *x = a, *y = b;
    return (x->dist > y->dist) - (x->dist < y->dist);
}

/* A neighbour a repair gave node `from` at `level`: `to` is to link back. */
struct new_edge {
    uint32_t to, from, level;
};

/* New edges, grown as needed. */
struct edge_list {
    struct new_edge *e;
    size_t n, cap;
};

static int edges_add(struct edge_list *l, const struct new_edge *e, size_t n)
{
    if (l->n + n > l->cap) {
        size_t cap = 2 * (l->n + n) + 256;
        struct new_edge *g = realloc(l->e, cap * sizeof *g);
        if (!g)
            return kd_fail(-ENOMEM, "out of memory while merging");
        l->e = g;
        l->cap = cap;
    }
    memcpy(l->e + l->n, e, n * sizeof *e);
    l->n += n;
    return 0;
}

struct repair_job {
    struct merge *m;
    uint64_t first, last, next; /* base rows */
    uint64_t repaired;
    uint32_t *thin; /* nodes to reconnect */
    uint64_t nthin;
    int err;
    pthread_mutex_t lock; /* guards edges */
    struct edge_list edges;
};

/* Scratch of one repair worker, for lists of up to cap neighbours. */
struct repair_scratch {
    uint32_t *cand;
    float *dist;
    struct kd_heap_item *items;
    size_t cap;
    uint32_t *survivors; /* of the list being repaired, ascending */
    struct edge_list edges;
};

/* Node p (base row o) lost neighbours at `level`. Its surviving neighbours
 * all stay: about half of an HNSW list is other nodes' choices linked
 * back, which p's own diversity rule would not pick again. Candidates: the
 * live neighbours of the ones it lost (the consolidation of FreshDiskANN).
 * Walked nearest first, the survivors among them, a candidate joins when
 * it is closer to p than to every neighbour kept before it (insertion's
 * diversity rule) and the list has room, and links back to p as
 * insertion's choices do (recorded in rs->edges, made by link_back_all
 * once every list is copied). The nearest of the others then fill the list
 * up to the length it had, without linking back: that would add an edge a
 * repair, round after round (measured: degree 17.9 where a fresh build has
 * 15, and no more recall for the same number of distances).
 *
 * Measured on tests/test_collection_rot.py's data (8000 x 32; recall at
 * ef=16, oversample=2 against fresh graphs over the same quantizer, 2000
 * queries). The rule before, the list rebuilt as the diverse choice of
 * survivors and candidates then filled, with no link back, lost 0.03 in 12
 * rounds of 2% removed and 0.04 in 50 rounds of 2% removed and 2% added:
 * survivors dropped and one-way new edges made the graph lopsided (of the
 * edges, those whose target links back fell from 0.93 to 0.65; nodes of
 * in-degree 4 or less tripled), and searching anew for every repaired node
 * (kd_graph_reconnect) won back half of it at eight times the cost. With
 * this rule: within 0.004 of the fresh graphs after 12, 50 and 150 rounds,
 * in-degrees as a fresh build's, no cost added. Without the fill, a base
 * that lost 40% of its rows at once ends 0.016 under its own search
 * through tombstones (tests/test_merge.py). Returns nonzero when out of
 * memory. */
static int repair_list(struct merge *m, uint32_t o, uint32_t p, int level, const uint32_t *src,
                       uint32_t *dst, struct repair_scratch *rs)
{
    const struct input *b = &m->in[0];
    const struct kd_graph *bg = &b->ix->graph;
    uint32_t cap = level == 0 ? bg->m0 : bg->m, had = src[0] < cap ? src[0] : cap;
    size_t n = dst[0], survivors = n;
    memcpy(rs->cand, dst + 1, n * sizeof(uint32_t));
    memcpy(rs->survivors, dst + 1, n * sizeof(uint32_t));
    qsort(rs->survivors, survivors, sizeof(uint32_t), cmp_u32);
    for (uint32_t i = 0; i < had; i++) {
        uint32_t x = src[1 + i];
        if (b->to_out[x] != KD_NONE || bg->levels[x] < level)
            continue;
        const uint32_t *xl = kd_graph_list(bg, x, level);
        for (uint32_t t = 0; t < xl[0] && t < cap; t++) {
            uint32_t y = xl[1 + t];
            if (y != o && b->to_out[y] != KD_NONE)
                rs->cand[n++] = b->to_out[y];
        }
    }
    qsort(rs->cand, n, sizeof(uint32_t), cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || rs->cand[i] != rs->cand[u - 1])
            rs->cand[u++] = rs->cand[i];
    m->o.from(m->o.ctx, p, rs->cand, u, rs->dist);
    for (size_t i = 0; i < u; i++)
        rs->items[i] = (struct kd_heap_item){rs->dist[i], rs->cand[i]};
    qsort(rs->items, u, sizeof *rs->items, cmp_item);
    uint32_t k = 0, room = cap - (uint32_t)survivors, *kept = dst + 1;
    int err = 0;
    for (size_t i = 0; i < u; i++) {
        struct kd_heap_item c = rs->items[i];
        if (bsearch(&c.row, rs->survivors, survivors, sizeof(uint32_t), cmp_u32)) {
            kept[k++] = c.row;
            continue;
        }
        if (!room)
            continue;
        /* Four kept neighbours a pass, stopping at the first closer one. */
        int good = 1;
        float d[4];
        for (uint32_t j = 0; j < k && good; j += 4) {
            uint32_t w = k - j < 4 ? k - j : 4;
            m->o.from(m->o.ctx, c.row, kept + j, w, d);
            for (uint32_t t = 0; t < w; t++)
                good &= d[t] >= c.dist;
        }
        if (good) {
            struct new_edge e = {c.row, p, (uint32_t)level};
            kept[k++] = c.row;
            room--;
            if ((err = edges_add(&rs->edges, &e, 1)))
                break;
        }
    }
    /* The fill: the nearest candidates not kept, up to the old length. The
     * kept ones are in the candidates' order, so one cursor tells them
     * apart. */
    uint32_t chosen = k;
    for (size_t i = 0, t = 0; i < u && k < had; i++) {
        if (t < chosen && kept[t] == rs->items[i].row)
            t++;
        else
            kept[k++] = rs->items[i].row;
    }
    dst[0] = k;
    return err;
}

/* Copy base row o's lists to its output node, renumbered; repair those that
 * lost a neighbour. Returns 1 when it repaired one, or a negative errno. */
static int copy_node(struct merge *m, uint32_t o, struct repair_scratch *rs, int *thin)
{
    const struct input *b = &m->in[0];
    const struct kd_graph *bg = &b->ix->graph;
    struct kd_graph *g = &m->out->graph;
    uint32_t p = b->to_out[o];
    int top = bg->levels[o], repaired = 0;
    g->levels[p] = (uint8_t)top;
    g->locks[p] = 0;
    if (top && !(g->upper[p] = calloc((size_t)top * (1 + g->m), sizeof(uint32_t))))
        return kd_fail(-ENOMEM, "out of memory for the graph");
    *thin = 0;
    for (int level = 0; level <= top; level++) {
        uint32_t cap = level == 0 ? g->m0 : g->m;
        const uint32_t *src = kd_graph_list(bg, o, level);
        uint32_t *dst = kd_graph_list(g, p, level), k = 0, lost = 0;
        for (uint32_t i = 0; i < src[0] && i < cap; i++) {
            uint32_t y = b->to_out[src[1 + i]];
            if (y == KD_NONE)
                lost++;
            else
                dst[1 + k++] = y;
        }
        dst[0] = k;
        if (lost) {
            int err = repair_list(m, o, p, level, src, dst, rs);
            if (err)
                return err;
            repaired = 1;
            if (level == 0 && dst[0] < g->m / 2 && dst[0] < src[0])
                *thin = 1;
        }
    }
    return repaired;
}

static void *repair_worker(void *arg)
{
    struct repair_job *j = arg;
    struct merge *m = j->m;
    const struct input *b = &m->in[0];
    uint32_t m0 = m->out->graph.m0;
    struct repair_scratch rs;
    rs.cap = m0 + (size_t)m0 * m0;
    rs.cand = malloc(rs.cap * sizeof *rs.cand);
    rs.dist = malloc(rs.cap * sizeof *rs.dist);
    rs.items = malloc(rs.cap * sizeof *rs.items);
    rs.survivors = malloc(m0 * sizeof *rs.survivors);
    rs.edges = (struct edge_list){0};
    uint64_t repaired = 0;
    int err = rs.cand && rs.dist && rs.items && rs.survivors
                  ? 0
                  : kd_fail(-ENOMEM, "out of memory while merging");
    while (!err && !__atomic_load_n(&j->err, __ATOMIC_RELAXED)) {
        uint64_t i = __atomic_fetch_add(&j->next, 64, __ATOMIC_RELAXED);
        if (i >= j->last)
            break;
        uint64_t end = i + 64 < j->last ? i + 64 : j->last;
        for (; i < end && !err; i++) {
            if (b->to_out[i] == KD_NONE)
                continue;
            int thin = 0, r = copy_node(m, (uint32_t)i, &rs, &thin);
            if (r < 0)
                err = r;
            repaired += r > 0;
            if (thin)
                j->thin[__atomic_fetch_add(&j->nthin, 1, __ATOMIC_RELAXED)] = b->to_out[i];
        }
    }
    if (!err && rs.edges.n) {
        pthread_mutex_lock(&j->lock);
        err = edges_add(&j->edges, rs.edges.e, rs.edges.n);
        pthread_mutex_unlock(&j->lock);
    }
    if (err)
        __atomic_store_n(&j->err, err, __ATOMIC_RELAXED);
    __atomic_fetch_add(&j->repaired, repaired, __ATOMIC_RELAXED);
    free(rs.cand);
    free(rs.dist);
    free(rs.items);
    free(rs.survivors);
    free(rs.edges.e);
    return NULL;
}

static int cmp_edge(const void *a, const void *b)
{
    const struct new_edge *x = a, *y = b;
    if (x->level != y->level)
        return (x->level > y->level) - (x->level < y->level);
    if (x->to != y->to)
        return (x->to > y->to) - (x->to < y->to);
    return (x->from > y->from) - (x->from < y->from);
}

/* The links back of the repairs' new edges. Sorted by level and target, a
 * worker takes every edge into one list at once, so the outcome depends on
 * neither the workers' order nor their number. A list that overflows keeps
 * its diverse choice, as insertion prunes one. */
struct link_job {
    struct merge *m;
    const struct new_edge *edges;
    const size_t *starts; /* list i gains edges[starts[i] .. starts[i + 1]) */
    size_t lists, next;
    int err;
};

static void *link_worker(void *arg)
{
    struct link_job *j = arg;
    struct merge *m = j->m;
    struct kd_graph *g = &m->out->graph;
    size_t cap = 0;
    uint32_t *rows = NULL;
    float *dist = NULL;
    struct kd_heap_item *items = NULL;
    for (;;) {
        size_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->lists)
            break;
        const struct new_edge *e = j->edges + j->starts[i];
        size_t ne = j->starts[i + 1] - j->starts[i];
        uint32_t y = e->to, lcap = e->level ? g->m : g->m0;
        uint32_t *l = kd_graph_list(g, y, (int)e->level), n = l[0];
        if (n + ne > cap) {
            cap = 2 * (n + ne);
            free(rows);
            free(dist);
            free(items);
            rows = malloc(cap * sizeof *rows);
            dist = malloc(cap * sizeof *dist);
            items = malloc(cap * sizeof *items);
            if (!rows || !dist || !items) {
                __atomic_store_n(&j->err, kd_fail(-ENOMEM, "out of memory while merging"),
                                 __ATOMIC_RELAXED);
                break;
            }
        }
        memcpy(rows, l + 1, n * sizeof *rows);
        for (size_t t = 0; t < ne; t++) {
            uint32_t x = 0;
            while (x < l[0] && l[1 + x] != e[t].from)
                x++;
            if (x == l[0])
                rows[n++] = e[t].from;
        }
        if (n <= lcap) {
            memcpy(l + 1, rows, n * sizeof *rows);
            l[0] = n;
            continue;
        }
        m->o.from(m->o.ctx, y, rows, n, dist);
        for (uint32_t t = 0; t < n; t++)
            items[t] = (struct kd_heap_item){dist[t], rows[t]};
        qsort(items, n, sizeof *items, cmp_item);
        l[0] = (uint32_t)kd_graph_select(&m->o, items, n, lcap, l + 1);
    }
    free(rows);
    free(dist);
    free(items);
    return NULL;
}

static int link_back_all(struct merge *m, struct edge_list *edges)
{
    if (!edges->n)
        return 0;
    qsort(edges->e, edges->n, sizeof *edges->e, cmp_edge);
    size_t *starts = malloc((edges->n + 1) * sizeof *starts), lists = 0;
    if (!starts)
        return kd_fail(-ENOMEM, "out of memory while merging");
    for (size_t i = 0; i < edges->n; i++)
        if (!i || edges->e[i].to != edges->e[i - 1].to ||
            edges->e[i].level != edges->e[i - 1].level)
            starts[lists++] = i;
    starts[lists] = edges->n;
    struct link_job j = {m, edges->e, starts, lists, 0, 0};
    kd_run_workers(link_worker, &j, threads_for(m, lists));
    free(starts);
    return j.err;
}

/* The base's graph, renumbered and repaired; its entry point. */
static int reuse_graph(struct merge *m, struct kd_merge_report *rep)
{
    const struct input *b = &m->in[0];
    const struct kd_graph *bg = &b->ix->graph;
    struct kd_graph *g = &m->out->graph;
    struct repair_job j = {m, 0, 0, 0, 0, malloc((b->live ? b->live : 1) * sizeof(uint32_t)), 0, 0};
    if (!j.thin)
        return kd_fail(-ENOMEM, "out of memory while merging");
    pthread_mutex_init(&j.lock, NULL);
    int err = 0;
    for (uint64_t at = b->lo_row; !err && at < b->hi_row; at += GRAPH_STEP) {
        j.next = at;
        j.last = b->hi_row - at < GRAPH_STEP ? b->hi_row : at + GRAPH_STEP;
        kd_run_workers(repair_worker, &j, threads_for(m, j.last - at));
        err = j.err ? j.err : tick(m, live_in(b, at, j.last - at));
    }
    pthread_mutex_destroy(&j.lock);
    if (!err)
        err = link_back_all(m, &j.edges);
    free(j.edges.e);
    if (err) {
        free(j.thin);
        return err;
    }
    rep->nodes_repaired = j.repaired;
    /* The entry: the base's, unless it was removed or a live node stands
     * higher; else the first live node of the highest level. */
    int top = -1;
    uint32_t entry = KD_NONE;
    for (uint64_t p = 0; p < b->live; p++)
        if ((int)g->levels[p] > top) {
            top = g->levels[p];
            entry = (uint32_t)p;
        }
    if (bg->entry != KD_NONE && b->to_out[bg->entry] != KD_NONE &&
        (int)bg->levels[bg->entry] == top)
        entry = b->to_out[bg->entry];
    g->entry = entry;
    g->max_level = top;
    g->count = b->live;
    /* Lists left thin at level 0 are searched for anew, in node order (the
     * workers above found them in any order). */
    qsort(j.thin, j.nthin, sizeof(uint32_t), cmp_u32);
    if (j.nthin && g->entry != KD_NONE)
        err = kd_graph_reconnect(g, j.thin, j.nthin, m->out->p.ef_construction, &m->o, m->threads);
    rep->nodes_reconnected = j.nthin;
    free(j.thin);
    return err;
}

/* A row's decoded build code, for insertion's 1-bit beam: the vectors
 * themselves are not in memory. */
static const float *decoded_row(const void *ctx, uint32_t a, float *scratch)
{
    const struct merge *m = ctx;
    if (m->uniform)
        kd_bcode_decode(&m->kb, a, scratch);
    else
        bc_decode(&m->bc, a, scratch, scratch + m->bc.pd);
    return scratch;
}

/* The other inputs' rows. Their levels are drawn from their ids, not their
 * row numbers: a collection's merges append new rows at the same row
 * numbers round after round, and levels drawn from those repeated one
 * pattern (measured after 50 rounds of 2%: 430 of 8000 nodes above level 0
 * and 44 above level 1, where 500 and 31 are due; drawn from ids, 511 and
 * 27). A narrower beam for rows started next to their neighbours from
 * their own input's graph (the join set of Lucene #14527) was measured and
 * dropped: from the beam insertion uses, it saved nothing; at a third of
 * it, it lost 0.04 of recall@10 on 32-dim data. */
static int insert_rest(struct merge *m, uint64_t first, uint64_t total)
{
    struct kd_graph *g = &m->out->graph;
    int err = kd_graph_prepare_keyed(g, first, total, m->mp->seed,
                                     (const uint64_t *)(m->out->ids + first));
    uint32_t d = m->out->p.dim;
    struct kd_beam_source src = {m->out, decoded_row, m, m->uniform ? d : 2 * (size_t)m->bc.pd};
    struct kd_build_oracle o = m->o;
    if (kd_beam_pays(m->out, total * kd_merge_row_bytes(m->uniform ? 8 : m->bc.bits, d)) ||
        kd_beam_spread(&src, first, total)) {
        o.beam = &kd_beam_1bit;
        o.beam_ctx = &src;
    }
    /* The nodes with upper levels in a seeded random order, then the rest
     * by row, a centre at a time as the inputs' rows lie (design.md,
     * "Insertion order"). */
    uint32_t *order = err ? NULL : malloc((total - first) * sizeof *order);
    if (!err && !order)
        err = kd_fail(-ENOMEM, "out of memory ordering the merge's insertions");
    uint64_t rng = m->mp->seed ^ 0x6f726465726564ull;
    for (uint64_t i = 0; !err && i < total - first; i++) {
        uint64_t j = next_random(&rng) % (i + 1);
        order[i] = order[j];
        order[j] = (uint32_t)(first + i);
    }
    if (!err)
        kd_graph_skeleton_first(g, first, total - first, order);
    for (uint64_t at = first; !err && at < total; at += GRAPH_STEP) {
        uint64_t last = total - at < GRAPH_STEP ? total : at + GRAPH_STEP;
        err = kd_graph_insert_range(g, at, last, order + (at - first), m->out->p.ef_construction,
                                    &o, m->threads);
        if (!err)
            err = tick(m, last - at);
    }
    free(order);
    return err;
}

/* ---- writing */

/* The output's vector source: its records come from the inputs. */
struct merge_source {
    struct kd_vsource vs; /* first: the index's src points here */
    struct merge *m;
};

static int flush_records(struct merge *m)
{
    if (!m->wfill)
        return 0;
    int err = kd_cw_write(m->cw, m->wbuf, m->wfill * m->out->record_stride);
    if (!err)
        err = tick(m, m->wfill);
    m->wfill = 0;
    return err;
}

static int write_chunk(struct merge *m, struct input *in, const uint8_t *rec, size_t stride,
                       uint64_t first, uint64_t n)
{
    size_t bytes = m->out->record_bytes, out_stride = m->out->record_stride;
    int err = 0;
    for (uint64_t i = 0; i < n && !err; i++) {
        if (in->to_out[first + i] == KD_NONE)
            continue;
        memcpy(m->wbuf + m->wfill * out_stride, rec + i * stride, bytes);
        if (++m->wfill == m->wcap)
            err = flush_records(m);
    }
    return err;
}

static int save_vectors(struct kd_index *ix, struct kd_container_writer *cw)
{
    struct merge *m = ((const struct merge_source *)ix->src)->m;
    size_t stride = ix->record_stride;
    m->wcap = WRITE_BYTES / stride ? WRITE_BYTES / stride : 1;
    /* Zeroed once: the padding of every record stays zero. */
    if (!(m->wbuf = kd_alloc_aligned(64, m->wcap * stride)))
        return kd_fail(-ENOMEM, "out of memory while merging");
    memset(m->wbuf, 0, m->wcap * stride);
    m->cw = cw;
    m->wfill = 0;
    int err = 0;
    for (size_t i = 0; i < m->n && !err; i++)
        err = each_chunk(m, &m->in[i], write_chunk);
    if (!err)
        err = flush_records(m);
    kd_free_aligned(m->wbuf);
    m->wbuf = NULL;
    return err;
}

static int emit(void *arg, struct kd_writer *w) { return kd_index_save(arg, w); }

/* ---- setup */

static int check_inputs(struct kd_index **in, size_t n, const struct kd_index *quantizer)
{
    if (!n)
        return kd_fail(-EINVAL, "merge needs at least one index");
    const struct kd_index_params *p = &in[0]->p;
    if (quantizer) {
        const struct kd_index_params *q = &quantizer->p;
        if (q->dim != p->dim || q->metric != p->metric || q->quantization != p->quantization)
            return kd_fail(-EINVAL,
                           "the merge's quantizer (dim %u, %s, %s) does not fit its inputs "
                           "(dim %u, %s, %s)",
                           q->dim, kd_metric(q->metric)->name,
                           kd_quantization_name(q->quantization), p->dim,
                           kd_metric(p->metric)->name, kd_quantization_name(p->quantization));
        if (!quantizer->trained)
            return kd_fail(-EINVAL, "the merge's quantizer is not trained");
    }
    for (size_t i = 0; i < n; i++) {
        const struct kd_index_params *q = &in[i]->p;
        for (size_t k = 0; k < i; k++)
            if (in[k] == in[i])
                return kd_fail(-EINVAL, "merge got the same index twice (inputs %zu and %zu)", k,
                               i);
        if (q->dim != p->dim)
            return kd_fail(-EINVAL, "cannot merge indexes of dim %u and %u (inputs 0 and %zu)",
                           p->dim, q->dim, i);
        if (q->metric != p->metric)
            return kd_fail(-EINVAL, "cannot merge %s and %s indexes (inputs 0 and %zu)",
                           kd_metric(p->metric)->name, kd_metric(q->metric)->name, i);
        if (q->quantization != p->quantization)
            return kd_fail(-EINVAL, "cannot merge %s and %s quantization (inputs 0 and %zu)",
                           kd_quantization_name(p->quantization),
                           kd_quantization_name(q->quantization), i);
        if (q->m != p->m)
            return kd_fail(-EINVAL, "cannot merge graphs of m=%u and m=%u (inputs 0 and %zu)", p->m,
                           q->m, i);
    }
    return 0;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (struct kd_index *const *)a,
              y = (uintptr_t) * (struct kd_index *const *)b;
    return (x > y) - (x < y);
}

/* Live rows, their output rows and where they lie, per input; checks that
 * no id is live twice. Returns the total through *total. */
static int map_rows(struct merge *m, uint64_t *total)
{
    uint64_t next = 0;
    for (size_t i = 0; i < m->n; i++) {
        struct input *in = &m->in[i];
        struct kd_index *ix = in->ix;
        in->to_out = malloc((ix->count ? ix->count : 1) * sizeof(uint32_t));
        if (!in->to_out)
            return kd_fail(-ENOMEM, "out of memory while merging");
        in->lo_row = ix->count;
        for (uint64_t r = 0; r < ix->count; r++) {
            if (ix->deleted[r]) {
                in->to_out[r] = KD_NONE;
                continue;
            }
            if (next >= UINT32_MAX - 1)
                return kd_fail(-EOVERFLOW, "an index holds at most %u vectors", UINT32_MAX - 1);
            in->to_out[r] = (uint32_t)next++;
            in->lo_row = in->live++ ? in->lo_row : r;
            in->hi_row = r + 1;
        }
    }
    *total = next;
    struct kd_idmap ids;
    int err = kd_idmap_init(&ids, next);
    for (size_t i = 0; i < m->n && !err; i++) {
        const struct input *in = &m->in[i];
        for (uint64_t r = in->lo_row; r < in->hi_row && !err; r++)
            if (in->to_out[r] != KD_NONE && kd_idmap_put(&ids, in->ix->ids[r], in->to_out[r]))
                err = kd_fail(-EEXIST, "id %lld is live in more than one of the merged indexes",
                              (long long)in->ix->ids[r]);
    }
    kd_idmap_free(&ids);
    return err;
}

/* The output index: the base's parameters, the caller's quantizer or else
 * the base's, its arrays sized for total rows, ids and copied codes filled
 * in. */
static int make_output(struct merge *m, uint64_t total)
{
    struct kd_index *base = m->in[0].ix, *out = NULL;
    int err = kd_index_alloc(&out, &base->p);
    if (err)
        return err;
    m->out = out;
    const struct kd_quant *quant = m->mp->quantizer ? &m->mp->quantizer->quant : &base->quant;
    if ((err = kd_quant_copy(&out->quant, quant)))
        return err;
    out->estimate = kd_estimator(&out->quant);
    out->refine = kd_refiner(&out->quant);
    out->trained = 1;
    out->record_stride = base->record_stride;
    uint64_t rows = total ? total : 1;
    size_t cs = out->quant.code_size, rs = out->quant.refine_size;
    out->ids = malloc(rows * sizeof(int64_t));
    out->codes = kd_alloc_aligned(KD_CODE_ALIGN, rows * cs);
    out->refined = rs ? malloc(rows * rs) : NULL;
    out->deleted = calloc(rows, 1);
    if (!out->ids || !out->codes || (rs && !out->refined) || !out->deleted ||
        kd_graph_reserve(&out->graph, rows))
        return kd_fail(-ENOMEM, "out of memory for the merged index (%llu rows)",
                       (unsigned long long)total);
    memset(out->graph.upper, 0, rows * sizeof(uint32_t *));
    /* Unused list slots are written to the file too: zero, not heap left-overs. */
    memset(out->graph.level0, 0, rows * (1 + out->graph.m0) * sizeof(uint32_t));
    out->graph.count = total; /* so that freeing it frees every upper list */
    out->count = out->cap = out->live = total;
    for (size_t i = 0; i < m->n; i++) {
        struct input *in = &m->in[i];
        struct kd_index *ix = in->ix;
        in->same_quant = kd_quant_equal(&ix->quant, quant);
        for (uint64_t r = in->lo_row; r < in->hi_row; r++) {
            uint32_t o = in->to_out[r];
            if (o == KD_NONE)
                continue;
            out->ids[o] = ix->ids[r];
            if (!in->same_quant)
                continue;
            memcpy(out->codes + (size_t)o * cs, ix->codes + (size_t)r * cs, cs);
            if (rs)
                memcpy(out->refined + (size_t)o * rs, ix->refined + (size_t)r * rs, rs);
        }
    }
    return 0;
}

static double secs_since(uint64_t t0) { return (double)(kd_now_ns() - t0) * 1e-9; }

static int run(struct merge *m, const char *path, struct kd_merge_report *rep)
{
    uint64_t t0 = kd_now_ns(), t, total = 0;
    int err = map_rows(m, &total);
    if (!err)
        err = make_output(m, total);
    if (err)
        return err;
    for (size_t i = 0; i < m->n; i++)
        rep->codes_reencoded += m->in[i].same_quant ? 0 : m->in[i].live;
    m->total = 4 * total;
    if ((err = tick(m, 0)))
        return err;
    uint32_t d = m->out->p.dim;
    if (total) {
        uint64_t budget = m->mp->memory_budget;
        uint32_t bits = !budget || total * kd_merge_row_bytes(8, d) <= budget ? 8 : 4;
        rep->build_code_bits = bits;
        if ((err = start_fit(m, bits, total)))
            return err;
        t = kd_now_ns();
        for (size_t i = 0; i < m->n && !err; i++)
            err = each_chunk(m, &m->in[i], fit_chunk);
        if (err || (err = end_fit(m, total)))
            return err;
        rep->fit_seconds = secs_since(t);
        t = kd_now_ns();
        for (size_t i = 0; i < m->n && !err; i++)
            err = each_chunk(m, &m->in[i], encode_chunk);
        rep->encode_seconds = secs_since(t);
        if (err)
            return err;
        t = kd_now_ns();
        if ((err = reuse_graph(m, rep)))
            return err;
        rep->repair_seconds = secs_since(t);
        t = kd_now_ns();
        err = insert_rest(m, m->in[0].live, total);
        m->out->graph.count = total;
        rep->insert_seconds = secs_since(t);
        if (err)
            return err;
    }
    rep->rows_written = total;
    rep->rows_reused = m->in[0].live;
    rep->rows_inserted = total - m->in[0].live;
    /* The build codes are done with: the write needs only stream buffers. */
    bc_free(&m->bc);
    kd_bcode_free(&m->kb);
    t = kd_now_ns();
    struct merge_source src = {kd_vsource_memory, m};
    src.vs.name = "merge";
    src.vs.save = save_vectors;
    m->out->src = &src.vs;
    err = kd_save_atomic(path, emit, m->out);
    m->out->src = &kd_vsource_memory;
    rep->write_seconds = secs_since(t);
    rep->total_seconds = secs_since(t0);
    return err;
}

int kd_merge(const char *path, struct kd_index **in, size_t n, const struct kd_merge_params *mp,
             struct kd_merge_report *rep)
{
    struct kd_merge_report local;
    rep = rep ? rep : &local;
    memset(rep, 0, sizeof *rep);
    int err = check_inputs(in, n, mp->quantizer);
    if (err)
        return err;
    /* Read locks in address order, so that two merges never wait on each
     * other; the quantizer's too, unless it is an input. */
    struct kd_index **locked = malloc((n + 1) * sizeof *locked);
    struct merge m = {0};
    m.in = calloc(n, sizeof *m.in);
    if (!locked || !m.in) {
        free(locked);
        free(m.in);
        return kd_fail(-ENOMEM, "out of memory");
    }
    size_t nlocked = n;
    memcpy(locked, in, n * sizeof *locked);
    int quantizer_is_input = 0;
    for (size_t i = 0; i < n; i++)
        quantizer_is_input |= in[i] == mp->quantizer;
    if (mp->quantizer && !quantizer_is_input)
        locked[nlocked++] = mp->quantizer;
    qsort(locked, nlocked, sizeof *locked, cmp_ptr);
    for (size_t i = 0; i < nlocked; i++)
        pthread_rwlock_rdlock(&locked[i]->lock);
    /* The base: the most live rows, the first of equals. */
    size_t base = 0;
    for (size_t i = 1; i < n; i++)
        if (in[i]->live > in[base]->live)
            base = i;
    m.in[0].ix = in[base];
    for (size_t i = 0, k = 1; i < n; i++)
        if (i != base)
            m.in[k++].ix = in[i];
    m.n = n;
    m.mp = mp;
    m.threads = kd_resolve_threads(mp->threads);
    m.threads = m.threads > 256 ? 256 : m.threads;
    rep->base = (uint32_t)base;
    err = run(&m, path, rep);
    for (size_t i = 0; i < nlocked; i++)
        pthread_rwlock_unlock(&locked[i]->lock);
    for (size_t i = 0; i < n; i++)
        free(m.in[i].to_out);
    kd_index_free(m.out);
    bc_free(&m.bc);
    kd_bcode_free(&m.kb);
    free(m.sample);
    free(m.lo_part);
    free(m.hi_part);
    free(m.sum_part);
    free(m.sq_part);
    free(m.in);
    free(locked);
    return err;
}

#include "quant.h"
#include "common.h"
#include "distance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* A 1-bit estimate errs by about 1/sqrt(bits) of the distances it weighs:
 * at 256 bits or fewer the shortlist a recall needs costs more than codes
 * twice as wide; from 320 bits, padding to 512 buys less precision than
 * its second cache line costs (docs/design.md, "Codes of 512 bits from 256
 * dimensions down"). */
uint32_t kd_quant_padded_dim(uint32_t bits, uint32_t refine, uint32_t dim, uint32_t version)
{
    uint32_t p = (uint32_t)kd_round_up(dim, 64);
    if (bits == 1 && !refine && version >= KD_FORMAT_WIDE_CODES && 2 * p <= KD_CODE_BITS_WIDE)
        return KD_CODE_BITS_WIDE;
    return p;
}

uint32_t kd_quant_code_format(const struct kd_quant *q)
{
    return q->pdim == kd_quant_padded_dim(q->bits, q->refine, q->dim, KD_FORMAT_CODE_TAIL16)
               ? KD_FORMAT_CODE_TAIL16
               : KD_FORMAT_WIDE_CODES;
}

uint32_t kd_quant_file_code_size(uint32_t bits, uint32_t refine, uint32_t dim, uint32_t version)
{
    if (bits != 1)
        return (dim * bits + 7) / 8;
    uint32_t tail = version >= KD_FORMAT_CODE_TAIL16 ? (uint32_t)sizeof(struct kd_code_tail)
                                                     : KD_CODE_TAIL_V3;
    return kd_quant_padded_dim(bits, refine, dim, version) / 8 + tail;
}

void kd_quant_codes_from_file(const struct kd_quant *q, uint32_t version, const uint8_t *from,
                              uint8_t *to, uint64_t n)
{
    uint32_t in = kd_quant_file_code_size(q->bits, q->refine, q->dim, version), bits = q->pdim / 8;
    for (uint64_t i = 0; i < n; i++, from += in, to += q->code_size) {
        float f[4]; /* scale, |o-c|^2, <o-c, c>, shift */
        struct kd_code_tail t;
        memcpy(f, from + bits, sizeof f);
        memcpy(&t.ones, from + bits + 16, 2);
        memcpy(&t.centre, from + bits + 18, 2);
        t.scale = f[0];
        t.corr = q->metric == KD_L2 ? f[1] : f[2];
        t.shift = f[3];
        memcpy(to, from, bits);
        memcpy(to + bits, &t, sizeof t);
    }
}

uint32_t kd_quant_refine_size(uint32_t refine, uint32_t pdim)
{
    if (!refine)
        return 0;
    return (uint32_t)sizeof(struct kd_refine_head) + pdim * refine / 8;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

size_t kd_quant_signs_bytes(const struct kd_quant *q)
{
    return (size_t)KD_ROT_ROUNDS * 2 * q->pdim;
}

static void rotate(const struct kd_quant *q, float *x);

/* Recompute what follows from the centres: norms, their mean, P(c-g). */
static void derive(struct kd_quant *q)
{
    uint32_t d = q->dim, C = q->ncentres;
    for (uint32_t j = 0; j < C; j += KD_PANEL_ROWS) {
        const float *rows[KD_PANEL_ROWS];
        uint32_t n = C - j < KD_PANEL_ROWS ? C - j : KD_PANEL_ROWS;
        for (uint32_t r = 0; r < n; r++)
            rows[r] = q->centres + (size_t)(j + r) * d;
        kd_kernels()->panel_pack(rows, n, d, q->centre_panels + (size_t)j * d);
    }
    for (uint32_t i = 0; i < d; i++) {
        double s = 0;
        for (uint32_t j = 0; j < C; j++)
            s += q->centres[(size_t)j * d + i];
        q->mean[i] = (float)(s / C);
    }
    for (uint32_t j = 0; j < C; j++) {
        const float *c = q->centres + (size_t)j * d;
        float *r = q->rot_centres + (size_t)j * q->pdim;
        q->centres_sq[j] = kd_kernels()->dot(c, c, d);
        for (uint32_t i = 0; i < q->pdim; i++)
            r[i] = i < d ? c[i] - q->mean[i] : 0.0f;
        rotate(q, r);
    }
}

static int alloc_centres(struct kd_quant *q, uint32_t C)
{
    free(q->centres);
    free(q->centres_sq);
    free(q->rot_centres);
    free(q->centre_panels);
    q->ncentres = C;
    q->centres = calloc((size_t)C * q->dim, sizeof(float));
    q->centres_sq = calloc(C, sizeof(float));
    q->rot_centres = calloc((size_t)C * q->pdim, sizeof(float));
    size_t panels = (C + KD_PANEL_ROWS - 1) / KD_PANEL_ROWS;
    q->centre_panels = malloc(panels * KD_PANEL_ROWS * q->dim * sizeof(float));
    if (!q->centres || !q->centres_sq || !q->rot_centres || !q->centre_panels)
        return kd_fail(-ENOMEM, "out of memory for the quantizer");
    return 0;
}

int kd_quant_init(struct kd_quant *q, uint32_t bits, uint32_t refine, uint32_t dim, uint32_t pdim,
                  int metric, uint32_t ncentres, const float *centres, const uint8_t *signs,
                  uint64_t seed)
{
    memset(q, 0, sizeof *q);
    if (bits != 1 && bits != 4 && bits != 8)
        return kd_fail(-EINVAL, "unsupported code width %u bits", bits);
    if (refine != 0 && (refine != 4 || bits != 1))
        return kd_fail(-EINVAL, "unsupported refinement of %u bits on %u-bit codes", refine, bits);
    if (ncentres < 1 || ncentres > KD_MAX_CENTRES)
        return kd_fail(-EINVAL, "bad number of quantizer centres %u", ncentres);
    if (pdim != kd_quant_padded_dim(bits, refine, dim, KD_FORMAT_CODE_TAIL16) &&
        pdim != kd_quant_padded_dim(bits, refine, dim, KD_FORMAT_WIDE_CODES))
        return kd_fail(-EINVAL, "bad rotated width %u for %u dimensions", pdim, dim);
    q->bits = bits;
    q->dim = dim;
    q->pdim = pdim;
    q->code_size = bits == 1 ? pdim / 8 + (uint32_t)sizeof(struct kd_code_tail)
                             : (dim * bits + 7) / 8;
    q->refine = refine;
    q->refine_size = kd_quant_refine_size(refine, pdim);
    q->metric = metric;
    q->mean = calloc(dim, sizeof(float));
    q->signs = malloc(kd_quant_signs_bytes(q));
    q->sq_lo = calloc(dim, sizeof(float));
    q->sq_step = malloc(dim * sizeof(float));
    if (q->sq_step)
        for (uint32_t i = 0; i < dim; i++)
            q->sq_step[i] = 1.0f;
    if (!q->mean || !q->signs || !q->sq_lo || !q->sq_step || alloc_centres(q, ncentres)) {
        kd_quant_free(q);
        return kd_fail(-ENOMEM, "out of memory for the quantizer");
    }
    if (centres)
        memcpy(q->centres, centres, (size_t)ncentres * dim * sizeof(float));
    if (signs) {
        memcpy(q->signs, signs, kd_quant_signs_bytes(q));
    } else {
        uint64_t s = seed ^ 0x6b6e6e6469726563ull;
        for (size_t i = 0; i < kd_quant_signs_bytes(q); i++)
            q->signs[i] = (uint8_t)(splitmix64(&s) >> 63);
    }
    derive(q);
    return 0;
}

static void train_ranges(struct kd_quant *q, const float *x, size_t n);

/* Each pass over a panel of 32 centres serves twelve rows, where a row at a
 * time streamed all the centres from L2 again (256 x 384 of them: 393 KB a
 * row, half of an add's encoding). A panel's inner product adds its terms
 * in one order whatever the block, so a row's are the same alone or among
 * others. Without hardware FMAs (fmaf a library call) a pair at a time. */
void kd_quant_centre_dots(const struct kd_quant *q, const float *x, size_t stride, size_t n,
                          float *out)
{
    const struct kd_kernels *k = kd_kernels();
    uint32_t d = q->dim, C = q->ncentres;
    if (!k->fused_panels) {
        for (size_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < C; j++)
                out[i * C + j] = k->dot(x + i * stride, q->centres + (size_t)j * d, d);
        return;
    }
    float dots[KD_PANEL_QUERIES * KD_PANEL_ROWS];
    for (size_t i0 = 0; i0 < n; i0 += KD_PANEL_QUERIES) {
        size_t nq = n - i0 < KD_PANEL_QUERIES ? n - i0 : KD_PANEL_QUERIES;
        for (uint32_t c = 0; c < C; c += KD_PANEL_ROWS) {
            k->panel_dot(x + i0 * stride, stride, nq, q->centre_panels + (size_t)c * d, d, dots);
            uint32_t in = C - c < KD_PANEL_ROWS ? C - c : KD_PANEL_ROWS;
            for (size_t i = 0; i < nq; i++)
                memcpy(out + (i0 + i) * C + c, dots + i * KD_PANEL_ROWS, in * sizeof(float));
        }
    }
}

/* The nearest centre of each of nq <= KD_PANEL_QUERIES rows (row j at x +
 * j * stride), argmin |c|^2 - 2<x, c>: the same whether a row is encoded
 * alone or among others. */
static void nearest_centres(const struct kd_quant *q, const float *x, size_t stride, size_t nq,
                            uint32_t *best)
{
    float dots[KD_PANEL_QUERIES * KD_MAX_CENTRES];
    uint32_t C = q->ncentres;
    kd_quant_centre_dots(q, x, stride, nq, dots);
    for (size_t j = 0; j < nq; j++) {
        float bd = INFINITY;
        best[j] = 0;
        for (uint32_t c = 0; c < C; c++) {
            float dist = q->centres_sq[c] - 2 * dots[j * C + c]; /* |x - c|^2 - |x|^2 */
            if (dist < bd) {
                bd = dist;
                best[j] = c;
            }
        }
    }
}

void kd_quant_nearest(const struct kd_quant *q, const float *x, size_t stride, size_t n,
                      uint32_t *best)
{
    for (size_t i = 0; i < n; i += KD_PANEL_QUERIES)
        nearest_centres(q, x + i * stride, stride,
                        n - i < KD_PANEL_QUERIES ? n - i : KD_PANEL_QUERIES, best + i);
}

/* Assignment step of k-means, split over threads. */
struct assign_job {
    const struct kd_quant *q;
    const float *x;
    size_t n, step;
    uint32_t *label;
    unsigned threads, next;
};

static void *assign_worker(void *arg)
{
    struct assign_job *a = arg;
    unsigned me = __atomic_fetch_add(&a->next, 1, __ATOMIC_RELAXED);
    size_t lo = a->n * me / a->threads, hi = a->n * (me + 1) / a->threads;
    kd_quant_nearest(a->q, a->x + lo * a->step * a->q->dim, a->step * a->q->dim, hi - lo,
                     a->label + lo);
    return NULL;
}

uint32_t kd_quant_centres_for(size_t n)
{
    size_t c = n / 64;
    return c < 1 ? 1 : (c > KD_MAX_CENTRES ? KD_MAX_CENTRES : (uint32_t)c);
}

int kd_quant_train(struct kd_quant *q, const float *x, size_t n, uint64_t seed, unsigned threads)
{
    if (n == 0)
        return 0;
    if (q->bits != 1) {
        train_ranges(q, x, n);
        return 0;
    }
    uint32_t d = q->dim, C = kd_quant_centres_for(n);
    size_t sample = n < (size_t)C * 64 ? n : (size_t)C * 64;
    size_t step = n / sample;
    double *sum = calloc((size_t)C * d, sizeof(double));
    size_t *members = calloc(C, sizeof(size_t));
    uint32_t *label = malloc(sample * sizeof *label);
    int err = alloc_centres(q, C);
    if (!err && (!sum || !members || !label))
        err = kd_fail(-ENOMEM, "out of memory training the quantizer");
    if (err)
        goto out;
    uint64_t s = seed ^ 0x63656e7472657321ull;
    for (uint32_t j = 0; j < C; j++)
        memcpy(q->centres + (size_t)j * d, x + (size_t)(splitmix64(&s) % n) * d, d * sizeof(float));
    for (int iter = 0; iter < 8; iter++) {
        derive(q); /* centres_sq for the assignment */
        struct assign_job job = {q, x, sample, step, label, threads ? threads : 1, 0};
        kd_run_workers(assign_worker, &job, job.threads);
        memset(sum, 0, (size_t)C * d * sizeof(double));
        memset(members, 0, C * sizeof(size_t));
        for (size_t i = 0; i < sample; i++) {
            const float *v = x + i * step * d;
            members[label[i]]++;
            for (uint32_t t = 0; t < d; t++)
                sum[(size_t)label[i] * d + t] += v[t];
        }
        for (uint32_t j = 0; j < C; j++) {
            float *c = q->centres + (size_t)j * d;
            if (members[j] == 0) {
                /* Re-seed an empty cluster on a random point. */
                memcpy(c, x + (size_t)(splitmix64(&s) % n) * d, d * sizeof(float));
                continue;
            }
            for (uint32_t t = 0; t < d; t++)
                c[t] = (float)(sum[(size_t)j * d + t] / (double)members[j]);
        }
    }
    derive(q);
out:
    free(sum);
    free(members);
    free(label);
    return err;
}

void kd_quant_set_ranges(struct kd_quant *q, const float *lo, const float *step)
{
    memcpy(q->sq_lo, lo, q->dim * sizeof(float));
    memcpy(q->sq_step, step, q->dim * sizeof(float));
}

int kd_quant_copy(struct kd_quant *dst, const struct kd_quant *src)
{
    int err = kd_quant_init(dst, src->bits, src->refine, src->dim, src->pdim, src->metric,
                            src->ncentres, src->centres, src->signs, 0);
    if (!err)
        kd_quant_set_ranges(dst, src->sq_lo, src->sq_step);
    return err;
}

int kd_quant_equal(const struct kd_quant *a, const struct kd_quant *b)
{
    size_t d = a->dim;
    return a->bits == b->bits && a->refine == b->refine && a->dim == b->dim && a->pdim == b->pdim &&
           a->metric == b->metric && a->ncentres == b->ncentres &&
           !memcmp(a->centres, b->centres, (size_t)a->ncentres * d * sizeof(float)) &&
           !memcmp(a->signs, b->signs, kd_quant_signs_bytes(a)) &&
           !memcmp(a->sq_lo, b->sq_lo, d * sizeof(float)) &&
           !memcmp(a->sq_step, b->sq_step, d * sizeof(float));
}

/* Per-dimension range of the sample, split into 2^bits - 1 steps. */
static void train_ranges(struct kd_quant *q, const float *x, size_t n)
{
    uint32_t d = q->dim;
    float levels = (float)((1u << q->bits) - 1);
    for (uint32_t i = 0; i < d; i++) {
        float lo = x[i], hi = x[i];
        for (size_t r = 1; r < n; r++) {
            float v = x[r * d + i];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        q->sq_lo[i] = lo;
        q->sq_step[i] = hi > lo ? (hi - lo) / levels : 1.0f;
    }
}


void kd_quant_free(struct kd_quant *q)
{
    free(q->centres);
    free(q->centres_sq);
    free(q->mean);
    free(q->rot_centres);
    free(q->centre_panels);
    free(q->signs);
    free(q->sq_lo);
    free(q->sq_step);
    memset(q, 0, sizeof *q);
}

__attribute__((target_clones("avx2", "default"))) static void flip(float *x, const uint8_t *signs,
                                                                   uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (signs[i])
            x[i] = -x[i];
}

/* Each round mixes the leading and the trailing power-of-two block, which
 * overlap whenever pdim is not a power of two, so every dim is mixed. */
static void rotate(const struct kd_quant *q, float *x)
{
    uint32_t n = q->pdim, l = 1;
    while (l * 2 <= n)
        l *= 2;
    const uint8_t *s = q->signs;
    kd_fwht_fn fwht = kd_kernels()->fwht;
    for (int r = 0; r < KD_ROT_ROUNDS; r++) {
        flip(x, s, n);
        s += n;
        fwht(x, l);
        flip(x, s, n);
        s += n;
        fwht(x + (n - l), l);
    }
}

static void encode_scalar(const struct kd_quant *q, const float *x, uint8_t *code)
{
    int levels = (1 << q->bits) - 1;
    memset(code, 0, q->code_size);
    for (uint32_t i = 0; i < q->dim; i++) {
        int u = (int)lrintf((x[i] - q->sq_lo[i]) / q->sq_step[i]);
        u = u < 0 ? 0 : (u > levels ? levels : u);
        if (q->bits == 8)
            code[i] = (uint8_t)u;
        else
            code[i / 2] |= (uint8_t)(u << (4 * (i & 1)));
    }
}

/* Levels round r / (max|r| / 7); the step is then the least-squares fit of
 * r by step * (level - 7), never further from r than the rounding step. */
static void encode_refinement(const struct kd_quant *q, const float *r, const float *rc,
                              uint8_t *out)
{
    uint8_t *lv = out + sizeof(struct kd_refine_head);
    float top = 0;
    for (uint32_t i = 0; i < q->pdim; i++)
        top = fabsf(r[i]) > top ? fabsf(r[i]) : top;
    float inv = top > 0 ? (float)KD_REFINE_MID / top : 0.0f;
    double rl = 0, ll = 0, shift = 0;
    memset(lv, 0, q->pdim / 2);
    for (uint32_t i = 0; i < q->pdim; i++) {
        int u = (int)lrintf(r[i] * inv);
        u = u < -KD_REFINE_MID ? -KD_REFINE_MID : (u > KD_REFINE_MID ? KD_REFINE_MID : u);
        lv[i / 2] |= (uint8_t)((u + KD_REFINE_MID) << (4 * (i & 1)));
        rl += (double)r[i] * u;
        ll += (double)u * u;
        shift += (double)u * rc[i];
    }
    struct kd_refine_head h = {ll > 0 ? (float)(rl / ll) : 0.0f, 0};
    h.shift = (float)(h.step * shift);
    memcpy(out, &h, sizeof h);
}

void kd_quant_encode(const struct kd_quant *q, const float *x, uint8_t *code, uint8_t *refined,
                     float *work)
{
    uint32_t j = 0;
    if (q->bits == 1)
        nearest_centres(q, x, q->dim, 1, &j);
    kd_quant_encode_near(q, x, j, code, refined, work);
}

void kd_quant_encode_near(const struct kd_quant *q, const float *x, uint32_t j, uint8_t *code,
                          uint8_t *refined, float *work)
{
    if (q->bits != 1) {
        encode_scalar(q, x, code);
        return;
    }
    struct kd_code_tail t;
    const float *c = q->centres + (size_t)j * q->dim;
    float dc = 0, nn = 0;
    for (uint32_t i = 0; i < q->dim; i++) {
        float v = x[i] - c[i];
        work[i] = v;
        dc += v * c[i];
        nn += v * v;
    }
    for (uint32_t i = q->dim; i < q->pdim; i++)
        work[i] = 0;
    rotate(q, work);
    const float *rc = q->rot_centres + (size_t)j * q->pdim;
    double abs_sum = 0, shift = 0;
    uint32_t ones = 0;
    for (uint32_t w = 0; w < q->pdim / 64; w++) {
        uint64_t word = 0;
        /* Without a branch: a coordinate's sign is a coin toss the
         * predictor loses, and rc's sign flip is exact, so the sums match. */
        for (uint32_t b = 0; b < 64; b++) {
            uint32_t i = w * 64 + b, pos = work[i] > 0, r;
            abs_sum += fabsf(work[i]);
            word |= (uint64_t)pos << b;
            ones += pos;
            memcpy(&r, rc + i, sizeof r);
            r ^= (pos ^ 1u) << 31;
            float signed_rc;
            memcpy(&signed_rc, &r, sizeof r);
            shift += signed_rc;
        }
        memcpy(code + w * 8, &word, 8);
    }
    t.scale = abs_sum > 0 ? (float)(nn / abs_sum) : 0.0f;
    t.corr = q->metric == KD_L2 ? nn : dc;
    t.shift = (float)shift;
    t.ones = (uint16_t)ones;
    t.centre = (uint16_t)j;
    memcpy(code + q->pdim / 8, &t, sizeof t);
    if (q->refine)
        encode_refinement(q, work, rc, refined);
}

uint32_t kd_quant_centre_of(const struct kd_quant *q, const uint8_t *code)
{
    if (q->bits != 1)
        return 0;
    struct kd_code_tail t;
    memcpy(&t, code + q->pdim / 8, sizeof t);
    return t.centre;
}

int kd_qcode_alloc(struct kd_qcode *qc, const struct kd_quant *q)
{
    memset(qc, 0, sizeof *qc);
    qc->planes = calloc((size_t)KD_QUERY_BITS * q->pdim / 64, sizeof(uint64_t));
    qc->work = malloc(q->pdim * sizeof(float));
    qc->norm_sq = malloc(KD_MAX_CENTRES * sizeof(float));
    qc->dot_c = malloc(KD_MAX_CENTRES * sizeof(float));
    qc->sq = malloc(2 * (size_t)q->dim * sizeof(float));
    qc->centre_gen = calloc(KD_MAX_CENTRES, sizeof(uint32_t));
    qc->levels = malloc(q->pdim);
    qc->rot = malloc(q->pdim * sizeof(float));
    if (!qc->planes || !qc->work || !qc->norm_sq || !qc->dot_c || !qc->sq || !qc->centre_gen ||
        !qc->levels || !qc->rot) {
        kd_qcode_free(qc);
        return kd_fail(-ENOMEM, "out of memory for a query code");
    }
    return 0;
}

void kd_qcode_free(struct kd_qcode *qc)
{
    free(qc->planes);
    free(qc->work);
    free(qc->norm_sq);
    free(qc->dot_c);
    free(qc->sq);
    free(qc->centre_gen);
    free(qc->levels);
    free(qc->rot);
    memset(qc, 0, sizeof *qc);
}

/* Scalar codes: l2 = sum (a_i - step_i u_i)^2 with a = x - lo; inner product
 * = const + sum b_i u_i with b = x * step. */
static void prepare_scalar(const struct kd_quant *q, const float *x, struct kd_qcode *qc)
{
    float *a = qc->sq, *b = qc->sq + q->dim;
    double c = 0;
    for (uint32_t i = 0; i < q->dim; i++) {
        a[i] = x[i] - q->sq_lo[i];
        b[i] = x[i] * q->sq_step[i];
        c += (double)x[i] * q->sq_lo[i];
    }
    qc->sq_const = (float)c;
}

void kd_qcode_prepare(const struct kd_quant *q, const float *x, struct kd_qcode *qc)
{
    if (q->bits != 1) {
        prepare_scalar(q, x, qc);
        return;
    }
    float *v = qc->work;
    qc->x = x;
    qc->x_sq = kd_kernels()->dot(x, x, q->dim);
    if (++qc->gen == 0) {
        memset(qc->centre_gen, 0, KD_MAX_CENTRES * sizeof(uint32_t));
        qc->gen = 1;
    }
    for (uint32_t i = 0; i < q->pdim; i++)
        v[i] = i < q->dim ? x[i] - q->mean[i] : 0.0f;
    rotate(q, v);
    if (q->refine)
        memcpy(qc->rot, v, q->pdim * sizeof(float));
    float lo = v[0], hi = v[0];
    for (uint32_t i = 1; i < q->pdim; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    const int levels = (1 << KD_QUERY_BITS) - 1;
    float delta = (hi - lo) / (float)levels;
    if (!(delta > 0))
        delta = 1.0f;
    float inv = 1.0f / delta;
    uint8_t *lv = qc->levels;
    uint64_t level_sum = 0;
    for (uint32_t i = 0; i < q->pdim; i++) {
        int u = (int)((v[i] - lo) * inv + 0.5f);
        lv[i] = (uint8_t)(u > levels ? levels : u);
        level_sum += lv[i];
    }
    /* Bit b of 8 levels at once: gather each byte's bit b into one byte. */
    uint32_t words = q->pdim / 64;
    memset(qc->planes, 0, (size_t)KD_QUERY_BITS * words * sizeof(uint64_t));
    for (uint32_t w = 0; w < words; w++)
        for (uint32_t g = 0; g < 8; g++) {
            uint64_t x;
            memcpy(&x, lv + w * 64 + g * 8, 8);
            for (int b = 0; b < KD_QUERY_BITS; b++) {
                uint64_t packed = (((x >> b) & 0x0101010101010101ull) * 0x0102040810204080ull) >>
                                  56;
                qc->planes[(size_t)b * words + w] |= packed << (g * 8);
            }
        }
    qc->lo = lo;
    qc->delta = delta;
    qc->sum_q = lo * (float)q->pdim + delta * (float)level_sum;
}

/* Centre j's terms from xc = <x, c_j>. */
static inline void set_centre_terms(const struct kd_quant *q, const struct kd_qcode *qc, uint32_t j,
                                    float xc)
{
    qc->dot_c[j] = xc;
    qc->norm_sq[j] = qc->x_sq - 2 * xc + q->centres_sq[j];
    qc->centre_gen[j] = qc->gen;
}

static void centre_terms(const struct kd_quant *q, const struct kd_qcode *qc, uint32_t j)
{
    set_centre_terms(q, qc, j, kd_kernels()->dot(qc->x, q->centres + (size_t)j * q->dim, q->dim));
}

void kd_qcode_take_centre_dots(const struct kd_quant *q, struct kd_qcode *qc, const float *dots)
{
    for (uint32_t j = 0; j < q->ncentres; j++)
        set_centre_terms(q, qc, j, dots[j]);
}

/* The estimated distance from the estimate ip of <o-c, q-c>. */
static inline float from_ip(const struct kd_quant *q, const struct kd_qcode *qc,
                            const struct kd_code_tail t, float ip)
{
    if (__builtin_expect(qc->centre_gen[t.centre] != qc->gen, 0))
        centre_terms(q, qc, t.centre);
    if (q->metric == KD_L2)
        return t.corr + qc->norm_sq[t.centre] - 2.0f * ip;
    return -(ip + t.corr + qc->dot_c[t.centre]);
}

/* The estimate from the weighted popcount s = sum_b 2^b |bits & plane_b|. */
static inline float finish(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *code,
                           uint64_t s)
{
    struct kd_code_tail t;
    memcpy(&t, code + q->pdim / 8, sizeof t);
    float s1 = qc->lo * (float)t.ones + qc->delta * (float)s;
    return from_ip(q, qc, t, t.scale * (2.0f * s1 - qc->sum_q - t.shift));
}

/* Refined: the estimate from sum_i (level_i - 7) P(q-g)_i. */
static inline float finish_refined(const struct kd_quant *q, const struct kd_qcode *qc,
                                   const uint8_t *code, const uint8_t *refined, float dot)
{
    struct kd_code_tail t;
    struct kd_refine_head h;
    memcpy(&t, code + q->pdim / 8, sizeof t);
    memcpy(&h, refined, sizeof h);
    return from_ip(q, qc, t, h.step * dot - h.shift);
}

static void refine_scalar(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
                          const uint8_t *refined, const uint32_t *rows, size_t n, float *out)
{
    for (size_t r = 0; r < n; r++) {
        const uint8_t *code = codes + (size_t)rows[r] * q->code_size;
        const uint8_t *head = refined + (size_t)rows[r] * q->refine_size;
        const uint8_t *lv = head + sizeof(struct kd_refine_head);
        float s = 0;
        for (uint32_t i = 0; i < q->pdim; i++)
            s += qc->rot[i] * (float)(((lv[i / 2] >> (4 * (i & 1))) & 15) - KD_REFINE_MID);
        out[r] = finish_refined(q, qc, code, head, s);
    }
}

#if defined(__x86_64__)
/* 32 levels a step: split the nibbles, interleave them back into dimension
 * order, centre them on 0, widen 8 at a time to floats. */
__attribute__((target("avx2,fma"))) static void
refine_avx2(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
            const uint8_t *refined, const uint32_t *rows, size_t n, float *out)
{
    const __m128i low = _mm_set1_epi8(0x0f), mid = _mm_set1_epi8(KD_REFINE_MID);
    for (size_t r = 0; r < n; r++) {
        const uint8_t *code = codes + (size_t)rows[r] * q->code_size;
        const uint8_t *head = refined + (size_t)rows[r] * q->refine_size;
        const uint8_t *lv = head + sizeof(struct kd_refine_head);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (uint32_t i = 0; i < q->pdim; i += 32) {
            __m128i b = _mm_loadu_si128((const __m128i *)(lv + i / 2));
            __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
            __m128i first = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), mid),
                    second = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), mid);
            const float *x = qc->rot + i;
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)),
                                   _mm256_loadu_ps(x), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(
                                       _mm256_cvtepi8_epi32(_mm_srli_si128(first, 8))),
                                   _mm256_loadu_ps(x + 8), acc1);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)),
                                   _mm256_loadu_ps(x + 16), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(
                                       _mm256_cvtepi8_epi32(_mm_srli_si128(second, 8))),
                                   _mm256_loadu_ps(x + 24), acc1);
        }
        __m256 acc = _mm256_add_ps(acc0, acc1);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        out[r] = finish_refined(q, qc, code, head, _mm_cvtss_f32(h));
    }
}

__attribute__((target("avx512f"))) static inline __m512 widen16(__m128i levels)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(levels));
}

/* 64 levels a step: the same split and interleave over 256 bits, whose
 * lanes then hold dimensions 0-15 and 32-47 (first), 16-31 and 48-63
 * (second), each widened 16 at a time. */
__attribute__((target("avx512f,avx2,fma"))) static void
refine_avx512(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
              const uint8_t *refined, const uint32_t *rows, size_t n, float *out)
{
    const __m256i low = _mm256_set1_epi8(0x0f), mid = _mm256_set1_epi8(KD_REFINE_MID);
    for (size_t r = 0; r < n; r++) {
        const uint8_t *code = codes + (size_t)rows[r] * q->code_size;
        const uint8_t *head = refined + (size_t)rows[r] * q->refine_size;
        const uint8_t *lv = head + sizeof(struct kd_refine_head);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        for (uint32_t i = 0; i < q->pdim; i += 64) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(lv + i / 2));
            __m256i lo = _mm256_and_si256(b, low),
                    hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
            __m256i first = _mm256_sub_epi8(_mm256_unpacklo_epi8(lo, hi), mid),
                    second = _mm256_sub_epi8(_mm256_unpackhi_epi8(lo, hi), mid);
            const float *x = qc->rot + i;
            __m512 d0 = widen16(_mm256_castsi256_si128(first)),
                   d16 = widen16(_mm256_castsi256_si128(second)),
                   d32 = widen16(_mm256_extracti128_si256(first, 1)),
                   d48 = widen16(_mm256_extracti128_si256(second, 1));
            acc0 = _mm512_fmadd_ps(d0, _mm512_loadu_ps(x), acc0);
            acc1 = _mm512_fmadd_ps(d16, _mm512_loadu_ps(x + 16), acc1);
            acc0 = _mm512_fmadd_ps(d32, _mm512_loadu_ps(x + 32), acc0);
            acc1 = _mm512_fmadd_ps(d48, _mm512_loadu_ps(x + 48), acc1);
        }
        out[r] = finish_refined(q, qc, code, head, _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)));
    }
}
#endif

kd_refine_fn kd_refiner_named(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return refine_scalar;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return refine_avx2;
    if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return refine_avx512;
#endif
    return NULL;
}

const char *kd_refiner_variant(void)
{
    static const char *const names[] = {"avx512", "avx2"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (kd_refiner_named(names[i]))
            return names[i];
    return "scalar";
}

kd_refine_fn kd_refiner(const struct kd_quant *q)
{
    return q->refine ? kd_refiner_named(kd_refiner_variant()) : NULL;
}

/* A code's words, read with memcpy rather than through a cast (aliasing);
 * with a 16-byte tail they sit on 8-byte boundaries, so it is one load. */
static inline uint64_t load_word(const uint8_t *code, uint32_t w)
{
    uint64_t v;
    memcpy(&v, code + (size_t)w * 8, 8);
    return v;
}

/* The reference: one plane at a time, the plainest form of the sum. */
static void estimate_scalar(const struct kd_quant *q, const struct kd_qcode *qc,
                            const uint8_t *codes, const uint32_t *rows, size_t n, float *out)
{
    uint32_t words = q->pdim / 64;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *code = codes + (size_t)rows[i] * q->code_size;
        uint64_t s = 0;
        for (int b = 0; b < KD_QUERY_BITS; b++) {
            const uint64_t *p = qc->planes + (size_t)b * words;
            uint64_t c = 0;
            for (uint32_t w = 0; w < words; w++)
                c += (uint64_t)__builtin_popcountll(load_word(code, w) & p[w]);
            s += c << b;
        }
        out[i] = finish(q, qc, code, s);
    }
}

#if defined(__x86_64__)
_Static_assert(KD_QUERY_BITS == 4, "weighted_popcnt sums four planes");

/* Words outer, planes inner: each code word is loaded once and the four
 * plane counts are independent chains, where the reference runs one chain
 * per plane. With words a constant the loop unrolls whole: on Zen 1 a code
 * in cache scores in 0.47-0.75 of the plane-by-plane loop's time. */
__attribute__((target("popcnt"), always_inline)) static inline uint64_t
weighted_popcnt(const uint8_t *code, const uint64_t *planes, uint32_t words)
{
    uint64_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    for (uint32_t w = 0; w < words; w++) {
        uint64_t x = load_word(code, w);
        c0 += (uint64_t)__builtin_popcountll(x & planes[w]);
        c1 += (uint64_t)__builtin_popcountll(x & planes[words + w]);
        c2 += (uint64_t)__builtin_popcountll(x & planes[2 * words + w]);
        c3 += (uint64_t)__builtin_popcountll(x & planes[3 * words + w]);
    }
    return c0 + (c1 << 1) + (c2 << 2) + (c3 << 3);
}

#define POPCNT_ROWS(WORDS)                                                                         \
    for (size_t i = 0; i < n; i++) {                                                               \
        const uint8_t *code = codes + (size_t)rows[i] * q->code_size;                              \
        out[i] = finish(q, qc, code, weighted_popcnt(code, qc->planes, WORDS));                    \
    }

__attribute__((target("popcnt"))) static void
estimate_popcnt(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
                const uint32_t *rows, size_t n, float *out)
{
    uint32_t words = q->pdim / 64;
    switch (words) { /* the common widths, 128 to 1,024 dimensions */
    case 2:
        POPCNT_ROWS(2) break;
    case 4:
        POPCNT_ROWS(4) break;
    case 6:
        POPCNT_ROWS(6) break;
    case 8:
        POPCNT_ROWS(8) break;
    case 12:
        POPCNT_ROWS(12) break;
    case 16:
        POPCNT_ROWS(16) break;
    default:
        POPCNT_ROWS(words) break;
    }
}

/* Bytewise popcounts by nibble lookup: per byte, sum_b 2^b popcount(code &
 * plane_b) stays below 256 (8 bits x 15), so the four planes are weighted in
 * bytes (Horner) and summed once per chunk. A chunk is 4 words, or 2 words
 * zero-extended; a last odd word goes to popcnt. Every variant yields the
 * same integer, hence the same estimate. */
#define AVX2_POPCNT __attribute__((target("avx2,popcnt")))

/* Four words at w, or two (zero above them) when half. */
AVX2_POPCNT static inline __m256i load_chunk(const void *p, int half)
{
    return half ? _mm256_inserti128_si256(_mm256_setzero_si256(),
                                          _mm_loadu_si128((const __m128i *)p), 0)
                : _mm256_loadu_si256((const __m256i *)p);
}

AVX2_POPCNT static void estimate_avx2(const struct kd_quant *q, const struct kd_qcode *qc,
                                      const uint8_t *codes, const uint32_t *rows, size_t n,
                                      float *out)
{
    uint32_t words = q->pdim / 64;
    const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2,
                                         1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *code = codes + (size_t)rows[i] * q->code_size;
        __m256i acc = _mm256_setzero_si256();
        uint32_t w = 0;
        for (int half = 0; w + 2 <= words; w += half ? 2 : 4) {
            half = w + 4 > words;
            __m256i c = load_chunk(code + (size_t)w * 8, half);
            __m256i sum = _mm256_setzero_si256();
            for (int b = KD_QUERY_BITS - 1; b >= 0; b--) {
                __m256i t = _mm256_and_si256(c,
                                             load_chunk(qc->planes + (size_t)b * words + w, half));
                __m256i cnt = _mm256_add_epi8(
                    _mm256_shuffle_epi8(lut, _mm256_and_si256(t, low)),
                    _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(t, 4), low)));
                sum = _mm256_add_epi8(_mm256_add_epi8(sum, sum), cnt);
            }
            acc = _mm256_add_epi64(acc, _mm256_sad_epu8(sum, _mm256_setzero_si256()));
        }
        __m128i acc2 = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        uint64_t s = (uint64_t)_mm_cvtsi128_si64(acc2) + (uint64_t)_mm_extract_epi64(acc2, 1);
        if (w < words)
            for (int b = 0; b < KD_QUERY_BITS; b++)
                s += (uint64_t)__builtin_popcountll(load_word(code, w) &
                                                    qc->planes[(size_t)b * words + w])
                     << b;
        out[i] = finish(q, qc, code, s);
    }
}

/* VPOPCNTQ counts eight words an instruction, with no nibble lookup. A
 * code of up to eight words (pdim <= 512) is one masked load, and the
 * query's planes stay in registers across the rows; longer codes go eight
 * words a pass. The integer is the scalar one, hence so is the estimate. */
#define AVX512_POPCNT __attribute__((target("avx512f,avx512vpopcntdq")))

/* The weighted popcount of one chunk of a code against the planes. */
AVX512_POPCNT static inline __m512i weighted_count(__m512i c, const __m512i plane[KD_QUERY_BITS])
{
    __m512i acc = _mm512_popcnt_epi64(_mm512_and_si512(c, plane[0]));
    for (int b = 1; b < KD_QUERY_BITS; b++)
        acc = _mm512_add_epi64(acc,
                               _mm512_slli_epi64(_mm512_popcnt_epi64(_mm512_and_si512(c, plane[b])),
                                                 b));
    return acc;
}

static inline __mmask8 words_mask(uint32_t left)
{
    return left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);
}

/* Up to 256 bits of code: two rows a register, one in each half (the
 * query's planes repeated in both), and both halves' lanes summed with two
 * shuffles. */
AVX512_POPCNT static void estimate_pairs_avx512(const struct kd_quant *q, const struct kd_qcode *qc,
                                                const uint8_t *codes, const uint32_t *rows,
                                                size_t n, float *out)
{
    uint32_t words = q->pdim / 64;
    __mmask8 lo = words_mask(words), hi = (__mmask8)(lo << 4);
    __m512i plane[KD_QUERY_BITS];
    for (int b = 0; b < KD_QUERY_BITS; b++) {
        __m512i p = _mm512_maskz_loadu_epi64(lo, qc->planes + (size_t)b * words);
        plane[b] = _mm512_shuffle_i64x2(p, p, _MM_SHUFFLE(1, 0, 1, 0));
    }
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        const uint8_t *c0 = codes + (size_t)rows[i] * q->code_size;
        const uint8_t *c1 = codes + (size_t)rows[i + 1] * q->code_size;
        /* The upper half loads c1 from 32 bytes on: the masked-off lanes
         * below are never read. */
        __m512i c = _mm512_mask_loadu_epi64(_mm512_maskz_loadu_epi64(lo, c0), hi,
                                            (const void *)((uintptr_t)c1 - 32));
        __m512i acc = weighted_count(c, plane);
        acc = _mm512_add_epi64(acc, _mm512_shuffle_epi32(acc, _MM_PERM_BADC));
        acc = _mm512_add_epi64(acc, _mm512_shuffle_i64x2(acc, acc, _MM_SHUFFLE(2, 3, 0, 1)));
        out[i] = finish(q, qc, c0, (uint64_t)_mm_cvtsi128_si64(_mm512_castsi512_si128(acc)));
        out[i + 1] = finish(q, qc, c1,
                            (uint64_t)_mm_cvtsi128_si64(_mm512_extracti32x4_epi32(acc, 2)));
    }
    if (i < n) {
        const uint8_t *c0 = codes + (size_t)rows[i] * q->code_size;
        __m512i acc = weighted_count(_mm512_maskz_loadu_epi64(lo, c0), plane);
        out[i] = finish(q, qc, c0, (uint64_t)_mm512_reduce_add_epi64(acc));
    }
}

#define EVEN_PAIRS _MM_SHUFFLE(2, 0, 2, 0) /* 128-bit lanes 0, 2 of each input */
#define ODD_PAIRS _MM_SHUFFLE(3, 1, 3, 1)

/* Lane r of the result: the sum of a[r]'s eight lanes. Eight rows' sums at
 * once, in three rounds of pairing, where a row at a time took a reduction
 * of its own. */
AVX512_POPCNT static inline __m512i sum_lanes8(const __m512i a[8])
{
    __m512i t[4];
    for (int k = 0; k < 4; k++) /* 128-bit lane j: (a[2k]'s, a[2k+1]'s) pair j */
        t[k] = _mm512_add_epi64(_mm512_unpacklo_epi64(a[2 * k], a[2 * k + 1]),
                                _mm512_unpackhi_epi64(a[2 * k], a[2 * k + 1]));
    __m512i v01 = _mm512_add_epi64(_mm512_shuffle_i64x2(t[0], t[1], EVEN_PAIRS),
                                   _mm512_shuffle_i64x2(t[0], t[1], ODD_PAIRS));
    __m512i v23 = _mm512_add_epi64(_mm512_shuffle_i64x2(t[2], t[3], EVEN_PAIRS),
                                   _mm512_shuffle_i64x2(t[2], t[3], ODD_PAIRS));
    return _mm512_add_epi64(_mm512_shuffle_i64x2(v01, v23, EVEN_PAIRS),
                            _mm512_shuffle_i64x2(v01, v23, ODD_PAIRS));
}

/* finish() for rows[0..8), their weighted counts in sums' lanes: the same
 * operations in the same order, eight lanes at a time (no fused
 * multiply-adds), so the same bits. The tails are gathered from the lines
 * the counts just read. */
AVX512_POPCNT static inline void finish8(const struct kd_quant *q, const struct kd_qcode *qc,
                                         const uint8_t *codes, const uint32_t *rows, __m512i sums,
                                         float *out)
{
    __m512i at = _mm512_mul_epu32(_mm512_cvtepu32_epi64(_mm256_loadu_si256((const void *)rows)),
                                  _mm512_set1_epi64(q->code_size));
    const uint8_t *tail = codes + q->pdim / 8;
    _Static_assert(offsetof(struct kd_code_tail, scale) == 0 &&
                       offsetof(struct kd_code_tail, corr) == 4 &&
                       offsetof(struct kd_code_tail, shift) == 8 &&
                       offsetof(struct kd_code_tail, centre) == 14,
                   "finish8 gathers the tail's fields at these offsets");
    __m256 scale = _mm512_i64gather_ps(at, tail, 1);
    __m256 corr = _mm512_i64gather_ps(at, tail + 4, 1);
    __m256 shift = _mm512_i64gather_ps(at, tail + 8, 1);
    __m256i ones_centre = _mm512_i64gather_epi32(at, tail + 12, 1);
    __m256i centre = _mm256_srli_epi32(ones_centre, 16);
    __m256 ones = _mm256_cvtepi32_ps(_mm256_and_si256(ones_centre, _mm256_set1_epi32(0xffff)));
    __m256 s = _mm256_cvtepi32_ps(_mm512_cvtepi64_epi32(sums)); /* counts < 2^24: exact */
    __m256i gen = _mm256_i32gather_epi32((const int *)qc->centre_gen, centre, 4);
    unsigned stale = ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(
                         _mm256_cmpeq_epi32(gen, _mm256_set1_epi32((int)qc->gen)))) &
                     0xffu;
    if (__builtin_expect(stale != 0, 0)) {
        uint32_t c[8];
        _mm256_storeu_si256((void *)c, centre);
        for (; stale; stale &= stale - 1) {
            uint32_t j = c[__builtin_ctz(stale)];
            if (qc->centre_gen[j] != qc->gen) /* a centre twice in the eight */
                centre_terms(q, qc, j);
        }
    }
    __m256 two = _mm256_set1_ps(2.0f);
    __m256 s1 = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(qc->lo), ones),
                              _mm256_mul_ps(_mm256_set1_ps(qc->delta), s));
    __m256 ip = _mm256_mul_ps(scale, _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(two, s1),
                                                                 _mm256_set1_ps(qc->sum_q)),
                                                   shift));
    __m256 d;
    if (q->metric == KD_L2)
        d = _mm256_sub_ps(_mm256_add_ps(corr, _mm256_i32gather_ps(qc->norm_sq, centre, 4)),
                          _mm256_mul_ps(two, ip));
    else
        d = _mm256_xor_ps(_mm256_add_ps(_mm256_add_ps(ip, corr),
                                        _mm256_i32gather_ps(qc->dot_c, centre, 4)),
                          _mm256_set1_ps(-0.0f));
    _mm256_storeu_ps(out, d);
}

AVX512_POPCNT static void estimate_avx512(const struct kd_quant *q, const struct kd_qcode *qc,
                                          const uint8_t *codes, const uint32_t *rows, size_t n,
                                          float *out)
{
    uint32_t words = q->pdim / 64;
    if (words <= 4) {
        estimate_pairs_avx512(q, qc, codes, rows, n, out);
        return;
    }
    /* Up to 1,024 bits the query's planes stay in registers. */
    __m512i plane[2][KD_QUERY_BITS];
    if (words <= 16) {
        __mmask8 m0 = words_mask(words), m1 = words_mask(words > 8 ? words - 8 : 0);
        for (int b = 0; b < KD_QUERY_BITS; b++) {
            plane[0][b] = _mm512_maskz_loadu_epi64(m0, qc->planes + (size_t)b * words);
            plane[1][b] = _mm512_maskz_loadu_epi64(m1, qc->planes + (size_t)b * words + 8);
        }
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m512i acc[8];
            for (int r = 0; r < 8; r++) {
                const uint8_t *code = codes + (size_t)rows[i + r] * q->code_size;
                acc[r] = weighted_count(_mm512_maskz_loadu_epi64(m0, code), plane[0]);
                if (m1)
                    acc[r] = _mm512_add_epi64(
                        acc[r], weighted_count(_mm512_maskz_loadu_epi64(m1, code + 64), plane[1]));
            }
            finish8(q, qc, codes, rows + i, sum_lanes8(acc), out + i);
        }
        for (; i < n; i++) {
            const uint8_t *code = codes + (size_t)rows[i] * q->code_size;
            __m512i acc = weighted_count(_mm512_maskz_loadu_epi64(m0, code), plane[0]);
            if (m1)
                acc = _mm512_add_epi64(acc, weighted_count(_mm512_maskz_loadu_epi64(m1, code + 64),
                                                           plane[1]));
            out[i] = finish(q, qc, code, (uint64_t)_mm512_reduce_add_epi64(acc));
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *code = codes + (size_t)rows[i] * q->code_size;
        __m512i acc = _mm512_setzero_si512();
        for (uint32_t w = 0; w < words; w += 8) {
            __mmask8 m = words_mask(words - w);
            for (int b = 0; b < KD_QUERY_BITS; b++)
                plane[0][b] = _mm512_maskz_loadu_epi64(m, qc->planes + (size_t)b * words + w);
            acc = _mm512_add_epi64(acc,
                                   weighted_count(_mm512_maskz_loadu_epi64(m, code + (size_t)w * 8),
                                                  plane[0]));
        }
        out[i] = finish(q, qc, code, (uint64_t)_mm512_reduce_add_epi64(acc));
    }
}
#endif

#define SCALAR_BODY(LEVEL)                                                                         \
    uint32_t d = q->dim;                                                                           \
    const float *a = qc->sq, *b = qc->sq + d, *step = q->sq_step;                                  \
    for (size_t r = 0; r < n; r++) {                                                               \
        const uint8_t *code = codes + (size_t)rows[r] * q->code_size;                              \
        float s = 0;                                                                               \
        if (q->metric == KD_L2) {                                                                  \
            for (uint32_t i = 0; i < d; i++) {                                                     \
                float t = a[i] - step[i] * (float)(LEVEL);                                         \
                s += t * t;                                                                        \
            }                                                                                      \
            out[r] = s;                                                                            \
        } else {                                                                                   \
            for (uint32_t i = 0; i < d; i++)                                                       \
                s += b[i] * (float)(LEVEL);                                                        \
            out[r] = -(s + qc->sq_const);                                                          \
        }                                                                                          \
    }

#define LEVEL8 code[i]
#define LEVEL4 ((code[i / 2] >> (4 * (i & 1))) & 15)

static void estimate_sq8(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
                         const uint32_t *rows, size_t n, float *out)
{
    SCALAR_BODY(LEVEL8)
}

static void estimate_sq4(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
                         const uint32_t *rows, size_t n, float *out)
{
    SCALAR_BODY(LEVEL4)
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void
estimate_sq8_avx2(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
                  const uint32_t *rows, size_t n, float *out)
{
    SCALAR_BODY(LEVEL8)
}

__attribute__((target("avx2,fma"))) static void
estimate_sq4_avx2(const struct kd_quant *q, const struct kd_qcode *qc, const uint8_t *codes,
                  const uint32_t *rows, size_t n, float *out){SCALAR_BODY(LEVEL4)}
#endif

kd_estimate_fn kd_estimator_named(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return estimate_scalar;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (strcmp(name, "popcnt") == 0 && __builtin_cpu_supports("popcnt"))
        return estimate_popcnt;
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("popcnt"))
        return estimate_avx2;
    if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vpopcntdq"))
        return estimate_avx512;
#endif
    return NULL;
}

/* Which variant is fastest depends on the CPU and the code's width: Zen 1
 * runs popcnt four a cycle but splits 256-bit shuffles in two, so there
 * popcnt beats the AVX2 lookup at every width from 128 to 1,536
 * dimensions, while CPUs with full-width AVX2 may go the other way. So each
 * width's variant is timed once (benchmarks/c/code_kernels.c times them
 * at length): codes of random vectors scored over and over in cache, best
 * round of each. All variants give the same floats; only speed differs. */
#define PICK_ROWS 64
#define PICK_REPS 8
#define PICK_ROUNDS 5
#define PICK_WIDTHS 129 /* cached up to 8,192 dimensions */

static const char *const widest_first[] = {"avx512", "avx2", "popcnt"};
#define NVARIANTS (sizeof widest_first / sizeof *widest_first)
static uint8_t picked[PICK_WIDTHS]; /* 1 + index into widest_first; 0: not yet */

/* Best-round ns of each available variant at width pdim into ns (0 where
 * the CPU lacks it); -ENOMEM when the timing could not be set up. */
static int time_variants(uint32_t pdim, double ns[NVARIANTS])
{
    struct kd_quant q;
    struct kd_qcode qc = {0};
    uint8_t *codes = NULL;
    float *x = NULL;
    int err = kd_quant_init(&q, 1, 0, pdim, pdim, KD_L2, 1, NULL, NULL, 1);
    if (err)
        return err;
    if ((err = kd_qcode_alloc(&qc, &q)))
        goto out;
    codes = malloc((size_t)PICK_ROWS * q.code_size);
    x = malloc((size_t)pdim * sizeof(float));
    if (!codes || !x) {
        err = -ENOMEM;
        goto out;
    }
    uint64_t z = 88172645463325252ull;
    for (size_t r = 0; r < PICK_ROWS; r++) {
        for (uint32_t j = 0; j < pdim; j++) { /* xorshift: any spread of values does */
            z ^= z << 13, z ^= z >> 7, z ^= z << 17;
            x[j] = (float)(z >> 40) / (float)(1 << 24) - 0.5f;
        }
        kd_quant_encode(&q, x, codes + r * q.code_size, NULL, qc.work);
    }
    kd_qcode_prepare(&q, x, &qc);
    uint32_t rows[PICK_ROWS];
    float out[PICK_ROWS];
    for (uint32_t r = 0; r < PICK_ROWS; r++)
        rows[r] = r;
    kd_estimate_fn fn[NVARIANTS];
    for (size_t v = 0; v < NVARIANTS; v++) {
        fn[v] = kd_estimator_named(widest_first[v]);
        ns[v] = 0;
    }
    /* Rounds interleave the variants, so that a slow spell of the machine
     * falls on all of them. */
    for (int round = 0; round < PICK_ROUNDS; round++)
        for (size_t v = 0; v < NVARIANTS; v++) {
            if (!fn[v])
                continue;
            uint64_t t = kd_now_ns();
            for (int rep = 0; rep < PICK_REPS; rep++)
                fn[v](&q, &qc, codes, rows, PICK_ROWS, out);
            double d = (double)(kd_now_ns() - t);
            ns[v] = round == 0 || d < ns[v] ? d : ns[v];
        }
out:
    free(codes);
    free(x);
    kd_qcode_free(&qc);
    kd_quant_free(&q);
    return err;
}

/* The widest variant within 5% of the fastest: a near tie does not flip
 * the choice from run to run. */
static size_t pick_variant(uint32_t pdim)
{
    double ns[NVARIANTS];
    size_t widest = NVARIANTS;
    for (size_t v = NVARIANTS; v-- > 0;)
        if (kd_estimator_named(widest_first[v]))
            widest = v;
    if (widest == NVARIANTS || time_variants(pdim, ns))
        return widest;
    double best = 0;
    for (size_t v = 0; v < NVARIANTS; v++)
        if (ns[v] > 0 && (best == 0 || ns[v] < best))
            best = ns[v];
    for (size_t v = 0; v < NVARIANTS; v++)
        if (ns[v] > 0 && ns[v] <= 1.05 * best)
            return v;
    return widest;
}

const char *kd_estimator_variant(uint32_t pdim)
{
    uint32_t words = pdim / 64;
    size_t v;
    if (words < PICK_WIDTHS && (v = __atomic_load_n(&picked[words], __ATOMIC_RELAXED)))
        return v > NVARIANTS ? "scalar" : widest_first[v - 1];
    v = pick_variant(pdim); /* NVARIANTS: none available */
    if (words < PICK_WIDTHS)
        __atomic_store_n(&picked[words], (uint8_t)(v + 1), __ATOMIC_RELAXED);
    return v == NVARIANTS ? "scalar" : widest_first[v];
}

kd_estimate_fn kd_estimator(const struct kd_quant *q)
{
    if (q->bits != 1) {
#if defined(__x86_64__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            return q->bits == 8 ? estimate_sq8_avx2 : estimate_sq4_avx2;
#endif
        return q->bits == 8 ? estimate_sq8 : estimate_sq4;
    }
    return kd_estimator_named(kd_estimator_variant(q->pdim));
}

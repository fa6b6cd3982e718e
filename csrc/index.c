/* index.c — the index object: create and free, train, add (encoding and the
 * graph's distance oracle), remove, lookups by id, and reporting. The search
 * pipeline is in search.c, files in persist.c. */
#include "index_impl.h"
#include "common.h"
#include "search.h"
#include "persist.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

uint32_t kd_record_stride_for(uint32_t dim)
{
    uint32_t bytes = dim * 4, s = 16;
    if (bytes > KD_BLOCK)
        return (uint32_t)kd_round_up(bytes, KD_BLOCK);
    while (s < bytes)
        s *= 2; /* a power of two never straddles a 4 KiB block */
    return s;
}

double kd_default_oversample(int quantization, uint32_t pdim)
{
    if (quantization == KD_Q_8BIT)
        return 2.0;
    if (quantization == KD_Q_4BIT)
        return 5.0;
    /* 1-bit estimates carry one bit per dimension: the fewer dimensions, the
     * noisier the ranking and the deeper the shortlist must go (measured:
     * docs/benchmarks.md, 'Design figures'). */
    if (pdim <= 128)
        return 20.0;
    if (pdim <= 512)
        return 10.0;
    return 8.0;
}

int kd_valid_quantization(uint32_t q)
{
    return q == KD_Q_1BIT || q == KD_Q_4BIT || q == KD_Q_8BIT || q == KD_Q_1BIT_4BIT;
}

const char *kd_quantization_name(int q)
{
    switch (q) {
    case KD_Q_1BIT:
        return "1bit";
    case KD_Q_4BIT:
        return "4bit";
    case KD_Q_8BIT:
        return "8bit";
    case KD_Q_1BIT_4BIT:
        return "1bit+4bit";
    default:
        return "?";
    }
}

void kd_index_stats_add(struct kd_index *ix, const struct kd_stats *s)
{
    const uint64_t *src = (const uint64_t *)s;
    uint64_t *dst = (uint64_t *)&ix->st;
    for (size_t i = 0; i < sizeof *s / sizeof(uint64_t); i++)
        if (src[i])
            __atomic_fetch_add(&dst[i], src[i], __ATOMIC_RELAXED);
}

int kd_check_finite(const float *x, size_t n, uint32_t dim, const char *what)
{
    /* A row's exponents are tested whole, without an early exit, so that
     * the loop vectorizes: isfinite() element by element took 0.1 s of each
     * 268 MB chunk an add is given. */
    for (size_t i = 0; i < n; i++) {
        const float *row = x + i * dim;
        uint32_t bad = 0;
        for (uint32_t j = 0; j < dim; j++) {
            uint32_t bits;
            memcpy(&bits, row + j, sizeof bits);
            bad |= (bits & 0x7f800000u) == 0x7f800000u; /* Inf or NaN */
        }
        if (bad)
            return kd_fail(-EDOM, "%s row %zu contains NaN or Inf", what, i);
    }
    return 0;
}

/* ---- construction */

int kd_index_alloc(struct kd_index **out, const struct kd_index_params *p)
{
    if (p->dim == 0 || p->dim > (1u << 20))
        return kd_fail(-EINVAL, "dim must be between 1 and %u, got %u", 1u << 20, p->dim);
    if (!kd_metric(p->metric))
        return kd_fail(-EINVAL, "unknown metric code %d", p->metric);
    if (p->m < 2 || p->m > 256)
        return kd_fail(-EINVAL, "m must be between 2 and 256, got %u", p->m);
    if (!kd_valid_quantization((uint32_t)p->quantization))
        return kd_fail(-EINVAL, "unsupported quantization");
    struct kd_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return kd_fail(-ENOMEM, "out of memory");
    ix->p = *p;
    ix->metric = kd_metric(p->metric);
    ix->src = &kd_vsource_memory;
    if (ix->p.ef_construction < ix->p.m)
        ix->p.ef_construction = ix->p.m;
    ix->record_bytes = p->dim * 4;
    ix->record_stride = kd_record_stride_for(p->dim);
    ix->kern = kd_kernels();
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&ix->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&ix->pool_lock, NULL);
    kd_graph_init(&ix->graph, p->m);
    int err = kd_idmap_init(&ix->idmap, 0);
    if (err) {
        kd_index_free(ix);
        return err;
    }
    *out = ix;
    return 0;
}

int kd_index_create(struct kd_index **out, const struct kd_index_params *p)
{
    struct kd_index *ix = NULL;
    int err = kd_index_alloc(&ix, p);
    if (err)
        return err;
    uint32_t bits = kd_q_bits(p->quantization);
    err = kd_quant_init(&ix->quant, bits, kd_q_refine(p->quantization), p->dim,
                        kd_quant_padded_dim(bits, kd_q_refine(p->quantization), p->dim,
                                            KD_FORMAT_VERSION),
                        p->metric, 1, NULL, NULL, p->seed);
    if (err) {
        kd_index_free(ix);
        return err;
    }
    ix->estimate = kd_estimator(&ix->quant);
    ix->refine = kd_refiner(&ix->quant);
    *out = ix;
    return 0;
}

void kd_index_free(struct kd_index *ix)
{
    if (!ix)
        return;
    while (ix->pool) {
        struct kd_search_ctx *c = ix->pool;
        ix->pool = c->next;
        kd_search_ctx_free(c);
    }
    if (ix->map) {
        ix->graph.owns = 0;
        munmap(ix->map, ix->map_len);
        free(ix->own_codes);
    } else {
        free(ix->codes);
        free(ix->refined);
        free(ix->ids);
    }
    kd_graph_free(&ix->graph);
    free(ix->vectors);
    free(ix->inv_norms);
    free(ix->deleted);
    kd_idmap_free(&ix->idmap);
    kd_quant_free(&ix->quant);
    kd_bcode_free(&ix->bcode);
    free(ix->calib);
    kd_vecio_close(ix->vio);
    free(ix->path);
    pthread_rwlock_destroy(&ix->lock);
    pthread_mutex_destroy(&ix->pool_lock);
    free(ix);
}

static void normalized(const struct kd_index *ix, const float *x, float *out)
{
    float inv = kd_inv_norm(ix, x);
    for (uint32_t i = 0; i < ix->p.dim; i++)
        out[i] = x[i] * inv;
}

int kd_index_train(struct kd_index *ix, const float *x, size_t n)
{
    if (n == 0)
        return 0;
    int err = kd_check_finite(x, n, ix->p.dim, "vector");
    if (err)
        return err;
    uint32_t d = ix->p.dim;
    size_t want = (size_t)KD_MAX_CENTRES * 64, m = n < want ? n : want, step = n / m;
    float *sample = malloc(m * d * sizeof(float));
    if (!sample)
        return kd_fail(-ENOMEM, "out of memory training the quantizer");
    for (size_t i = 0; i < m; i++) {
        const float *v = x + i * step * d;
        if (ix->metric->normalized)
            normalized(ix, v, sample + i * d);
        else
            memcpy(sample + i * d, v, d * sizeof(float));
    }
    pthread_rwlock_wrlock(&ix->lock);
    /* An adopted quantizer is kept: segments of one collection must agree. */
    if (ix->count == 0 && !ix->src->read_only && !ix->adopted) {
        err = kd_quant_train(&ix->quant, sample, m, ix->p.seed, kd_cpu_count());
        ix->trained = !err;
    }
    /* The build codes' step from the same sample, which spans the whole
     * input where an add is fed in chunks. */
    if (!err && ix->count == 0 && !ix->src->read_only && ix->p.dim <= KD_BCODE_MAX_DIM) {
        kd_bcode_free(&ix->bcode);
        err = kd_bcode_fit(&ix->bcode, d, ix->p.metric == KD_L2, sample, NULL, m);
    }
    pthread_rwlock_unlock(&ix->lock);
    free(sample);
    return err;
}

/* Where the rows an encoding reads and writes lie: row i's vector at
 * x + i * dim, its inverse norm (normalized metrics), code and refinement
 * at index i of the other three. */
struct encoded {
    const float *x;
    float *inv_norms;
    uint8_t *codes, *refined;
};

static struct encoded index_rows(const struct kd_index *ix, uint64_t first)
{
    return (struct encoded){ix->vectors + first * ix->p.dim,
                            ix->inv_norms ? ix->inv_norms + first : NULL,
                            ix->codes + first * ix->quant.code_size,
                            ix->refined ? ix->refined + first * ix->quant.refine_size : NULL};
}

#define ENCODE_CLAIM 64 /* rows a worker takes at a time */

struct encode_job {
    struct kd_index *ix;
    struct encoded rows;
    uint64_t n, next;
};

static void *encode_worker(void *arg)
{
    struct encode_job *j = arg;
    struct kd_index *ix = j->ix;
    struct encoded r = j->rows;
    uint32_t d = ix->p.dim, near[ENCODE_CLAIM] = {0}; /* scalar codes have one centre */
    int normalized = ix->metric->normalized;
    float *work = malloc(ix->quant.pdim * sizeof(float));
    float *tmp = normalized ? malloc(ENCODE_CLAIM * d * sizeof(float)) : NULL;
    /* Without scratch a worker claims no rows: the others encode them all,
     * or, where none could, nothing is encoded (encode_rows says so). */
    while (work && (tmp || !normalized)) {
        uint64_t i = __atomic_fetch_add(&j->next, ENCODE_CLAIM, __ATOMIC_RELAXED);
        if (i >= j->n)
            break;
        size_t n = i + ENCODE_CLAIM < j->n ? ENCODE_CLAIM : j->n - i;
        const float *v = r.x + i * d;
        if (normalized) {
            for (size_t k = 0; k < n; k++) {
                r.inv_norms[i + k] = kd_inv_norm(ix, v + k * d);
                for (uint32_t t = 0; t < d; t++)
                    tmp[k * d + t] = v[k * d + t] * r.inv_norms[i + k];
            }
            v = tmp;
        }
        if (ix->quant.bits == 1)
            kd_quant_nearest(&ix->quant, v, d, n, near);
        for (size_t k = 0; k < n; k++)
            kd_quant_encode_near(&ix->quant, v + k * d, near[k],
                                 r.codes + (i + k) * ix->quant.code_size,
                                 r.refined ? r.refined + (i + k) * ix->quant.refine_size : NULL,
                                 work);
    }
    free(work);
    free(tmp);
    return NULL;
}

/* n rows encoded with ix's quantizer, on `threads` workers: 0, or -ENOMEM
 * with none of them encoded. */
static int encode_rows(struct kd_index *ix, struct encoded rows, uint64_t n, unsigned threads)
{
    struct encode_job job = {ix, rows, n, 0};
    kd_run_workers(encode_worker, &job, threads);
    return job.next < n ? kd_fail(-ENOMEM, "out of memory encoding vectors") : 0;
}

int kd_index_adopt_quantizer(struct kd_index *ix, struct kd_index *from)
{
    if (ix == from)
        return 0;
    if (from->p.dim != ix->p.dim || from->p.metric != ix->p.metric ||
        from->p.quantization != ix->p.quantization)
        return kd_fail(-EINVAL, "quantizer of another dimension, metric or code width");
    struct kd_quant q;
    pthread_rwlock_rdlock(&from->lock);
    int err = from->trained ? kd_quant_copy(&q, &from->quant)
                            : kd_fail(-EINVAL, "the source index has no fitted quantizer");
    pthread_rwlock_unlock(&from->lock);
    if (err)
        return err;
    pthread_rwlock_wrlock(&ix->lock);
    if (ix->src->read_only) {
        err = kd_fail(-EINVAL, "a quantizer can only be given to a writable index");
        kd_quant_free(&q);
        goto out;
    }
    /* The graph links rows, whichever codes guided its insertion: only the
     * rows' codes are made again, and the calibration, which measured the
     * old ones, is dropped. */
    struct kd_quant old = ix->quant;
    ix->quant = q;
    if ((err = encode_rows(ix, index_rows(ix, 0), ix->count, kd_cpu_count()))) {
        ix->quant = old; /* no row was encoded with q */
        kd_quant_free(&q);
        goto out;
    }
    kd_quant_free(&old);
    ix->trained = ix->adopted = 1;
    if (ix->count) {
        free(ix->calib);
        ix->calib = NULL;
        ix->calib_bytes = 0;
    }
out:
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

int kd_index_same_quantizer(struct kd_index *a, struct kd_index *b)
{
    if (a == b)
        return 1;
    pthread_rwlock_rdlock(&a->lock);
    pthread_rwlock_rdlock(&b->lock);
    int same = a->trained && b->trained && kd_quant_equal(&a->quant, &b->quant);
    pthread_rwlock_unlock(&b->lock);
    pthread_rwlock_unlock(&a->lock);
    return same;
}

/* Every per-slot array resized to cap slots (cap > ix->cap). */
static int grow_to(struct kd_index *ix, uint64_t cap, uint64_t need)
{
    uint32_t d = ix->p.dim;
    float *v = realloc(ix->vectors, cap * d * sizeof(float));
    if (v)
        ix->vectors = v;
    uint8_t *c = kd_alloc_aligned(KD_CODE_ALIGN, cap * ix->quant.code_size);
    if (c) {
        if (ix->count)
            memcpy(c, ix->codes, ix->count * ix->quant.code_size);
        free(ix->codes);
        ix->codes = c;
    }
    if (c && ix->quant.refine_size) {
        uint8_t *r = realloc(ix->refined, cap * ix->quant.refine_size);
        if (r)
            ix->refined = r;
        else
            c = NULL;
    }
    int64_t *id = realloc(ix->ids, cap * sizeof(int64_t));
    if (id)
        ix->ids = id;
    uint8_t *del = realloc(ix->deleted, cap);
    if (del)
        ix->deleted = del;
    int ok = v && c && id && del;
    if (ok && ix->metric->normalized) {
        float *inv = realloc(ix->inv_norms, cap * sizeof(float));
        if (inv)
            ix->inv_norms = inv;
        ok = inv != NULL;
    }
    if (!ok || kd_graph_reserve(&ix->graph, cap))
        return kd_fail(-ENOMEM, "out of memory growing the index to %llu vectors",
                       (unsigned long long)need);
    /* Searches and builds touch rows at random: one TLB entry per 2 MiB. */
    kd_advise_huge(ix->vectors, cap * d * sizeof(float));
    kd_advise_huge(ix->codes, cap * ix->quant.code_size);
    if (ix->quant.refine_size)
        kd_advise_huge(ix->refined, cap * ix->quant.refine_size);
    ix->cap = cap;
    return 0;
}

int kd_index_grow(struct kd_index *ix, uint64_t need)
{
    if (need <= ix->cap)
        return 0;
    uint64_t cap = ix->cap ? ix->cap : 1024;
    while (cap < need)
        cap *= 2;
    return grow_to(ix, cap, need);
}

/* Whether `more` rows may be added to ix (its lock held): 0, -EROFS or
 * -EOVERFLOW. */
static int can_add(const struct kd_index *ix, uint64_t more)
{
    if (ix->src->read_only)
        return kd_fail(-EROFS,
                       "index opened from disk is read-only; use knndirect.load to modify it");
    if (more > UINT32_MAX - 1 - ix->count)
        return kd_fail(-EOVERFLOW, "an index holds at most %u vectors", UINT32_MAX - 1);
    return 0;
}

int kd_index_reserve(struct kd_index *ix, uint64_t more)
{
    pthread_rwlock_wrlock(&ix->lock);
    uint64_t need = ix->count + more;
    int err = can_add(ix, more);
    if (!err && ix->trained && need > ix->cap && !(err = kd_idmap_reserve(&ix->idmap, more)))
        err = grow_to(ix, need, need);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

static float oracle_pair(void *p, uint32_t a, uint32_t b)
{
    const struct kd_index *ix = p;
    const float *va = ix->vectors + (size_t)a * ix->p.dim,
                *vb = ix->vectors + (size_t)b * ix->p.dim;
    if (ix->p.metric != KD_COSINE)
        return kd_exact_dist(ix, va, vb, 0);
    return kd_exact_dist(ix, va, vb, ix->inv_norms[a]) * ix->inv_norms[b];
}

static void bcode_oracle_from(void *p, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    const struct kd_index *ix = p;
    kd_bcode_from(&ix->bcode, a, rows, n, out);
}

/* Insertion's beam over the 1-bit search codes (kd_beam_oracle): each node
 * is prepared as a query would be, from the vector its source gives. */
struct beam_state {
    struct kd_estimate_ctx est; /* first: the oracle's dist and prefetch take it */
    struct kd_qcode qc;
    const struct kd_beam_source *src;
    float *scratch;
    /* The next nodes to insert, their vectors and inner products with
     * every centre (KD_BEAM_AHEAD x dim, x ncentres) */
    uint32_t ahead[KD_BEAM_AHEAD];
    size_t nahead;
    float *vectors, *dots;
};

static void beam_close(void *p)
{
    struct beam_state *b = p;
    kd_qcode_free(&b->qc);
    free(b->scratch);
    free(b->vectors);
    free(b->dots);
    free(b);
}

static void *beam_open(void *p)
{
    const struct kd_beam_source *src = p;
    struct beam_state *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->est.ix = src->ix;
    b->est.qc = &b->qc;
    b->src = src;
    b->scratch = malloc(src->scratch_floats * sizeof(float));
    b->vectors = malloc(KD_BEAM_AHEAD * src->ix->p.dim * sizeof(float));
    b->dots = malloc(KD_BEAM_AHEAD * src->ix->quant.ncentres * sizeof(float));
    if (!b->scratch || !b->vectors || !b->dots || kd_qcode_alloc(&b->qc, &src->ix->quant)) {
        beam_close(b);
        return NULL;
    }
    return b;
}

/* A beam meets most of the centres (the text sets' at least): their terms,
 * made one centre at a time the first time a code of it is scored, were 5%
 * of a build. For the next nodes a worker inserts they are made together,
 * twelve nodes a pass over the centres. */
static void beam_ahead(void *p, const uint32_t *nodes, size_t n)
{
    struct beam_state *b = p;
    const struct kd_index *ix = b->est.ix;
    uint32_t d = ix->p.dim;
    b->nahead = n < KD_BEAM_AHEAD ? n : KD_BEAM_AHEAD;
    for (size_t i = 0; i < b->nahead; i++) {
        b->ahead[i] = nodes[i];
        memcpy(b->vectors + i * d, b->src->vector(b->src->ctx, nodes[i], b->scratch),
               d * sizeof(float));
    }
    kd_quant_centre_dots(&ix->quant, b->vectors, d, b->nahead, b->dots);
}

static void beam_prepare(void *p, uint32_t a)
{
    struct beam_state *b = p;
    const struct kd_quant *q = &b->est.ix->quant;
    size_t i = 0;
    while (i < b->nahead && b->ahead[i] != a)
        i++;
    if (i < b->nahead) {
        kd_qcode_prepare(q, b->vectors + i * b->est.ix->p.dim, &b->qc);
        kd_qcode_take_centre_dots(q, &b->qc, b->dots + i * q->ncentres);
    } else {
        kd_qcode_prepare(q, b->src->vector(b->src->ctx, a, b->scratch), &b->qc);
    }
}

const struct kd_beam_oracle kd_beam_1bit = {beam_open,    beam_close,       beam_ahead,
                                            beam_prepare, kd_estimate_rows, kd_prefetch_codes};

/* The beam over 1-bit codes pays once the build codes are past 1.2 times
 * the last-level cache: then most of their reads miss, and the 1-bit codes
 * are 5-7 times smaller. Nearer the cache the VNNI 8-bit distance is the
 * cheaper one; with the AVX-512 estimator the two cost the same at 1.2
 * times (docs/benchmarks.md, "Build speed"), and a build that switches
 * there rather than at twice the cache is faster. */
int kd_beam_pays(const struct kd_index *ix, uint64_t build_code_bytes)
{
    if (kd_beam_rule())
        return ix->quant.bits == 1 && kd_beam_rule() > 0;
    return ix->quant.bits == 1 && build_code_bytes * 5 > 6 * kd_llc_bytes();
}

/* The spread test's sample, and the narrowest rows it is made for (the
 * widths measured: 384 and 768; at 256 only the clustered sets were, where
 * the centres explain 0.80 and the build codes' beam is the faster one). */
#define SPREAD_SAMPLE 4096
#define SPREAD_MIN_DIM 384

/* Whether the quantizer's centres explain less than half of the spread of
 * rows [first, last) (1 - sum |x - c(x)|^2 / sum |x - mean|^2 over an even
 * sample, c(x) the centre x's code names). Rows lie in centre order so that
 * consecutive insertions search one region while its build codes are in
 * cache. Where the centres explain little a beam's neighbours lie all over
 * the code array, and the 1-bit codes, an eighth of the bytes, make the
 * cheaper beam at any size: real text embeddings explain 0.24-0.27 at 256
 * centres, where the beam took 0.81-0.85 of the build time; the Gaussian
 * clusters explain 0.80, where it took 1.03-1.16 below the cache
 * (docs/benchmarks.md, "The insertion beam where the centres explain
 * little"). Drawn from
 * the rows and their codes alone, so a threads=1 build stays reproducible. */
int kd_beam_spread(const struct kd_beam_source *src, uint64_t first, uint64_t last)
{
    const struct kd_index *ix = src->ix;
    const struct kd_quant *q = &ix->quant;
    uint32_t d = ix->p.dim;
    if (kd_beam_rule())
        return q->bits == 1 && kd_beam_rule() > 0;
    if (q->bits != 1 || q->ncentres < 2 || d < SPREAD_MIN_DIM || last <= first)
        return 0;
    float *scratch = malloc(src->scratch_floats * sizeof(float));
    double *sum = calloc(d, sizeof(double));
    int spread = 0;
    if (!scratch || !sum) /* the build codes' beam needs nothing more */
        goto out;
    uint64_t n = last - first, m = n < SPREAD_SAMPLE ? n : SPREAD_SAMPLE;
    double within = 0.0, sq = 0.0;
    for (uint64_t i = 0; i < m; i++) {
        uint64_t a = first + i * n / m;
        const float *v = src->vector(src->ctx, (uint32_t)a, scratch);
        const float *c = q->centres +
                         (size_t)kd_quant_centre_of(q, ix->codes + a * q->code_size) * d;
        for (uint32_t t = 0; t < d; t++) {
            double x = v[t], r = x - c[t];
            within += r * r;
            sq += x * x;
            sum[t] += x;
        }
    }
    double mean_sq = 0.0;
    for (uint32_t t = 0; t < d; t++)
        mean_sq += sum[t] * sum[t];
    double total = sq - mean_sq / (double)m;
    spread = total > 0.0 && 2.0 * within > total;
out:
    free(scratch);
    free(sum);
    return spread;
}

/* How many of n insertions after row `first` run before the graph's build
 * codes pass 1.2 times the cache; those after score their beam with the 1-bit
 * codes. Decided per insertion, so that how an add is chunked does not
 * change it. */
static uint64_t first_past_cache(const struct kd_index *ix, uint64_t first, uint64_t n)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (kd_beam_pays(ix, (first + mid + 1) * ix->bcode.stride))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* A stored row as the beam prepares it: unit length for cosine. */
static const float *row_vector(const void *p, uint32_t a, float *scratch)
{
    const struct kd_index *ix = p;
    const float *v = ix->vectors + (size_t)a * ix->p.dim;
    if (!ix->metric->normalized)
        return v;
    for (uint32_t t = 0; t < ix->p.dim; t++)
        scratch[t] = v[t] * ix->inv_norms[a];
    return scratch;
}

struct bcode_job {
    struct kd_index *ix;
    uint64_t last, next;
};

static void *bcode_worker(void *arg)
{
    struct bcode_job *j = arg;
    struct kd_index *ix = j->ix;
    for (;;) {
        uint64_t i = __atomic_fetch_add(&j->next, 256, __ATOMIC_RELAXED);
        if (i >= j->last)
            break;
        for (uint64_t end = i + 256 < j->last ? i + 256 : j->last; i < end; i++)
            kd_bcode_encode(&ix->bcode, i, ix->vectors + i * ix->p.dim,
                            ix->inv_norms ? ix->inv_norms[i] : 1.0f);
    }
    return NULL;
}

/* Build codes for rows [first, last), kept for the next add. Fitted by
 * train (a sample of the whole input), else to the rows at hand (a loaded
 * index's first add), and again while the rows double past a small fit.
 * 1 when there are none (too many dimensions: insertion uses float32
 * distances). */
static int build_codes(struct kd_index *ix, uint64_t first, uint64_t last, unsigned threads)
{
    if (ix->p.dim > KD_BCODE_MAX_DIM)
        return 1;
    int err;
    if (kd_bcode_refit_due(&ix->bcode, last)) {
        kd_bcode_free(&ix->bcode);
        if ((err = kd_bcode_fit(&ix->bcode, ix->p.dim, ix->p.metric == KD_L2, ix->vectors,
                                ix->inv_norms, last)))
            return err;
    }
    if (!ix->bcode.rows) /* a new fit: every row is coded again */
        first = 0;
    if ((err = kd_bcode_reserve(&ix->bcode, ix->cap))) {
        if (!ix->bcode.rows) /* refitted next time */
            kd_bcode_free(&ix->bcode);
        return err;
    }
    struct bcode_job job = {ix, last, first};
    kd_run_workers(bcode_worker, &job, threads);
    return 0;
}

/* Distances from node a to rows, four rows per pass over a's vector. */
static void oracle_from(void *p, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    const struct kd_index *ix = p;
    uint32_t d = ix->p.dim;
    const float *va = ix->vectors + (size_t)a * d;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *q[4];
        float r[4], xx;
        for (int j = 0; j < 4; j++)
            q[j] = ix->vectors + (size_t)rows[i + j] * d;
        if (ix->p.metric == KD_L2) {
            ix->kern->l2sq4(q, va, d, r);
            memcpy(out + i, r, sizeof r);
            continue;
        }
        ix->kern->dot4(q, va, d, r, &xx);
        for (int j = 0; j < 4; j++)
            out[i + j] = ix->p.metric == KD_IP
                             ? -r[j]
                             : -r[j] * ix->inv_norms[a] * ix->inv_norms[rows[i + j]];
    }
    for (; i < n; i++)
        out[i] = oracle_pair(p, a, rows[i]);
}

/* The slots of n rows grouped by the centre each one's code names, each
 * group in input order: from[s] is the input row slot s takes, at[i] the
 * slot of input row i. A neighbourhood's codes, lists and vectors then lie
 * close together, so insertion's and search's beams miss the cache less
 * (docs/design.md, "Rows in centre order"). */
static int group_by_centre(const struct kd_quant *q, const uint8_t *codes, size_t n, uint32_t *from,
                           uint32_t *at)
{
    uint32_t *next = calloc((size_t)q->ncentres + 1, sizeof *next);
    if (!next)
        return kd_fail(-ENOMEM, "out of memory grouping rows");
    for (size_t i = 0; i < n; i++)
        next[kd_quant_centre_of(q, codes + i * q->code_size) + 1]++;
    for (uint32_t c = 0; c < q->ncentres; c++)
        next[c + 1] += next[c];
    for (size_t i = 0; i < n; i++) {
        uint32_t s = next[kd_quant_centre_of(q, codes + i * q->code_size)]++;
        from[s] = (uint32_t)i;
        at[i] = s;
    }
    free(next);
    return 0;
}

#define PLACE_ROWS 4096 /* rows a placing worker claims at a time */

struct place_job {
    struct kd_index *ix;
    uint64_t first;
    struct encoded staged;
    const uint32_t *from;
    size_t n, next;
};

/* A gather of scattered rows waits on memory, not arithmetic: workers
 * overlap the misses (0.55 s of a 544k x 384 build's serial part). */
static void *place_worker(void *arg)
{
    struct place_job *j = arg;
    struct kd_index *ix = j->ix;
    struct encoded staged = j->staged;
    size_t d = ix->p.dim, cs = ix->quant.code_size, rs = ix->quant.refine_size;
    size_t s;
    while ((s = __atomic_fetch_add(&j->next, PLACE_ROWS, __ATOMIC_RELAXED)) < j->n) {
        size_t end = s + PLACE_ROWS < j->n ? s + PLACE_ROWS : j->n;
        for (; s < end; s++) {
            size_t i = j->from[s], to = j->first + s;
            memcpy(ix->vectors + to * d, staged.x + i * d, d * sizeof(float));
            memcpy(ix->codes + to * cs, staged.codes + i * cs, cs);
            if (rs)
                memcpy(ix->refined + to * rs, staged.refined + i * rs, rs);
            if (staged.inv_norms)
                ix->inv_norms[to] = staged.inv_norms[i];
        }
    }
    return NULL;
}

/* Rows staged in input order put in their slots from first on. */
static void place_rows(struct kd_index *ix, uint64_t first, struct encoded staged,
                       const uint32_t *from, size_t n, unsigned threads)
{
    struct place_job job = {ix, first, staged, from, n, 0};
    size_t blocks = (n + PLACE_ROWS - 1) / PLACE_ROWS;
    kd_run_workers(place_worker, &job, threads < blocks ? threads : (unsigned)blocks);
}

int kd_index_add(struct kd_index *ix, const float *x, size_t n, const int64_t *ids,
                 unsigned threads)
{
    if (n == 0)
        return 0;
    int err = kd_check_finite(x, n, ix->p.dim, "vector");
    if (err)
        return err;
    if (!ix->trained && (err = kd_index_train(ix, x, n)))
        return err;
    pthread_rwlock_wrlock(&ix->lock);
    uint64_t first = ix->count, last = first + n;
    size_t put = 0;
    uint32_t *from = NULL, *at = NULL;
    struct encoded staged = {x, NULL, NULL, NULL};
    int grouped = 0;
    uint64_t *keys = NULL;
    if ((err = can_add(ix, n)) || (err = kd_idmap_reserve(&ix->idmap, n)) ||
        (err = kd_index_grow(ix, last)))
        goto out;
    /* Grouped by centre, the rows are encoded aside (their codes name the
     * centre) and then put in their slots; else encoded in place. */
    grouped = ix->quant.ncentres > 1 && n > 1;
    if (n > 1 && !(at = malloc(n * sizeof *at))) { /* the insertion order, below */
        err = kd_fail(-ENOMEM, "out of memory adding %zu vectors", n);
        goto out;
    }
    if (grouped) {
        from = malloc(n * sizeof *from);
        staged.codes = malloc(n * ix->quant.code_size);
        if (ix->quant.refine_size)
            staged.refined = malloc(n * ix->quant.refine_size);
        if (ix->metric->normalized)
            staged.inv_norms = malloc(n * sizeof(float));
        keys = malloc(n * sizeof *keys);
        if (!from || !keys || !staged.codes || (ix->quant.refine_size && !staged.refined) ||
            (ix->metric->normalized && !staged.inv_norms)) {
            err = kd_fail(-ENOMEM, "out of memory adding %zu vectors", n);
            goto out;
        }
    } else {
        staged = index_rows(ix, first);
        staged.x = x;
    }
    if ((err = encode_rows(ix, staged, n, kd_resolve_threads(threads))) ||
        (grouped && (err = group_by_centre(&ix->quant, staged.codes, n, from, at))))
        goto out;
    for (; put < n; put++) {
        size_t i = grouped ? from[put] : put;
        int64_t id = ids ? ids[i] : (int64_t)(first + i);
        if (kd_idmap_put(&ix->idmap, id, (uint32_t)(first + put))) {
            err = kd_fail(-EEXIST, "duplicate id %lld", (long long)id);
            goto out;
        }
        ix->ids[first + put] = id;
    }
    if (grouped) {
        place_rows(ix, first, staged, from, n, kd_resolve_threads(threads));
        for (size_t i = 0; i < n; i++)
            at[i] += (uint32_t)first; /* now the insertion order */
        /* Levels keyed by input position: which nodes stand above level
         * 0 does not depend on the layout. */
        for (size_t s = 0; s < n; s++)
            keys[s] = first + from[s];
    } else {
        memcpy(ix->vectors + first * ix->p.dim, x, n * ix->p.dim * sizeof(float));
        for (size_t i = 0; at && i < n; i++)
            at[i] = (uint32_t)(first + i);
    }
    memset(ix->deleted + first, 0, n);
    struct kd_build_oracle o = {oracle_from, ix, NULL, NULL}, beam;
    if ((err = build_codes(ix, first, last, kd_resolve_threads(threads))) < 0)
        goto out;
    struct kd_beam_source src = {ix, row_vector, ix, ix->p.dim};
    uint64_t cached = n;
    if (!err) {
        o = (struct kd_build_oracle){bcode_oracle_from, ix, NULL, &src};
        beam = o;
        beam.beam = &kd_beam_1bit;
        cached = kd_beam_spread(&src, first, last) ? 0 : first_past_cache(ix, first, n);
    }
    if ((err = kd_graph_prepare_keyed(&ix->graph, first, last, ix->p.seed, keys)))
        goto out;
    /* Nodes with upper levels first, in input order: a skeleton over every
     * region, whose early lists keep long links. Then the level-0 nodes in
     * slot order, a centre at a time, so consecutive beams search one
     * region while it is in cache; without the skeleton, nodes inserted so
     * link mostly among themselves (docs/design.md, "Insertion order"). */
    if (at)
        kd_graph_skeleton_first(&ix->graph, first, n, at);
    unsigned workers = kd_resolve_threads(threads);
    err = kd_graph_insert_range(&ix->graph, first, first + cached, at, ix->p.ef_construction, &o,
                                workers);
    if (!err && cached < n)
        err = kd_graph_insert_range(&ix->graph, first + cached, last, at ? at + cached : NULL,
                                    ix->p.ef_construction, &beam, workers);
    if (err) {
        /* Lists may already point at the new nodes: the index cannot be rolled
         * back consistently, so keep them and report the error. */
        ix->count = last;
        __atomic_fetch_add(&ix->live, n, __ATOMIC_RELAXED); /* kd_index_count reads it unlocked */
        put = 0;
        goto out;
    }
    ix->count = last;
    __atomic_fetch_add(&ix->live, n, __ATOMIC_RELAXED);
    put = 0;
out:
    for (size_t i = 0; i < put; i++)
        kd_idmap_del(&ix->idmap, ix->ids[first + i]);
    pthread_rwlock_unlock(&ix->lock);
    if (grouped) {
        free(staged.codes);
        free(staged.refined);
        free(staged.inv_norms);
    }
    free(from);
    free(at);
    free(keys);
    return err;
}

void kd_index_contains(struct kd_index *ix, const int64_t *ids, size_t n, uint8_t *out)
{
    pthread_rwlock_rdlock(&ix->lock);
    for (size_t i = 0; i < n; i++)
        out[i] = kd_idmap_get(&ix->idmap, ids[i]) != KD_NO_ROW;
    pthread_rwlock_unlock(&ix->lock);
}

size_t kd_index_live_ids(struct kd_index *ix, int64_t *out, size_t cap)
{
    pthread_rwlock_rdlock(&ix->lock);
    size_t n = 0;
    for (uint64_t r = 0; r < ix->count; r++)
        if (!ix->deleted[r]) {
            if (n < cap)
                out[n] = ix->ids[r];
            n++;
        }
    pthread_rwlock_unlock(&ix->lock);
    return n;
}

int kd_index_remove(struct kd_index *ix, const int64_t *ids, size_t n)
{
    pthread_rwlock_wrlock(&ix->lock);
    int err = 0;
    for (size_t i = 0; i < n; i++)
        if (kd_idmap_get(&ix->idmap, ids[i]) == KD_NO_ROW) {
            err = kd_fail(-ESRCH, "id %lld is not in the index", (long long)ids[i]);
            goto out;
        }
    for (size_t i = 0; i < n; i++) {
        uint32_t r = kd_idmap_get(&ix->idmap, ids[i]);
        if (r == KD_NO_ROW)
            continue; /* repeated in this call */
        ix->deleted[r] = 1;
        __atomic_fetch_sub(&ix->live, 1, __ATOMIC_RELAXED);
        kd_idmap_del(&ix->idmap, ids[i]);
    }
out:
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

static int rows_from_memory(struct kd_index *ix, const uint64_t *rows, size_t n, void *dst,
                            size_t stride, struct kd_io_counters *io)
{
    (void)io;
    for (size_t i = 0; i < n; i++)
        memcpy((uint8_t *)dst + i * stride, ix->vectors + rows[i] * ix->p.dim, ix->record_bytes);
    return 0;
}

static int rows_from_file(struct kd_index *ix, const uint64_t *rows, size_t n, void *dst,
                          size_t stride, struct kd_io_counters *io)
{
    return kd_vecio_read(ix->vio, rows, n, dst, stride, io);
}

const struct kd_vsource kd_vsource_memory = {
    .name = "memory",
    .on_disk = 0,
    .read_only = 0,
    .batch_reads = 0,
    .scan_cost = 1.0,
    .shortlist = kd_shortlist_score_memory,
    .get_rows = rows_from_memory,
    .save = kd_save_vectors_memory,
};

/* An exact scan reads every record from the file: it must beat the graph by
 * more before it is chosen. */
const struct kd_vsource kd_vsource_file = {
    .name = "file",
    .on_disk = 1,
    .read_only = 1,
    .batch_reads = 1,
    .scan_cost = 4.0,
    .shortlist = kd_shortlist_read,
    .get_rows = rows_from_file,
    .save = kd_save_vectors_file,
};

int kd_index_get_vectors(struct kd_index *ix, const int64_t *ids, size_t n, void *dst,
                         size_t dst_stride)
{
    pthread_rwlock_rdlock(&ix->lock);
    int err = 0;
    uint64_t *rows = malloc((n ? n : 1) * sizeof *rows);
    if (!rows) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t r = kd_idmap_get(&ix->idmap, ids[i]);
        if (r == KD_NO_ROW) {
            err = kd_fail(-ESRCH, "id %lld is not in the index", (long long)ids[i]);
            goto out;
        }
        rows[i] = r;
    }
    if (n) {
        struct kd_io_counters io = {0};
        err = ix->src->get_rows(ix, rows, n, dst, dst_stride, &io);
        struct kd_stats st = {0};
        st.read_ops = io.read_ops;
        st.read_bytes = io.read_bytes;
        st.io_wait_ns = io.wait_ns;
        kd_index_stats_add(ix, &st);
    }
out:
    free(rows);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

int kd_index_set_calibration(struct kd_index *ix, const void *p, size_t n)
{
    if (n > KD_MAX_CALIBRATION)
        return kd_fail(-EINVAL, "a calibration holds at most %u bytes", KD_MAX_CALIBRATION);
    uint8_t *copy = n ? malloc(n) : NULL;
    if (n && !copy)
        return kd_fail(-ENOMEM, "out of memory");
    if (n)
        memcpy(copy, p, n);
    pthread_rwlock_wrlock(&ix->lock);
    free(ix->calib);
    ix->calib = copy;
    ix->calib_bytes = (uint32_t)n;
    pthread_rwlock_unlock(&ix->lock);
    return 0;
}

size_t kd_index_calibration(struct kd_index *ix, void *dst, size_t n)
{
    pthread_rwlock_rdlock(&ix->lock);
    size_t have = ix->calib_bytes;
    if (dst && n && have)
        memcpy(dst, ix->calib, n < have ? n : have);
    pthread_rwlock_unlock(&ix->lock);
    return have;
}

void kd_index_vector_layout(const struct kd_index *ix, size_t *alignment, size_t *stride)
{
    if (ix->vio) {
        *alignment = kd_vecio_buffer_alignment(ix->vio);
        *stride = ix->record_stride;
    } else {
        *alignment = 64;
        *stride = ix->record_bytes;
    }
}

/* ---- reporting */

static uint64_t resident_bytes(const struct kd_index *ix)
{
    uint64_t n = ix->count, b = 0;
    b += n * (ix->quant.code_size + ix->quant.refine_size); /* codes, refinements */
    b += n * sizeof(int64_t) + n;                           /* ids, levels */
    b += n * (1 + ix->graph.m0) * sizeof(uint32_t);         /* level 0 */
    b += n * sizeof(uint32_t *) + n;                        /* upper pointers, tombstones */
    for (uint64_t i = 0; i < n; i++)
        b += (uint64_t)ix->graph.levels[i] * (1 + ix->graph.m) * sizeof(uint32_t);
    b += kd_idmap_bytes(&ix->idmap);
    if (ix->vectors) {                 /* held in memory */
        b += n * ix->record_bytes + n; /* vectors, build locks */
        if (ix->inv_norms)
            b += n * sizeof(float);
    }
    if (ix->bcode.rows)
        b += n * ix->bcode.stride;
    return b;
}

void kd_index_info(struct kd_index *ix, struct kd_info *info)
{
    pthread_rwlock_rdlock(&ix->lock);
    memset(info, 0, sizeof *info);
    info->params = ix->p;
    info->count = ix->live;
    info->slots = ix->count;
    info->on_disk = ix->src->on_disk;
    info->loaded_from_file = ix->loaded_from_file;
    info->path = ix->path;
    info->record_size = ix->record_stride;
    info->code_size = ix->quant.code_size + ix->quant.refine_size;
    info->centres = ix->trained ? ix->quant.ncentres : 0;
    info->resident_bytes = resident_bytes(ix);
    if (ix->vio)
        kd_vecio_get_info(ix->vio, &info->io);
    info->default_oversample = kd_default_oversample(ix->p.quantization, ix->quant.pdim);
    info->default_ef = KD_DEFAULT_EF;
    pthread_rwlock_unlock(&ix->lock);
}

void kd_index_stats(struct kd_index *ix, struct kd_stats *st, int reset)
{
    uint64_t *src = (uint64_t *)&ix->st, *dst = (uint64_t *)st;
    for (size_t i = 0; i < sizeof *st / sizeof(uint64_t); i++)
        dst[i] = reset ? __atomic_exchange_n(&src[i], 0, __ATOMIC_RELAXED)
                       : __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

uint32_t kd_index_dim(const struct kd_index *ix) { return ix->p.dim; }

uint64_t kd_index_count(struct kd_index *ix)
{
    return __atomic_load_n(&ix->live, __ATOMIC_RELAXED);
}

#include "index.h"
#include "common.h"
#include "distance.h"
#include "format.h"
#include "hnsw.h"
#include "idmap.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_EF 64
#define RERANK_CHUNK 256          /* records per batch read in exact scans */

/* Per-thread search state, pooled on the index. */
struct kd_ctx {
    struct kd_ctx *next;
    struct kd_search_scratch s;
    struct kd_qcode qc;
    float *qn;                    /* normalized query (cosine) */
    uint8_t *buf;                 /* aligned records for reranking */
    size_t buf_rows;
    uint64_t *rows64;             /* one read batch, RERANK_CHUNK rows */
    uint32_t *rows;
    size_t rows_cap;
    struct kd_heap_item *top;     /* exact top-k */
    size_t top_cap;
    struct kd_stats st;
};

struct kd_index {
    struct kd_index_params p;
    uint32_t record_stride, record_bytes;
    struct kd_quant quant;
    int trained;
    const struct kd_kernels *kern;
    kd_estimate_fn estimate;

    uint64_t count, cap, live;
    float *vectors;               /* in memory: count x dim */
    float *inv_norms;             /* cosine, in memory */
    uint8_t *codes;
    int64_t *ids;
    uint8_t *deleted;             /* one byte per slot, always heap-owned */
    struct kd_graph graph;
    struct kd_idmap idmap;

    int on_disk, loaded_from_file;
    char *path;
    uint8_t *map;
    size_t map_len;
    struct kd_vecio *vio;

    pthread_rwlock_t lock;
    pthread_mutex_t pool_lock;
    struct kd_ctx *pool;
    struct kd_stats st;           /* updated atomically */
};

/* On-disk metadata, section META (followed by centre and rotation signs). */
struct kd_meta {
    uint32_t dim, metric, quantization, m;
    uint32_t m0, ef_construction, pdim, code_size;
    uint32_t record_stride, record_bytes, entry;
    int32_t max_level;
    uint64_t count, live, seed;
    uint32_t ncentres, reserved;
};

static uint32_t record_stride_for(uint32_t dim)
{
    uint32_t bytes = dim * 4, s = 16;
    if (bytes > KD_BLOCK)
        return (uint32_t)kd_round_up(bytes, KD_BLOCK);
    while (s < bytes)
        s *= 2;  /* a power of two never straddles a 4 KiB block */
    return s;
}

double kd_default_oversample(int quantization, uint32_t dim)
{
    if (quantization == KD_Q_8BIT)
        return 2.0;
    if (quantization == KD_Q_4BIT)
        return 5.0;
    /* 1-bit estimates are noisier in few dims (fewer bits per vector). */
    return dim <= 256 ? 10.0 : 5.0;
}

static int valid_quantization(uint32_t q)
{
    return q == KD_Q_1BIT || q == KD_Q_4BIT || q == KD_Q_8BIT;
}

/* ---- distances */

static inline float exact_dist(const struct kd_index *ix, const float *qn, const float *v,
                               float inv_norm)
{
    switch (ix->p.metric) {
    case KD_L2:
        return ix->kern->l2sq(qn, v, ix->p.dim);
    case KD_IP:
        return -ix->kern->dot(qn, v, ix->p.dim);
    default:
        return -ix->kern->dot(qn, v, ix->p.dim) * inv_norm;
    }
}

static inline float inv_norm_of(const struct kd_index *ix, const float *v)
{
    float n = ix->kern->dot(v, v, ix->p.dim);
    return n > 0 ? 1.0f / sqrtf(n) : 0.0f;
}

static inline float to_user(const struct kd_index *ix, float d)
{
    return ix->p.metric == KD_L2 ? d : -d;
}

static inline float missing_value(const struct kd_index *ix)
{
    return ix->p.metric == KD_L2 ? INFINITY : -INFINITY;
}

/* ---- contexts */

static void ctx_free(struct kd_ctx *c)
{
    kd_scratch_free(&c->s);
    kd_qcode_free(&c->qc);
    free(c->qn);
    kd_free_aligned(c->buf);
    free(c->rows64);
    free(c->rows);
    free(c->top);
    free(c);
}

static struct kd_ctx *ctx_get(struct kd_index *ix)
{
    pthread_mutex_lock(&ix->pool_lock);
    struct kd_ctx *c = ix->pool;
    if (c)
        ix->pool = c->next;
    pthread_mutex_unlock(&ix->pool_lock);
    if (c)
        return c;
    c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->qn = malloc(ix->p.dim * sizeof(float));
    if (!c->qn || kd_qcode_alloc(&c->qc, &ix->quant)) {
        ctx_free(c);
        return NULL;
    }
    return c;
}

static void ctx_put(struct kd_index *ix, struct kd_ctx *c)
{
    pthread_mutex_lock(&ix->pool_lock);
    c->next = ix->pool;
    ix->pool = c;
    pthread_mutex_unlock(&ix->pool_lock);
}

static int ctx_rows(struct kd_ctx *c, size_t n)
{
    if (n <= c->rows_cap)
        return 0;
    uint32_t *r = realloc(c->rows, n * sizeof *r);
    if (!r)
        return kd_fail(-ENOMEM, "out of memory for a search");
    c->rows = r;
    c->rows_cap = n;
    return 0;
}

static int ctx_buf(struct kd_index *ix, struct kd_ctx *c, size_t rows)
{
    if (rows <= c->buf_rows)
        return 0;
    size_t align = 64, stride = ix->record_stride;
    if (ix->vio)
        align = kd_vecio_buffer_alignment(ix->vio);
    kd_free_aligned(c->buf);
    c->buf = kd_alloc_aligned(align, rows * stride);
    c->buf_rows = c->buf ? rows : 0;
    return c->buf ? 0 : kd_fail(-ENOMEM, "out of memory for rerank buffers");
}

static int ctx_top(struct kd_ctx *c, size_t k)
{
    if (k + 1 <= c->top_cap)
        return 0;
    struct kd_heap_item *t = realloc(c->top, (k + 1) * sizeof *t);
    if (!t)
        return kd_fail(-ENOMEM, "out of memory for a search");
    c->top = t;
    c->top_cap = k + 1;
    return 0;
}

static void stats_add(struct kd_index *ix, const struct kd_stats *s)
{
    const uint64_t *src = (const uint64_t *)s;
    uint64_t *dst = (uint64_t *)&ix->st;
    for (size_t i = 0; i < sizeof *s / sizeof(uint64_t); i++)
        if (src[i])
            __atomic_fetch_add(&dst[i], src[i], __ATOMIC_RELAXED);
}

/* ---- exact scoring of rows, from memory or by batch reads */

/* Keep the k best (smallest) in a max-heap of size <= k. */
static inline void top_offer(struct kd_heap_item *h, size_t *n, size_t k, float d, uint32_t row)
{
    if (*n < k) {
        size_t i = (*n)++;
        while (i > 0) {
            size_t p = (i - 1) / 2;
            if (h[p].dist >= d)
                break;
            h[i] = h[p];
            i = p;
        }
        h[i].dist = d;
        h[i].row = row;
    } else if (k && d < h[0].dist) {
        size_t i = 0;
        for (;;) {
            size_t c = 2 * i + 1;
            if (c >= k)
                break;
            if (c + 1 < k && h[c + 1].dist > h[c].dist)
                c++;
            if (h[c].dist <= d)
                break;
            h[i] = h[c];
            i = c;
        }
        h[i].dist = d;
        h[i].row = row;
    }
}

static int cmp_heap_item(const void *a, const void *b)
{
    const struct kd_heap_item *x = a, *y = b;
    if (x->dist != y->dist)
        return (x->dist > y->dist) - (x->dist < y->dist);
    return (x->row > y->row) - (x->row < y->row);
}

/* Score rows[0..n) exactly into the top-k heap. */
static int score_rows(struct kd_index *ix, struct kd_ctx *c, const float *qn,
                      const uint32_t *rows, size_t n, size_t k, size_t *ntop)
{
    if (!ix->on_disk) {
        /* Rows are scattered: keep a few vectors in flight ahead of scoring. */
        size_t lines = ix->record_bytes / 64 < 8 ? ix->record_bytes / 64 : 8;
        for (size_t i = 0; i < n; i++) {
            if (i + 4 < n) {
                const char *ahead = (const char *)(ix->vectors + (size_t)rows[i + 4] * ix->p.dim);
                for (size_t l = 0; l < lines; l++)
                    __builtin_prefetch(ahead + 64 * l);
            }
            const float *v = ix->vectors + (size_t)rows[i] * ix->p.dim;
            float inv = ix->inv_norms ? ix->inv_norms[rows[i]] : 0;
            top_offer(c->top, ntop, k, exact_dist(ix, qn, v, inv), rows[i]);
        }
        return 0;
    }
    size_t chunk = n < RERANK_CHUNK ? n : RERANK_CHUNK;
    int err = ctx_buf(ix, c, chunk);
    if (err)
        return err;
    if (!c->rows64 && !(c->rows64 = malloc(RERANK_CHUNK * sizeof *c->rows64)))
        return kd_fail(-ENOMEM, "out of memory for a search");
    for (size_t at = 0; at < n; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        for (size_t i = 0; i < m; i++)
            c->rows64[i] = rows[at + i];
        struct kd_io_counters io = {0};
        err = kd_vecio_read(ix->vio, c->rows64, m, c->buf, ix->record_stride, &io);
        c->st.read_ops += io.read_ops;
        c->st.read_bytes += io.read_bytes;
        c->st.io_wait_ns += io.wait_ns;
        if (err)
            return err;
        for (size_t i = 0; i < m; i++) {
            const float *v = (const float *)(c->buf + i * ix->record_stride);
            float inv = ix->p.metric == KD_COSINE ? inv_norm_of(ix, v) : 0;
            top_offer(c->top, ntop, k, exact_dist(ix, qn, v, inv), rows[at + i]);
        }
    }
    return 0;
}

/* Brute force over every live slot (or over `rows` when given). */
static int exact_scan(struct kd_index *ix, struct kd_ctx *c, const float *qn, size_t k,
                      const uint32_t *rows, size_t nrows, size_t *ntop)
{
    if (rows)
        return score_rows(ix, c, qn, rows, nrows, k, ntop);
    if (!ix->on_disk) {
        for (uint64_t r = 0; r < ix->count; r++) {
            if (ix->deleted[r])
                continue;
            float inv = ix->inv_norms ? ix->inv_norms[r] : 0;
            top_offer(c->top, ntop, k,
                      exact_dist(ix, qn, ix->vectors + r * ix->p.dim, inv), (uint32_t)r);
        }
        return 0;
    }
    size_t chunk = (4u << 20) / ix->record_stride;
    chunk = chunk ? chunk : 1;
    int err = ctx_buf(ix, c, chunk);
    for (uint64_t at = 0; !err && at < ix->count; at += chunk) {
        uint64_t m = ix->count - at < chunk ? ix->count - at : chunk;
        struct kd_io_counters io = {0};
        err = kd_vecio_read_range(ix->vio, at, m, c->buf, &io);
        c->st.read_ops += io.read_ops;
        c->st.read_bytes += io.read_bytes;
        c->st.io_wait_ns += io.wait_ns;
        for (uint64_t i = 0; !err && i < m; i++) {
            if (ix->deleted[at + i])
                continue;
            const float *v = (const float *)(c->buf + i * ix->record_stride);
            float inv = ix->p.metric == KD_COSINE ? inv_norm_of(ix, v) : 0;
            top_offer(c->top, ntop, k, exact_dist(ix, qn, v, inv), (uint32_t)(at + i));
        }
    }
    return err;
}

/* ---- search */

struct filter_set {
    uint8_t *allowed;     /* per slot, NULL when no filter */
    uint32_t *rows;       /* allowed live rows */
    size_t nrows;
};

struct accept_ctx {
    const struct kd_index *ix;
    const uint8_t *allowed;
};

static int accept_live(const void *p, uint32_t row)
{
    const struct accept_ctx *a = p;
    return !a->ix->deleted[row] && (!a->allowed || a->allowed[row]);
}

struct estimate_ctx {
    const struct kd_index *ix;
    const struct kd_qcode *qc;
};

static void estimate_rows(void *p, const uint32_t *rows, size_t n, float *out)
{
    const struct estimate_ctx *e = p;
    e->ix->estimate(&e->ix->quant, e->qc, e->ix->codes, rows, n, out);
}

static void prefetch_codes(void *p, const uint32_t *rows, size_t n)
{
    const struct estimate_ctx *e = p;
    size_t size = e->ix->quant.code_size;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *code = e->ix->codes + (size_t)rows[i] * size;
        for (size_t off = 0; off < size; off += 64)
            __builtin_prefetch(code + off);
    }
}

static size_t shortlist_size(const struct kd_index *ix, const struct kd_search_params *sp)
{
    double os = sp->oversample > 0 ? sp->oversample
                                   : kd_default_oversample(ix->p.quantization, ix->p.dim);
    double L = ceil((double)sp->k * os);
    if (L < (double)sp->k)
        L = (double)sp->k;
    return L > 1e7 ? 10000000 : (size_t)L;
}

/* Graph search is worth it unless the filter leaves few vectors: compare code
 * estimates visited (more when the filter rejects most of them) with an exact
 * pass over the allowed ones. */
static int prefer_exact(const struct kd_index *ix, const struct filter_set *f, size_t ef)
{
    if (!f->allowed)
        return 0;
    if (f->nrows == 0 || ix->live == 0)
        return 1;
    double sel = (double)f->nrows / (double)ix->live;
    double graph_cost = 0.1 * (double)ef * ix->graph.m0 / sel + (double)ef;
    double exact_cost = (double)f->nrows * (ix->on_disk ? 4.0 : 1.0);
    return exact_cost <= graph_cost;
}

static int search_one(struct kd_index *ix, struct kd_ctx *c, const float *q,
                      const struct kd_search_params *sp, const struct filter_set *f, float *D,
                      int64_t *I)
{
    size_t k = sp->k, ntop = 0;
    const float *qn = q;
    int err = ctx_top(c, k);
    if (err)
        return err;
    if (ix->p.metric == KD_COSINE) {
        float inv = inv_norm_of(ix, q);
        for (uint32_t i = 0; i < ix->p.dim; i++)
            c->qn[i] = q[i] * inv;
        qn = c->qn;
    }
    size_t L = shortlist_size(ix, sp);
    size_t ef = sp->ef ? sp->ef : DEFAULT_EF;
    if (ef < k)
        ef = k;
    /* A shortlist as large as the index is a full scan anyway. */
    int exact = sp->exact || prefer_exact(ix, f, ef) || ix->graph.entry == KD_NONE ||
                L >= ix->live;
    int done = 0;

    if (!exact) {
        uint64_t t0 = kd_now_ns();
        err = kd_scratch_reserve(&c->s, ix->count, ef, ix->graph.m0);
        if (err)
            return err;
        kd_qcode_prepare(&ix->quant, qn, &c->qc);
        struct estimate_ctx e = {ix, &c->qc};
        struct accept_ctx a = {ix, f->allowed};
        size_t nres = kd_graph_search(&ix->graph, &c->s, ef, L, estimate_rows, prefetch_codes,
                                      &e, accept_live, &a);
        const struct kd_heap_item *res = c->s.out;
        uint64_t t1 = kd_now_ns();
        c->st.graph_ns += t1 - t0;
        if (nres < k && f->allowed && f->nrows > nres) {
            exact = 1;   /* the filter starved the beam: answer exactly */
        } else if (!sp->rerank) {
            for (size_t i = 0; i < nres && i < k; i++)
                c->top[ntop++] = res[i];
            done = 1;
        } else {
            size_t n = nres < L ? nres : L;
            if ((err = ctx_rows(c, n)))
                return err;
            for (size_t i = 0; i < n; i++)
                c->rows[i] = res[i].row;
            uint64_t io0 = c->st.io_wait_ns;
            err = score_rows(ix, c, qn, c->rows, n, k, &ntop);
            if (err)
                return err;
            c->st.rerank_vectors += n;
            c->st.rerank_ns += kd_now_ns() - t1 - (c->st.io_wait_ns - io0);
            done = 1;
        }
    }
    if (!done) {
        c->st.exact_queries++;
        err = exact_scan(ix, c, qn, k, f->allowed ? f->rows : NULL, f->nrows, &ntop);
        if (err)
            return err;
    }
    qsort(c->top, ntop, sizeof *c->top, cmp_heap_item);
    for (size_t i = 0; i < k; i++) {
        if (i < ntop) {
            D[i] = to_user(ix, c->top[i].dist);
            I[i] = ix->ids[c->top[i].row];
        } else {
            D[i] = missing_value(ix);
            I[i] = -1;
        }
    }
    c->st.queries++;
    return 0;
}

struct batch {
    struct kd_index *ix;
    const float *q;
    size_t nq;
    const struct kd_search_params *sp;
    const struct filter_set *f;
    float *D;
    int64_t *I;
    size_t next;
    int err;
    char errmsg[KD_ERRMSG_LEN];
    pthread_mutex_t err_lock;
};

static void *batch_worker(void *arg)
{
    struct batch *b = arg;
    struct kd_ctx *c = ctx_get(b->ix);
    int err = c ? 0 : kd_fail(-ENOMEM, "out of memory for a search");
    while (!err && !__atomic_load_n(&b->err, __ATOMIC_RELAXED)) {
        size_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (i >= b->nq)
            break;
        size_t k = b->sp->k;
        err = search_one(b->ix, c, b->q + i * b->ix->p.dim, b->sp, b->f, b->D + i * k,
                         b->I + i * k);
    }
    if (err) {
        pthread_mutex_lock(&b->err_lock);
        if (!b->err) {
            b->err = err;
            snprintf(b->errmsg, sizeof b->errmsg, "%s", kd_last_error());
        }
        pthread_mutex_unlock(&b->err_lock);
    }
    if (c) {
        stats_add(b->ix, &c->st);
        memset(&c->st, 0, sizeof c->st);
        ctx_put(b->ix, c);
    }
    return NULL;
}

static int check_finite(const float *x, size_t n, uint32_t dim, const char *what)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < dim; j++)
            if (!isfinite(x[i * dim + j]))
                return kd_fail(-EDOM, "%s row %zu contains NaN or Inf", what, i);
    return 0;
}

static int build_filter(struct kd_index *ix, const struct kd_search_params *sp,
                        struct filter_set *f)
{
    memset(f, 0, sizeof *f);
    if (!sp->filter)
        return 0;
    f->allowed = calloc(ix->count ? ix->count : 1, 1);
    f->rows = malloc((sp->nfilter ? sp->nfilter : 1) * sizeof(uint32_t));
    if (!f->allowed || !f->rows)
        return kd_fail(-ENOMEM, "out of memory for the filter");
    for (size_t i = 0; i < sp->nfilter; i++) {
        uint32_t r = kd_idmap_get(&ix->idmap, sp->filter[i]);
        /* Unknown and removed ids simply cannot be returned. */
        if (r == KD_NO_ROW || f->allowed[r])
            continue;
        f->allowed[r] = 1;
        f->rows[f->nrows++] = r;
    }
    return 0;
}

static unsigned resolve_threads(unsigned t)
{
    return t ? t : kd_cpu_count();
}

int kd_index_search(struct kd_index *ix, const float *q, size_t nq,
                    const struct kd_search_params *sp, float *D, int64_t *I)
{
    if (sp->k == 0)
        return kd_fail(-EINVAL, "k must be at least 1");
    int err = check_finite(q, nq, ix->p.dim, "query");
    if (err)
        return err;
    pthread_rwlock_rdlock(&ix->lock);
    struct filter_set f;
    err = build_filter(ix, sp, &f);
    if (!err) {
        struct batch b = {ix, q, nq, sp, &f, D, I, 0, 0, "", PTHREAD_MUTEX_INITIALIZER};
        unsigned threads = resolve_threads(sp->threads);
        if (threads > nq)
            threads = (unsigned)nq;
        kd_run_workers(batch_worker, &b, threads);
        if (b.err) {
            err = b.err;
            kd_set_error_text(b.errmsg);
        }
    }
    free(f.allowed);
    free(f.rows);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

/* ---- construction */

static int index_alloc(struct kd_index **out, const struct kd_index_params *p)
{
    if (p->dim == 0 || p->dim > (1u << 20))
        return kd_fail(-EINVAL, "dim must be between 1 and %u, got %u", 1u << 20, p->dim);
    if (p->metric < KD_L2 || p->metric > KD_COSINE)
        return kd_fail(-EINVAL, "unknown metric");
    if (p->m < 2 || p->m > 256)
        return kd_fail(-EINVAL, "m must be between 2 and 256, got %u", p->m);
    if (!valid_quantization((uint32_t)p->quantization))
        return kd_fail(-EINVAL, "unsupported quantization");
    struct kd_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return kd_fail(-ENOMEM, "out of memory");
    ix->p = *p;
    if (ix->p.ef_construction < ix->p.m)
        ix->p.ef_construction = ix->p.m;
    ix->record_bytes = p->dim * 4;
    ix->record_stride = record_stride_for(p->dim);
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
    struct kd_index *ix;
    int err = index_alloc(&ix, p);
    if (err)
        return err;
    err = kd_quant_init(&ix->quant, (uint32_t)p->quantization, p->dim, p->metric, 1, NULL,
                        NULL, p->seed);
    if (err) {
        kd_index_free(ix);
        return err;
    }
    ix->estimate = kd_estimator(&ix->quant);
    *out = ix;
    return 0;
}

void kd_index_free(struct kd_index *ix)
{
    if (!ix)
        return;
    while (ix->pool) {
        struct kd_ctx *c = ix->pool;
        ix->pool = c->next;
        ctx_free(c);
    }
    if (ix->map) {
        ix->graph.owns = 0;
        munmap(ix->map, ix->map_len);
    } else {
        free(ix->codes);
        free(ix->ids);
    }
    kd_graph_free(&ix->graph);
    free(ix->vectors);
    free(ix->inv_norms);
    free(ix->deleted);
    kd_idmap_free(&ix->idmap);
    kd_quant_free(&ix->quant);
    kd_vecio_close(ix->vio);
    free(ix->path);
    pthread_rwlock_destroy(&ix->lock);
    pthread_mutex_destroy(&ix->pool_lock);
    free(ix);
}

static void normalized(const struct kd_index *ix, const float *x, float *out)
{
    float inv = inv_norm_of(ix, x);
    for (uint32_t i = 0; i < ix->p.dim; i++)
        out[i] = x[i] * inv;
}

int kd_index_train(struct kd_index *ix, const float *x, size_t n)
{
    if (n == 0)
        return 0;
    int err = check_finite(x, n, ix->p.dim, "vector");
    if (err)
        return err;
    uint32_t d = ix->p.dim;
    size_t want = (size_t)KD_MAX_CENTRES * 64, m = n < want ? n : want, step = n / m;
    float *sample = malloc(m * d * sizeof(float));
    if (!sample)
        return kd_fail(-ENOMEM, "out of memory training the quantizer");
    for (size_t i = 0; i < m; i++) {
        const float *v = x + i * step * d;
        if (ix->p.metric == KD_COSINE)
            normalized(ix, v, sample + i * d);
        else
            memcpy(sample + i * d, v, d * sizeof(float));
    }
    pthread_rwlock_wrlock(&ix->lock);
    if (ix->count == 0 && !ix->on_disk) {
        err = kd_quant_train(&ix->quant, sample, m, ix->p.seed);
        ix->trained = !err;
    }
    pthread_rwlock_unlock(&ix->lock);
    free(sample);
    return err;
}

static int grow(struct kd_index *ix, uint64_t need)
{
    if (need <= ix->cap)
        return 0;
    uint64_t cap = ix->cap ? ix->cap : 1024;
    while (cap < need)
        cap *= 2;
    uint32_t d = ix->p.dim;
    float *v = realloc(ix->vectors, cap * d * sizeof(float));
    if (v)
        ix->vectors = v;
    uint8_t *c = realloc(ix->codes, cap * ix->quant.code_size);
    if (c)
        ix->codes = c;
    int64_t *id = realloc(ix->ids, cap * sizeof(int64_t));
    if (id)
        ix->ids = id;
    uint8_t *del = realloc(ix->deleted, cap);
    if (del)
        ix->deleted = del;
    int ok = v && c && id && del;
    if (ok && ix->p.metric == KD_COSINE) {
        float *inv = realloc(ix->inv_norms, cap * sizeof(float));
        if (inv)
            ix->inv_norms = inv;
        ok = inv != NULL;
    }
    if (!ok || kd_graph_reserve(&ix->graph, cap))
        return kd_fail(-ENOMEM, "out of memory growing the index to %llu vectors",
                       (unsigned long long)need);
    ix->cap = cap;
    return 0;
}

struct encode_job {
    struct kd_index *ix;
    uint64_t first, last, next;
};

static void *encode_worker(void *arg)
{
    struct encode_job *j = arg;
    struct kd_index *ix = j->ix;
    uint32_t d = ix->p.dim;
    float *work = malloc(ix->quant.pdim * sizeof(float)), *tmp = malloc(d * sizeof(float));
    for (;;) {
        uint64_t i = __atomic_fetch_add(&j->next, 64, __ATOMIC_RELAXED);
        if (i >= j->last)
            break;
        uint64_t end = i + 64 < j->last ? i + 64 : j->last;
        for (; i < end; i++) {
            const float *v = ix->vectors + i * d;
            if (ix->p.metric == KD_COSINE) {
                ix->inv_norms[i] = inv_norm_of(ix, v);
                for (uint32_t t = 0; t < d; t++)
                    tmp[t] = v[t] * ix->inv_norms[i];
                v = tmp;
            }
            kd_quant_encode(&ix->quant, v, ix->codes + i * ix->quant.code_size, work);
        }
    }
    free(work);
    free(tmp);
    return NULL;
}

static float oracle_pair(void *p, uint32_t a, uint32_t b)
{
    const struct kd_index *ix = p;
    const float *va = ix->vectors + (size_t)a * ix->p.dim, *vb = ix->vectors + (size_t)b * ix->p.dim;
    switch (ix->p.metric) {
    case KD_L2:
        return ix->kern->l2sq(va, vb, ix->p.dim);
    case KD_IP:
        return -ix->kern->dot(va, vb, ix->p.dim);
    default:
        return -ix->kern->dot(va, vb, ix->p.dim) * ix->inv_norms[a] * ix->inv_norms[b];
    }
}

static void oracle_from(void *p, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = oracle_pair(p, a, rows[i]);
}

int kd_index_add(struct kd_index *ix, const float *x, size_t n, const int64_t *ids,
                 unsigned threads)
{
    if (n == 0)
        return 0;
    int err = check_finite(x, n, ix->p.dim, "vector");
    if (err)
        return err;
    if (!ix->trained && (err = kd_index_train(ix, x, n)))
        return err;
    pthread_rwlock_wrlock(&ix->lock);
    uint64_t first = ix->count, last = first + n;
    size_t put = 0;
    if (ix->on_disk) {
        err = kd_fail(-EROFS, "index opened from disk is read-only; use knndirect.load to modify it");
        goto out;
    }
    if (last > UINT32_MAX - 1) {
        err = kd_fail(-EOVERFLOW, "an index holds at most %u vectors", UINT32_MAX - 1);
        goto out;
    }
    if ((err = kd_idmap_reserve(&ix->idmap, n)) || (err = grow(ix, last)))
        goto out;
    for (; put < n; put++) {
        int64_t id = ids ? ids[put] : (int64_t)(first + put);
        if (kd_idmap_put(&ix->idmap, id, (uint32_t)(first + put))) {
            err = kd_fail(-EEXIST, "duplicate id %lld", (long long)id);
            goto out;
        }
        ix->ids[first + put] = id;
    }
    memcpy(ix->vectors + first * ix->p.dim, x, n * ix->p.dim * sizeof(float));
    memset(ix->deleted + first, 0, n);
    struct encode_job job = {ix, first, last, first};
    kd_run_workers(encode_worker, &job, resolve_threads(threads));
    if ((err = kd_graph_prepare(&ix->graph, first, last, ix->p.seed)))
        goto out;
    struct kd_build_oracle o = {oracle_pair, oracle_from, ix};
    err = kd_graph_insert_range(&ix->graph, first, last, ix->p.ef_construction, &o,
                                resolve_threads(threads));
    if (err) {
        /* Lists may already point at the new nodes: the index cannot be rolled
         * back consistently, so keep them and report the error. */
        ix->count = last;
        ix->live += n;
        put = 0;
        goto out;
    }
    ix->count = last;
    ix->live += n;
    put = 0;
out:
    for (size_t i = 0; i < put; i++)
        kd_idmap_del(&ix->idmap, ix->ids[first + i]);
    pthread_rwlock_unlock(&ix->lock);
    return err;
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
            continue;   /* repeated in this call */
        ix->deleted[r] = 1;
        ix->live--;
        kd_idmap_del(&ix->idmap, ids[i]);
    }
out:
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

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
    if (!ix->on_disk) {
        for (size_t i = 0; i < n; i++)
            memcpy((uint8_t *)dst + i * dst_stride, ix->vectors + rows[i] * ix->p.dim,
                   ix->record_bytes);
    } else if (n) {
        struct kd_io_counters io = {0};
        err = kd_vecio_read(ix->vio, rows, n, dst, dst_stride, &io);
        struct kd_stats st = {0};
        st.read_ops = io.read_ops;
        st.read_bytes = io.read_bytes;
        st.io_wait_ns = io.wait_ns;
        stats_add(ix, &st);
    }
out:
    free(rows);
    pthread_rwlock_unlock(&ix->lock);
    return err;
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

/* ---- saving */

static int write_vectors(struct kd_index *ix, struct kd_container_writer *cw)
{
    size_t chunk = (4u << 20) / ix->record_stride;
    chunk = chunk ? chunk : 1;
    size_t align = ix->vio ? kd_vecio_buffer_alignment(ix->vio) : 64;
    uint8_t *buf = kd_alloc_aligned(align, chunk * ix->record_stride);
    if (!buf)
        return kd_fail(-ENOMEM, "out of memory while saving");
    int err = 0;
    for (uint64_t at = 0; !err && at < ix->count; at += chunk) {
        uint64_t m = ix->count - at < chunk ? ix->count - at : chunk;
        if (ix->on_disk) {
            struct kd_io_counters io = {0};
            err = kd_vecio_read_range(ix->vio, at, m, buf, &io);
        } else {
            memset(buf, 0, m * ix->record_stride);
            for (uint64_t i = 0; i < m; i++)
                memcpy(buf + i * ix->record_stride, ix->vectors + (at + i) * ix->p.dim,
                       ix->record_bytes);
        }
        if (!err)
            err = kd_cw_write(cw, buf, m * ix->record_stride);
    }
    kd_free_aligned(buf);
    return err;
}

static int write_section(struct kd_container_writer *cw, uint32_t id, const void *p, size_t n)
{
    int err = kd_cw_section_begin(cw, id);
    if (!err && n)
        err = kd_cw_write(cw, p, n);
    return err ? err : kd_cw_section_end(cw);
}

int kd_index_save(struct kd_index *ix, struct kd_writer *w)
{
    pthread_rwlock_rdlock(&ix->lock);
    struct kd_container_writer cw;
    struct kd_meta meta = {
        ix->p.dim, (uint32_t)ix->p.metric, (uint32_t)ix->p.quantization, ix->p.m,
        ix->graph.m0, ix->p.ef_construction, ix->quant.pdim, ix->quant.code_size,
        ix->record_stride, ix->record_bytes, ix->graph.entry, ix->graph.max_level,
        ix->count, ix->live, ix->p.seed, ix->quant.ncentres, 0,
    };
    uint64_t n = ix->count;
    int err = kd_cw_begin(&cw, w);
    if (!err)
        err = kd_cw_section_begin(&cw, KD_SEC_META);
    if (!err)
        err = kd_cw_write(&cw, &meta, sizeof meta);
    if (!err)
        err = kd_cw_write(&cw, ix->quant.centres,
                          (size_t)ix->quant.ncentres * ix->p.dim * sizeof(float));
    if (!err)
        err = kd_cw_write(&cw, ix->quant.signs, kd_quant_signs_bytes(&ix->quant));
    if (!err)
        err = kd_cw_write(&cw, ix->quant.sq_lo, ix->p.dim * sizeof(float));
    if (!err)
        err = kd_cw_write(&cw, ix->quant.sq_step, ix->p.dim * sizeof(float));
    if (!err)
        err = kd_cw_section_end(&cw);
    if (!err)
        err = write_section(&cw, KD_SEC_IDS, ix->ids, n * sizeof(int64_t));
    if (!err)
        err = write_section(&cw, KD_SEC_DELETED, ix->deleted, n);
    if (!err)
        err = write_section(&cw, KD_SEC_CODES, ix->codes, n * ix->quant.code_size);
    if (!err)
        err = write_section(&cw, KD_SEC_LEVELS, ix->graph.levels, n);
    if (!err)
        err = write_section(&cw, KD_SEC_LEVEL0, ix->graph.level0,
                            n * (1 + ix->graph.m0) * sizeof(uint32_t));
    if (!err)
        err = kd_cw_section_begin(&cw, KD_SEC_UPPER);
    for (uint64_t i = 0; !err && i < n; i++)
        if (ix->graph.levels[i])
            err = kd_cw_write(&cw, ix->graph.upper[i],
                              ix->graph.levels[i] * (1 + ix->graph.m) * sizeof(uint32_t));
    if (!err)
        err = kd_cw_section_end(&cw);
    if (!err)
        err = kd_cw_section_begin(&cw, KD_SEC_VECTORS);
    if (!err)
        err = write_vectors(ix, &cw);
    if (!err)
        err = kd_cw_section_end(&cw);
    if (!err)
        err = kd_cw_finish(&cw);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

static int emit_index(void *arg, struct kd_writer *w) { return kd_index_save(arg, w); }

int kd_index_save_path(struct kd_index *ix, const char *path)
{
    return kd_save_atomic(path, emit_index, ix);
}

/* ---- reading */

struct parsed {
    struct kd_container c;
    struct kd_meta meta;
    const float *centres, *sq_lo, *sq_step;
    const uint8_t *signs;
    const struct kd_section *ids, *deleted, *codes, *levels, *level0, *upper, *vectors;
};

static const uint8_t *sec_data(const struct parsed *p, const struct kd_section *s)
{
    return p->c.base + s->offset;
}

/* Validate that the sections agree with the metadata, so that no offset
 * computed later can leave them. */
static int parse_index(struct parsed *p, const uint8_t *base, uint64_t size, int verify_vectors)
{
    int err = kd_container_parse(&p->c, base, size, verify_vectors ? 0 : 1u << KD_SEC_VECTORS);
    if (err)
        return err;
    const struct kd_section *meta = kd_container_find(&p->c, KD_SEC_META);
#define NEED(field, id)                                                                 \
    if (!(p->field = kd_container_find(&p->c, id)))                                     \
        return kd_fail(-EINVAL, "index file lacks section %d", id);
    NEED(ids, KD_SEC_IDS)
    NEED(deleted, KD_SEC_DELETED)
    NEED(codes, KD_SEC_CODES)
    NEED(levels, KD_SEC_LEVELS)
    NEED(level0, KD_SEC_LEVEL0)
    NEED(upper, KD_SEC_UPPER)
    NEED(vectors, KD_SEC_VECTORS)
#undef NEED
    if (!meta || meta->length < sizeof p->meta)
        return kd_fail(-EINVAL, "index metadata is missing or short");
    memcpy(&p->meta, base + meta->offset, sizeof p->meta);
    const struct kd_meta *m = &p->meta;
    struct kd_quant probe = {0};
    if (m->dim == 0 || m->dim > (1u << 20) || m->metric > KD_COSINE ||
        !valid_quantization(m->quantization) || m->m < 2 || m->m > 256 || m->m0 != 2 * m->m ||
        m->pdim != kd_quant_padded_dim(m->dim) ||
        m->code_size != (m->quantization == KD_Q_1BIT
                             ? m->pdim / 8 + sizeof(struct kd_code_tail)
                             : (m->dim * m->quantization + 7) / 8) ||
        m->record_bytes != m->dim * 4 || m->record_stride < m->record_bytes ||
        m->count >= UINT32_MAX || m->live > m->count || m->max_level > KD_MAX_LEVEL ||
        (m->count && m->entry >= m->count) || (!m->count && m->max_level != -1) ||
        m->ncentres < 1 || m->ncentres > KD_MAX_CENTRES)
        return kd_fail(-EINVAL, "index metadata is inconsistent");
    probe.pdim = m->pdim;
    size_t extra = ((size_t)m->ncentres + 2) * m->dim * sizeof(float) +
                   kd_quant_signs_bytes(&probe);
    if (meta->length != sizeof *m + extra)
        return kd_fail(-EINVAL, "index metadata has the wrong size");
    p->centres = (const float *)(base + meta->offset + sizeof *m);
    p->signs = base + meta->offset + sizeof *m + (size_t)m->ncentres * m->dim * sizeof(float);
    p->sq_lo = (const float *)(p->signs + kd_quant_signs_bytes(&probe));
    p->sq_step = p->sq_lo + m->dim;
    uint64_t n = m->count;
    if (p->ids->length != n * 8 || p->deleted->length != n || p->codes->length != n * m->code_size ||
        p->levels->length != n || p->level0->length != n * (1 + m->m0) * 4 ||
        p->vectors->length != n * m->record_stride)
        return kd_fail(-EINVAL, "index sections do not match the vector count");
    const uint8_t *lv = sec_data(p, p->levels);
    uint64_t upper = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (lv[i] > KD_MAX_LEVEL || (int32_t)lv[i] > m->max_level)
            return kd_fail(-EINVAL, "index graph is corrupted (bad level)");
        upper += lv[i];
    }
    if (p->upper->length != upper * (1 + m->m) * 4)
        return kd_fail(-EINVAL, "index graph is corrupted (upper levels)");
    const uint32_t *l0 = (const uint32_t *)sec_data(p, p->level0);
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t *l = l0 + i * (1 + m->m0);
        if (l[0] > m->m0)
            return kd_fail(-EINVAL, "index graph is corrupted (list length)");
        for (uint32_t j = 1; j <= l[0]; j++)
            if (l[j] >= n)
                return kd_fail(-EINVAL, "index graph is corrupted (neighbour out of range)");
    }
    const uint32_t *up = (const uint32_t *)sec_data(p, p->upper);
    for (uint64_t i = 0; i < upper; i++) {
        const uint32_t *l = up + i * (1 + m->m);
        if (l[0] > m->m)
            return kd_fail(-EINVAL, "index graph is corrupted (list length)");
        for (uint32_t j = 1; j <= l[0]; j++)
            if (l[j] >= n)
                return kd_fail(-EINVAL, "index graph is corrupted (neighbour out of range)");
    }
    return 0;
}

/* Common part of load and open: parameters, quantizer, ids, tombstones. */
static int index_from_parsed(struct kd_index **out, const struct parsed *p)
{
    const struct kd_meta *m = &p->meta;
    struct kd_index_params params = {m->dim, (int)m->metric, m->m, m->ef_construction,
                                      (int)m->quantization, m->seed};
    struct kd_index *ix;
    int err = index_alloc(&ix, &params);
    if (err)
        return err;
    if ((err = kd_quant_init(&ix->quant, m->quantization, m->dim, (int)m->metric, m->ncentres,
                             p->centres, p->signs, 0)))
        goto fail;
    kd_quant_set_ranges(&ix->quant, p->sq_lo, p->sq_step);
    ix->estimate = kd_estimator(&ix->quant);
    ix->record_stride = m->record_stride;
    ix->trained = 1;
    ix->count = ix->cap = m->count;
    ix->live = m->live;
    ix->deleted = malloc(m->count ? m->count : 1);
    if (!ix->deleted || (err = kd_idmap_init(&ix->idmap, m->live)) ||
        (err = kd_graph_reserve(&ix->graph, m->count ? m->count : 1))) {
        err = err ? err : kd_fail(-ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(ix->deleted, sec_data(p, p->deleted), m->count);
    const int64_t *ids = (const int64_t *)sec_data(p, p->ids);
    uint64_t live = 0;
    for (uint64_t i = 0; i < m->count; i++) {
        if (ix->deleted[i])
            continue;
        live++;
        if (kd_idmap_put(&ix->idmap, ids[i], (uint32_t)i)) {
            err = kd_fail(-EINVAL, "index file is corrupted (duplicate id)");
            goto fail;
        }
    }
    if (live != m->live) {
        err = kd_fail(-EINVAL, "index file is corrupted (live count)");
        goto fail;
    }
    ix->graph.count = m->count;
    ix->graph.entry = m->count ? m->entry : KD_NONE;
    ix->graph.max_level = m->max_level;
    *out = ix;
    return 0;
fail:
    kd_index_free(ix);
    return err;
}

int kd_index_load(struct kd_index **out, const uint8_t *data, size_t size)
{
    struct parsed p;
    int err = parse_index(&p, data, size, 1);
    if (err)
        return err;
    struct kd_index *ix;
    if ((err = index_from_parsed(&ix, &p)))
        return err;
    const struct kd_meta *m = &p.meta;
    uint64_t n = m->count;
    struct kd_graph *g = &ix->graph;
    /* The owned layout uses the packed in-memory stride. */
    ix->record_stride = record_stride_for(m->dim);
    ix->cap = 0;
    ix->count = 0;
    free(ix->deleted);
    ix->deleted = NULL;
    if ((err = grow(ix, n ? n : 1)))
        goto fail;
    ix->count = n;
    memcpy(ix->deleted, sec_data(&p, p.deleted), n);
    memcpy(ix->ids, sec_data(&p, p.ids), n * 8);
    memcpy(ix->codes, sec_data(&p, p.codes), n * m->code_size);
    memcpy(g->levels, sec_data(&p, p.levels), n);
    memcpy(g->level0, sec_data(&p, p.level0), n * (1 + m->m0) * 4);
    memset(g->locks, 0, n);
    memset(g->upper, 0, n * sizeof *g->upper);
    const uint32_t *up = (const uint32_t *)sec_data(&p, p.upper);
    for (uint64_t i = 0; i < n; i++) {
        g->upper[i] = NULL;
        size_t words = (size_t)g->levels[i] * (1 + m->m);
        if (!words)
            continue;
        if (!(g->upper[i] = malloc(words * 4))) {
            err = kd_fail(-ENOMEM, "out of memory loading the graph");
            goto fail;
        }
        memcpy(g->upper[i], up, words * 4);
        up += words;
    }
    const uint8_t *vec = sec_data(&p, p.vectors);
    for (uint64_t i = 0; i < n; i++) {
        memcpy(ix->vectors + i * m->dim, vec + i * m->record_stride, m->record_bytes);
        if (ix->inv_norms)
            ix->inv_norms[i] = inv_norm_of(ix, ix->vectors + i * m->dim);
    }
    *out = ix;
    return 0;
fail:
    kd_index_free(ix);
    return err;
}

static void advise(uint8_t *map, const struct kd_section *s, unsigned preload)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uint8_t *start = map + s->offset;
    uintptr_t a = (uintptr_t)start & ~(page - 1);
    size_t len = (size_t)((uintptr_t)start + s->length - a);
    if (!len)
        return;
    madvise((void *)a, len, (preload >> s->id & 1) ? MADV_WILLNEED : MADV_RANDOM);
}

int kd_index_open(struct kd_index **out, const char *path, const struct kd_open_params *op)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return kd_fail(-e, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    int err = 0;
    uint8_t *map = MAP_FAILED;
    struct kd_index *ix = NULL;
    if (fstat(fd, &st) != 0) {
        err = kd_fail(-errno, "cannot stat %s", path);
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        err = kd_fail(-EISDIR, "%s is a directory, not an index file", path);
        goto fail;
    }
    if ((uint64_t)st.st_size < KD_BLOCK + KD_TAIL_BYTES) {
        err = kd_fail(-EINVAL, "%s is not a knndirect index (too small)", path);
        goto fail;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        err = kd_fail(-e, "cannot map %s: %s", path, strerror(e));
        goto fail;
    }
    struct parsed p;
    if ((err = parse_index(&p, map, (uint64_t)st.st_size, 0))) {
        char msg[KD_ERRMSG_LEN];
        snprintf(msg, sizeof msg, "%s: %s", path, kd_last_error());
        kd_set_error_text(msg);
        goto fail;
    }
    if ((err = index_from_parsed(&ix, &p)))
        goto fail;
    ix->map = map;
    ix->map_len = (size_t)st.st_size;
    map = MAP_FAILED;
    ix->on_disk = 1;
    ix->loaded_from_file = 1;
    ix->codes = (uint8_t *)sec_data(&p, p.codes);
    ix->ids = (int64_t *)sec_data(&p, p.ids);
    struct kd_graph *g = &ix->graph;
    g->owns = 0;
    free(g->level0);
    free(g->levels);
    g->level0 = (uint32_t *)sec_data(&p, p.level0);
    g->levels = (uint8_t *)sec_data(&p, p.levels);
    const uint32_t *up = (const uint32_t *)sec_data(&p, p.upper);
    for (uint64_t i = 0; i < ix->count; i++) {
        g->upper[i] = g->levels[i] ? (uint32_t *)up : NULL;
        up += (size_t)g->levels[i] * (1 + g->m);
    }
    for (uint32_t i = 0; i < p.c.nsections; i++)
        if (p.c.sections[i].id != KD_SEC_VECTORS)
            advise(ix->map, &p.c.sections[i], op->preload);
    if (!(ix->path = strdup(path))) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto fail;
    }
    if (ix->count) {
        struct kd_vecio_config vc = {path, p.vectors->offset, ix->count, ix->record_stride,
                                     ix->record_bytes, op->io_backend, op->direct_io,
                                     op->io_depth ? op->io_depth : 1};
        if ((err = kd_vecio_open(&ix->vio, &vc)))
            goto fail;
        if (op->preload >> KD_SEC_VECTORS & 1)
            posix_fadvise(fd, (off_t)p.vectors->offset, (off_t)p.vectors->length,
                          POSIX_FADV_WILLNEED);
    }
    close(fd);
    *out = ix;
    return 0;
fail:
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    kd_index_free(ix);
    close(fd);
    return err;
}

int kd_index_verify(struct kd_index *ix)
{
    if (!ix->map)
        return 0;
    struct parsed p;
    pthread_rwlock_rdlock(&ix->lock);
    int err = parse_index(&p, ix->map, ix->map_len, 1);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

/* ---- reporting */

static uint64_t resident_bytes(const struct kd_index *ix)
{
    uint64_t n = ix->count, b = 0;
    b += n * ix->quant.code_size + n * sizeof(int64_t) + n;          /* codes, ids, levels */
    b += n * (1 + ix->graph.m0) * sizeof(uint32_t);                  /* level 0 */
    b += n * sizeof(uint32_t *) + n;                                 /* upper pointers, tombstones */
    for (uint64_t i = 0; i < n; i++)
        b += (uint64_t)ix->graph.levels[i] * (1 + ix->graph.m) * sizeof(uint32_t);
    b += kd_idmap_bytes(&ix->idmap);
    if (!ix->on_disk) {
        b += n * ix->record_bytes + n;                               /* vectors, build locks */
        if (ix->inv_norms)
            b += n * sizeof(float);
    }
    return b;
}

void kd_index_info(struct kd_index *ix, struct kd_info *info)
{
    pthread_rwlock_rdlock(&ix->lock);
    memset(info, 0, sizeof *info);
    info->params = ix->p;
    info->count = ix->live;
    info->slots = ix->count;
    info->on_disk = ix->on_disk;
    info->loaded_from_file = ix->loaded_from_file;
    info->path = ix->path;
    info->record_size = ix->on_disk ? ix->record_stride : record_stride_for(ix->p.dim);
    info->code_size = ix->quant.code_size;
    info->resident_bytes = resident_bytes(ix);
    if (ix->vio)
        kd_vecio_get_info(ix->vio, &info->io);
    info->default_oversample = kd_default_oversample(ix->p.quantization, ix->p.dim);
    info->default_ef = DEFAULT_EF;
    pthread_rwlock_unlock(&ix->lock);
}

void kd_index_stats(struct kd_index *ix, struct kd_stats *st, int reset)
{
    uint64_t *src = (uint64_t *)&ix->st, *dst = (uint64_t *)st;
    for (size_t i = 0; i < sizeof *st / sizeof(uint64_t); i++)
        dst[i] = reset ? __atomic_exchange_n(&src[i], 0, __ATOMIC_RELAXED)
                       : __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

uint64_t kd_index_count(struct kd_index *ix)
{
    return __atomic_load_n(&ix->live, __ATOMIC_RELAXED);
}

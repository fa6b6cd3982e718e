#include "index.h"
#include "common.h"
#include "distance.h"
#include "exact.h"
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
#define EARLY_WAVES 3   /* see struct early_plan */

/* Per-thread search state, pooled on the index. */
struct kd_ctx {
    struct kd_ctx *next;
    struct kd_search_scratch s;
    struct kd_qcode qc;
    float *qn;                    /* normalized query (cosine) */
    uint8_t *buf;                 /* aligned records for reranking */
    size_t buf_rows;
    uint32_t *rows;               /* the shortlist */
    uint64_t *rows64;             /* the same, as record numbers to read */
    size_t rows_cap;
    struct kd_heap_item *top;     /* exact top-k */
    size_t top_cap;
    struct kd_stats st;
    /* A query between its two phases. */
    const float *q;               /* as searched (normalized for cosine) */
    size_t nshort, ntop;
    int finished;                 /* top-k is final, no reads outstanding */
    struct kd_vecio_pending *reads;
    uint64_t t_graph;             /* when the graph search ended */
    /* Early reads: the likeliest part of the shortlist, read in waves while
     * the beam is still running. They are rows[0..nearly) and the first
     * slots of buf; early_sorted holds the same rows in order, for lookups. */
    struct kd_vecio_pending *early[EARLY_WAVES];
    size_t nearly;
    struct kd_heap_item *pick;    /* scratch for choosing them */
    uint32_t *early_sorted;
    size_t pick_cap;
    float expand_ratio;           /* level-0 expansions per ef, running mean; 0 unknown */
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
    int read_early;               /* early reads pay off (io_uring) */
    unsigned searching;           /* with read_early: queries between query_begin and query_end */

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
    /* 1-bit estimates carry one bit per dimension: the fewer dimensions, the
     * noisier the ranking and the deeper the shortlist must go. Measured on
     * 100k clustered vectors with ef 64: recall@10 0.975 at d=128 with 20,
     * 0.968 at d=384 with 10; at d=768, 5 gave 0.944. */
    uint32_t pdim = kd_quant_padded_dim(dim);
    if (pdim <= 128)
        return 20.0;
    if (pdim <= 512)
        return 10.0;
    return 8.0;
}

static int valid_quantization(uint32_t q)
{
    return q == KD_Q_1BIT || q == KD_Q_4BIT || q == KD_Q_8BIT;
}

static unsigned resolve_threads(unsigned t)
{
    return t ? t : kd_cpu_count();
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
    free(c->pick);
    free(c->early_sorted);
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
    if (r)
        c->rows = r;
    uint64_t *r64 = realloc(c->rows64, n * sizeof *r64);
    if (r64)
        c->rows64 = r64;
    if (!r || !r64)
        return kd_fail(-ENOMEM, "out of memory for a search");
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

static int ctx_pick(struct kd_ctx *c, size_t n)
{
    if (n <= c->pick_cap)
        return 0;
    struct kd_heap_item *p = realloc(c->pick, n * sizeof *p);
    if (p)
        c->pick = p;
    uint32_t *r = realloc(c->early_sorted, n * sizeof *r);
    if (r)
        c->early_sorted = r;
    if (!p || !r)
        return kd_fail(-ENOMEM, "out of memory for a search");
    c->pick_cap = n;
    return 0;
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

/* Score the shortlist in memory: rows are scattered, so keep a few vectors
 * in flight ahead of the one being scored. */
static void score_in_memory(struct kd_index *ix, struct kd_ctx *c, size_t k)
{
    size_t lines = ix->record_bytes / 64 < 8 ? ix->record_bytes / 64 : 8;
    const uint32_t *rows = c->rows;
    for (size_t i = 0; i < c->nshort; i++) {
        if (i + 4 < c->nshort) {
            const char *ahead = (const char *)(ix->vectors + (size_t)rows[i + 4] * ix->p.dim);
            for (size_t l = 0; l < lines; l++)
                __builtin_prefetch(ahead + 64 * l);
        }
        const float *v = ix->vectors + (size_t)rows[i] * ix->p.dim;
        float inv = ix->inv_norms ? ix->inv_norms[rows[i]] : 0;
        kd_topk_offer(c->top, &c->ntop, k, exact_dist(ix, c->q, v, inv), rows[i]);
    }
}

/* Score the shortlist records that the batch read left in c->buf. */
static void score_read(struct kd_index *ix, struct kd_ctx *c, size_t k)
{
    for (size_t i = 0; i < c->nshort; i++) {
        const float *v = (const float *)(c->buf + i * ix->record_stride);
        float inv = ix->p.metric == KD_COSINE ? inv_norm_of(ix, v) : 0;
        kd_topk_offer(c->top, &c->ntop, k, exact_dist(ix, c->q, v, inv), c->rows[i]);
    }
}

/* ---- search */

struct filter_set {
    uint8_t *allowed;     /* per slot, NULL when no filter */
    uint32_t *rows;       /* allowed live rows */
    size_t nrows;
};

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
        /* every line the code touches: codes do not start on line bounds */
        uintptr_t at = (uintptr_t)(e->ix->codes + (size_t)rows[i] * size);
        for (uintptr_t line = at & ~(uintptr_t)63; line < at + size; line += 64)
            __builtin_prefetch((const void *)line);
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

static const float *normalized_query(const struct kd_index *ix, const float *q, float *buf)
{
    if (ix->p.metric != KD_COSINE)
        return q;
    float inv = inv_norm_of(ix, q);
    for (uint32_t i = 0; i < ix->p.dim; i++)
        buf[i] = q[i] * inv;
    return buf;
}

static void write_results(const struct kd_index *ix, const struct kd_heap_item *top,
                          size_t ntop, size_t k, float *D, int64_t *I)
{
    for (size_t i = 0; i < k; i++) {
        if (i < ntop) {
            D[i] = to_user(ix, top[i].dist);
            I[i] = ix->ids[top[i].row];
        } else {
            D[i] = missing_value(ix);
            I[i] = -1;
        }
    }
}

static struct kd_exact_data exact_data(const struct kd_index *ix)
{
    struct kd_exact_data d = {ix->p.metric, ix->p.dim, ix->on_disk ? NULL : ix->vectors,
                              ix->vio, ix->record_stride, ix->deleted, ix->count, ix->kern};
    return d;
}

/* Early reads. Partway through the beam, the best part of the shortlist it
 * holds rarely changes any more: those records are read while the beam goes
 * on, and after it only the rest of the final shortlist. A record read early
 * that drops out of the shortlist is re-scored all the same (its exact
 * distance is as good as any) and counted as early_unused.
 *
 * A search alone reads in three waves: the best quarter of the shortlist
 * at a quarter of the expansions a search usually makes, the best half (less
 * what is in flight) at half, three quarters at three quarters. Searches
 * that share the device with others read once, half at half: their reads
 * queue behind the others' anyway, and each wave costs a submission. At 1M x
 * 768, 80 reads per query, single stream p50: once 0.59 ms, three waves 0.55
 * (0.8 of 60 early reads unused); 8 concurrent streams: 1,945 q/s reading
 * once, 1,855 in three waves. */
struct early_plan {
    int waves;
    double at[EARLY_WAVES], share[EARLY_WAVES];
};
static const struct early_plan early_alone = {3, {0.25, 0.5, 0.75}, {0.25, 0.5, 0.75}},
                               early_shared = {1, {0.5}, {0.5}};

struct early_job {
    struct kd_index *ix;
    struct kd_ctx *c;
    const struct early_plan *plan;
    struct kd_search_early *hook;
    size_t L, ef, most;   /* most: early reads the buffer has room for */
    int wave;
};

static size_t early_after(const struct early_job *j)
{
    return j->wave < j->plan->waves
               ? (size_t)(j->plan->at[j->wave] * j->c->expand_ratio * (double)j->ef)
               : SIZE_MAX;
}

static inline int closer(const struct kd_heap_item *x, const struct kd_heap_item *y)
{
    return x->dist < y->dist || (x->dist == y->dist && x->row < y->row);
}

/* Move the m closest of a[0..n) to a[0..m), in no particular order
 * (quickselect: the waves need the set, and a sort of an ef-sized beam three
 * times a query is not free). Rows are distinct, so no two items tie. */
static void select_closest(struct kd_heap_item *a, size_t n, size_t m)
{
    size_t lo = 0, hi = n;
    while (lo < m && m < hi && hi - lo > 1) {
        struct kd_heap_item pivot = a[lo + (hi - lo) / 2], t;
        size_t lt = lo, i = lo, gt = hi;   /* [lo,lt) < pivot, [gt,hi) > pivot */
        while (i < gt) {
            if (closer(&a[i], &pivot)) {
                t = a[lt], a[lt++] = a[i], a[i++] = t;
            } else if (closer(&pivot, &a[i])) {
                t = a[--gt], a[gt] = a[i], a[i] = t;
            } else {
                i++;
            }
        }
        if (m <= lt)
            hi = lt;
        else if (m >= gt)
            lo = gt;
        else
            break;
    }
}

static int by_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int read_early(const struct kd_ctx *c, uint32_t row)
{
    return c->nearly && bsearch(&row, c->early_sorted, c->nearly, sizeof row, by_u32);
}

/* kd_search_early callback: read the best of the shortlist found so far that
 * is not in flight yet, then arm the next wave. */
static void start_early_reads(void *arg, const struct kd_heap_item *best, size_t n)
{
    struct early_job *j = arg;
    struct kd_ctx *c = j->c;
    int w = j->wave++;
    size_t want = (size_t)ceil(j->plan->share[w] * (double)j->L), fresh = 0, at = c->nearly;
    if (want > n)
        want = n;
    memcpy(c->pick, best, n * sizeof *best);
    select_closest(c->pick, n, want);
    for (size_t i = 0; i < want && at + fresh < j->most; i++)
        if (!read_early(c, c->pick[i].row)) {
            c->rows[at + fresh] = c->pick[i].row;
            c->rows64[at + fresh++] = c->pick[i].row;
        }
    /* On failure the final batch simply reads them. */
    if (fresh && kd_vecio_submit(j->ix->vio, c->rows64 + at, fresh,
                                 c->buf + at * j->ix->record_stride, j->ix->record_stride,
                                 &c->early[w]) == 0) {
        memcpy(c->early_sorted + at, c->rows + at, fresh * sizeof *c->rows);
        c->nearly += fresh;
        qsort(c->early_sorted, c->nearly, sizeof *c->rows, by_u32);
    }
    size_t next = early_after(j), now = j->hook->after;
    j->hook->after = next > now ? next : now + 1;
}

/* The final shortlist res[0..n): rows read early stay at the front; the others
 * follow them and go out as one batch. */
static int read_shortlist(struct kd_index *ix, struct kd_ctx *c, const struct kd_heap_item *res,
                          size_t n)
{
    size_t total = c->nearly, used = 0;
    for (size_t i = 0; i < n; i++) {
        if (read_early(c, res[i].row)) {
            used++;
            continue;
        }
        c->rows[total] = res[i].row;
        c->rows64[total++] = res[i].row;
    }
    c->st.early_reads += c->nearly;
    c->st.early_unused += c->nearly - used;
    c->nshort = total;
    c->finished = total == 0;
    if (total == c->nearly)
        return 0;
    int err = kd_vecio_submit(ix->vio, c->rows64 + c->nearly, total - c->nearly,
                              c->buf + c->nearly * ix->record_stride, ix->record_stride,
                              &c->reads);
    c->finished = err != 0;
    return err;
}

/* Phase one of a query: the graph search over codes. It leaves the
 * shortlist's reads in flight (on disk), or the answer final. */
static int query_begin(struct kd_index *ix, struct kd_ctx *c, const float *q,
                       const struct kd_search_params *sp, const struct filter_set *f)
{
    size_t k = sp->k;
    /* Counted only where it chooses how to read early: one shared write less
     * per query elsewhere. */
    unsigned searching = ix->read_early ? __atomic_add_fetch(&ix->searching, 1, __ATOMIC_RELAXED)
                                        : 0;
    c->ntop = c->nshort = c->nearly = 0;
    c->finished = 1;
    int err = ctx_top(c, k);
    if (err)
        return err;
    c->q = normalized_query(ix, q, c->qn);
    size_t L = shortlist_size(ix, sp), ef = sp->ef ? sp->ef : DEFAULT_EF;
    if (ef < k)
        ef = k;
    if (ef > ix->count && ix->count >= k)   /* a beam never holds more nodes than there are */
        ef = (size_t)ix->count;
    uint64_t t0 = kd_now_ns();
    if ((err = kd_scratch_reserve(&c->s, ix->count, ef, ix->graph.m0)))
        return err;
    /* Room for the shortlist and the early reads, taken before any is in flight. */
    int reading = ix->on_disk && sp->rerank, early_ok = reading && ix->read_early;
    const struct early_plan *plan = searching > 1 ? &early_shared : &early_alone;
    struct kd_search_early early = {SIZE_MAX, start_early_reads, NULL, 0};
    size_t most_early = early_ok ? (size_t)ceil(plan->share[plan->waves - 1] * (double)L) : 0;
    struct early_job job = {ix, c, plan, &early, L, ef, most_early, 0};
    early.arg = &job;
    if (reading && ((err = ctx_rows(c, L + most_early)) || (err = ctx_buf(ix, c, L + most_early)) ||
                    (early_ok && (err = ctx_pick(c, ef > L ? ef : L)))))
        return err;
    if (early_ok && c->expand_ratio > 0)
        early.after = early_after(&job);
    kd_qcode_prepare(&ix->quant, c->q, &c->qc);
    struct estimate_ctx e = {ix, &c->qc};
    /* Searches hold the read lock, so live and count are stable here; with
     * nothing removed the tombstones need not be read per scored node. */
    struct kd_accept a = {ix->live < ix->count ? ix->deleted : NULL, f->allowed};
    size_t nres = kd_graph_search(&ix->graph, &c->s, ef, L, estimate_rows, prefetch_codes, &e,
                                  &a, &early);
    float ratio = (float)early.expansions / (float)ef;
    c->expand_ratio = c->expand_ratio > 0 ? 0.9f * c->expand_ratio + 0.1f * ratio : ratio;
    const struct kd_heap_item *res = c->s.out;
    c->t_graph = kd_now_ns();
    c->st.graph_ns += c->t_graph - t0;
    if (nres < k && f->allowed && f->nrows > nres) {
        /* The filter starved the beam: answer this query exactly (early
         * reads, if any, are reaped unused by query_end). */
        struct kd_exact_data d = exact_data(ix);
        struct kd_io_counters io = {0, 0, 0};
        err = kd_exact_search(&d, c->q, 1, k, f->rows, f->nrows, 1, c->top, &c->ntop, &io);
        c->st.read_ops += io.read_ops;
        c->st.read_bytes += io.read_bytes;
        c->st.io_wait_ns += io.wait_ns;
        c->st.exact_queries++;
        c->st.early_reads += c->nearly;
        c->st.early_unused += c->nearly;
        return err;
    }
    if (!sp->rerank) {
        for (; c->ntop < nres && c->ntop < k; c->ntop++)
            c->top[c->ntop] = res[c->ntop];
        return 0;
    }
    size_t n = nres < L ? nres : L;
    if (ix->on_disk)
        return read_shortlist(ix, c, res, n);
    c->nshort = n;
    if ((err = ctx_rows(c, n)))
        return err;
    for (size_t i = 0; i < n; i++)
        c->rows[i] = res[i].row;
    score_in_memory(ix, c, k);
    c->st.rerank_ns += kd_now_ns() - c->t_graph;
    return 0;
}

/* Phase two: wait for the shortlist's records, rescore, write the answer.
 * Always called after query_begin, so reads in flight are reaped even when
 * the answer is not wanted (skip). */
static int query_end(struct kd_index *ix, struct kd_ctx *c, const struct kd_search_params *sp,
                     float *D, int64_t *I, int skip)
{
    int err = 0;
    if (ix->read_early)
        __atomic_sub_fetch(&ix->searching, 1, __ATOMIC_RELAXED);
    if (c->nearly || !c->finished) {
        /* Early reads alone, the answer already final (the exact fallback
         * after a starved beam), are reaped and not scored. */
        int score = !c->finished;
        struct kd_io_counters io = {0, 0, 0};
        for (int w = 0; w < EARLY_WAVES; w++)
            if (c->early[w]) {
                int e = kd_vecio_complete(c->early[w], &io);
                c->early[w] = NULL;
                err = err ? err : e;
            }
        if (c->reads) {
            int e = kd_vecio_complete(c->reads, &io);
            c->reads = NULL;
            err = err ? err : e;
        }
        c->finished = 1;
        c->st.read_ops += io.read_ops;
        c->st.read_bytes += io.read_bytes;
        c->st.io_wait_ns += io.wait_ns;
        if (!err && !skip && score) {
            uint64_t t0 = kd_now_ns();
            score_read(ix, c, sp->k);
            c->st.rerank_ns += kd_now_ns() - t0;
        }
    }
    if (err || skip)
        return err;
    c->st.rerank_vectors += c->nshort;
    kd_topk_sort(c->top, c->ntop);
    write_results(ix, c->top, c->ntop, sp->k, D, I);
    c->st.queries++;
    return 0;
}

/* Brute force for a whole batch: one pass over the data serves all queries. */
static int search_exact(struct kd_index *ix, const float *q, size_t nq,
                        const struct kd_search_params *sp, const struct filter_set *f, float *D,
                        int64_t *I)
{
    size_t k = sp->k, dim = ix->p.dim;
    float *qn = NULL;
    struct kd_heap_item *top = malloc(nq * k * sizeof *top);
    size_t *ntop = malloc(nq * sizeof *ntop);
    int err = top && ntop ? 0 : kd_fail(-ENOMEM, "out of memory for an exact search");
    if (!err && ix->p.metric == KD_COSINE) {
        if (!(qn = malloc(nq * dim * sizeof *qn)))
            err = kd_fail(-ENOMEM, "out of memory for an exact search");
        for (size_t i = 0; !err && i < nq; i++)
            normalized_query(ix, q + i * dim, qn + i * dim);
    }
    struct kd_stats st = {0};
    int nothing = ix->live == 0 || (f->allowed && f->nrows == 0);
    if (!err && nothing) {
        memset(ntop, 0, nq * sizeof *ntop);
    } else if (!err) {
        struct kd_exact_data d = exact_data(ix);
        struct kd_io_counters io = {0, 0, 0};
        err = kd_exact_search(&d, qn ? qn : q, nq, k, f->allowed ? f->rows : NULL, f->nrows,
                              resolve_threads(sp->threads), top, ntop, &io);
        st.read_ops = io.read_ops;
        st.read_bytes = io.read_bytes;
        st.io_wait_ns = io.wait_ns;
    }
    for (size_t i = 0; !err && i < nq; i++)
        write_results(ix, top + i * k, ntop[i], k, D + i * k, I + i * k);
    if (!err) {
        st.queries = st.exact_queries = nq;
        stats_add(ix, &st);
    }
    free(top);
    free(ntop);
    free(qn);
    return err;
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

/* Each worker keeps two queries going on disk: while the shortlist of one
 * is being read, the graph search of the next one runs. */
static void *batch_worker(void *arg)
{
    struct batch *b = arg;
    struct kd_index *ix = b->ix;
    struct kd_ctx *c[2] = {ctx_get(ix), ctx_get(ix)};
    size_t k = b->sp->k, pending = SIZE_MAX;
    int cur = 0, err = c[0] && c[1] ? 0 : kd_fail(-ENOMEM, "out of memory for a search");
    for (;;) {
        size_t i = SIZE_MAX;
        if (!err && !__atomic_load_n(&b->err, __ATOMIC_RELAXED)) {
            i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
            if (i >= b->nq)
                i = SIZE_MAX;
        }
        if (i != SIZE_MAX)
            err = query_begin(ix, c[cur], b->q + i * ix->p.dim, b->sp, b->f);
        if (pending != SIZE_MAX) {
            int e = query_end(ix, c[!cur], b->sp, b->D + pending * k, b->I + pending * k,
                              err != 0);
            err = err ? err : e;
        }
        if (i == SIZE_MAX || err) {
            if (i != SIZE_MAX)   /* reap what query_begin may have left in flight */
                query_end(ix, c[cur], b->sp, NULL, NULL, 1);
            break;
        }
        pending = i;
        cur = !cur;
    }
    if (err) {
        pthread_mutex_lock(&b->err_lock);
        if (!b->err) {
            b->err = err;
            snprintf(b->errmsg, sizeof b->errmsg, "%s", kd_last_error());
        }
        pthread_mutex_unlock(&b->err_lock);
    }
    for (int j = 0; j < 2; j++)
        if (c[j]) {
            stats_add(ix, &c[j]->st);
            memset(&c[j]->st, 0, sizeof c[j]->st);
            ctx_put(ix, c[j]);
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
    size_t L = shortlist_size(ix, sp), ef = sp->ef ? sp->ef : DEFAULT_EF;
    /* A shortlist as large as the index is a full scan anyway. */
    int exact = sp->exact || ix->graph.entry == KD_NONE || L >= ix->live ||
                prefer_exact(ix, &f, ef > L ? ef : L);
    if (!err && exact) {
        err = search_exact(ix, q, nq, sp, &f, D, I);
    } else if (!err) {
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
        err = kd_quant_train(&ix->quant, sample, m, ix->p.seed, kd_cpu_count());
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
    struct kd_build_oracle o = {oracle_from, ix};
    err = kd_graph_insert_range(&ix->graph, first, last, ix->p.ef_construction, &o,
                                resolve_threads(threads));
    if (err) {
        /* Lists may already point at the new nodes: the index cannot be rolled
         * back consistently, so keep them and report the error. */
        ix->count = last;
        __atomic_fetch_add(&ix->live, n, __ATOMIC_RELAXED);   /* kd_index_count reads it unlocked */
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
    return err;
}

void kd_index_contains(struct kd_index *ix, const int64_t *ids, size_t n, uint8_t *out)
{
    pthread_rwlock_rdlock(&ix->lock);
    for (size_t i = 0; i < n; i++)
        out[i] = kd_idmap_get(&ix->idmap, ids[i]) != KD_NO_ROW;
    pthread_rwlock_unlock(&ix->lock);
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
        __atomic_fetch_sub(&ix->live, 1, __ATOMIC_RELAXED);
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
    const size_t piece = 4u << 20;
    if (!ix->on_disk && ix->record_stride == ix->record_bytes) {
        /* Packed in memory exactly as in the file: written from the array. */
        const uint8_t *p = (const uint8_t *)ix->vectors;
        uint64_t total = ix->count * ix->record_bytes;
        int err = 0;
        for (uint64_t at = 0; !err && at < total; at += piece)
            err = kd_cw_write(cw, p + at, total - at < piece ? (size_t)(total - at) : piece);
        return err;
    }
    size_t chunk = piece / ix->record_stride;
    chunk = chunk ? chunk : 1;
    size_t align = ix->vio ? kd_vecio_buffer_alignment(ix->vio) : 64;
    uint8_t *buf = kd_alloc_aligned(align, chunk * ix->record_stride);
    if (!buf)
        return kd_fail(-ENOMEM, "out of memory while saving");
    int err = 0;
    for (uint64_t at = 0; !err && at < ix->count; at += chunk) {
        uint64_t m = ix->count - at < chunk ? ix->count - at : chunk;
        if (ix->on_disk) {
            /* A range read leaves the padding of its last record unset. */
            struct kd_io_counters io = {0};
            memset(buf, 0, m * ix->record_stride);
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

/* Sections are written in the order kd_index_load reads them back. */
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
    else
        kd_cw_discard(&cw);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

static int emit_index(void *arg, struct kd_writer *w) { return kd_index_save(arg, w); }

int kd_index_save_path(struct kd_index *ix, const char *path)
{
    return kd_save_atomic(path, emit_index, ix);
}

/* ---- reading
 *
 * kd_index_load reads a stream (a kd_reader: a file, a memory buffer, a Python
 * file object; a pipe works) section by section, in the order kd_index_save
 * wrote them, straight into the arrays of a new in-memory index. Every
 * checksum is computed on the way (vectors included) and compared with the
 * section table at the end; the graph is range-checked as it arrives. Peak
 * memory: the index itself plus a 1 MiB read-ahead buffer; no second copy of
 * the file is ever held.
 *
 * kd_index_open maps a file and leaves its vectors on disk. The metadata
 * sections are checked at open (checksums, graph ranges, ids): those named in
 * `preload` through the mapping, which leaves them in the page cache, the
 * others with O_DIRECT reads, which do not. The whole mapping is MADV_RANDOM,
 * so a page that is not resident costs one 4 KiB read, not a read-around. */

static void prefix_path(const char *path)
{
    char msg[KD_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s: %s", path, kd_last_error());
    kd_set_error_text(msg);
}

static size_t meta_extra_bytes(const struct kd_meta *m)
{
    struct kd_quant probe = {0};
    probe.pdim = m->pdim;
    return ((size_t)m->ncentres + 2) * m->dim * sizeof(float) + kd_quant_signs_bytes(&probe);
}

/* The metadata every later size and offset is computed from. */
static int check_meta(const struct kd_meta *m)
{
    if (m->dim == 0 || m->dim > (1u << 20) || m->metric > KD_COSINE ||
        !valid_quantization(m->quantization) || m->m < 2 || m->m > 256 || m->m0 != 2 * m->m ||
        m->pdim != kd_quant_padded_dim(m->dim) ||
        m->code_size != (m->quantization == KD_Q_1BIT
                             ? m->pdim / 8 + sizeof(struct kd_code_tail)
                             : (m->dim * m->quantization + 7) / 8) ||
        m->record_bytes != m->dim * 4 || m->record_stride < m->record_bytes ||
        m->record_stride > m->record_bytes + (1u << 24) || m->count >= UINT32_MAX ||
        m->live > m->count || m->max_level < -1 || m->max_level > KD_MAX_LEVEL ||
        (m->count && m->entry >= m->count) || (!m->count && m->max_level != -1) ||
        m->ncentres < 1 || m->ncentres > KD_MAX_CENTRES)
        return kd_fail(-EINVAL, "index metadata is inconsistent");
    return 0;
}

/* Levels: each within max_level; their sum goes to *upper. */
static int check_levels(const uint8_t *lv, uint64_t n, int32_t max_level, uint64_t *upper)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        if ((int32_t)lv[i] > max_level)
            return kd_fail(-EINVAL, "index graph is corrupted (bad level)");
        sum += lv[i];
    }
    *upper += sum;
    return 0;
}

/* nlists neighbour lists of [length, cap neighbours]: length <= cap, every
 * neighbour < count. */
static int check_lists(const uint32_t *l, uint64_t nlists, uint32_t cap, uint64_t count)
{
    for (uint64_t i = 0; i < nlists; i++, l += 1 + cap) {
        if (l[0] > cap)
            return kd_fail(-EINVAL, "index graph is corrupted (list length)");
        for (uint32_t j = 1; j <= l[0]; j++)
            if (l[j] >= count)
                return kd_fail(-EINVAL, "index graph is corrupted (neighbour out of range)");
    }
    return 0;
}

/* Rows first..first+n of the id section into the id map (tombstones
 * skipped); counts the live ones. */
static int map_ids(struct kd_index *ix, const int64_t *ids, uint64_t first, uint64_t n,
                   uint64_t *live)
{
    for (uint64_t i = 0; i < n; i++) {
        if (ix->deleted[first + i])
            continue;
        if (++*live > ix->live || kd_idmap_put(&ix->idmap, ids[i], (uint32_t)(first + i)))
            return kd_fail(-EINVAL, *live > ix->live
                                        ? "index file is corrupted (live count)"
                                        : "index file is corrupted (duplicate id)");
    }
    return 0;
}

/* A new index with the parameters and quantizer of m; `extra` holds the
 * centres, rotation signs and scalar ranges that follow m in the file. */
static int index_from_meta(struct kd_index **out, const struct kd_meta *m, const uint8_t *extra)
{
    struct kd_index_params params = {m->dim, (int)m->metric, m->m, m->ef_construction,
                                      (int)m->quantization, m->seed};
    struct kd_index *ix;
    int err = index_alloc(&ix, &params);
    if (err)
        return err;
    struct kd_quant probe = {0};
    probe.pdim = m->pdim;
    const float *centres = (const float *)extra;
    const uint8_t *signs = extra + (size_t)m->ncentres * m->dim * sizeof(float);
    float *ranges = malloc(2 * (size_t)m->dim * sizeof(float));
    if (!ranges) {
        kd_index_free(ix);
        return kd_fail(-ENOMEM, "out of memory");
    }
    memcpy(ranges, signs + kd_quant_signs_bytes(&probe), 2 * (size_t)m->dim * sizeof(float));
    if ((err = kd_quant_init(&ix->quant, m->quantization, m->dim, (int)m->metric, m->ncentres,
                             centres, signs, 0))) {
        free(ranges);
        kd_index_free(ix);
        return err;
    }
    kd_quant_set_ranges(&ix->quant, ranges, ranges + m->dim);
    free(ranges);
    ix->estimate = kd_estimator(&ix->quant);
    ix->record_stride = m->record_stride;
    ix->trained = 1;
    ix->count = ix->cap = m->count;
    ix->live = m->live;
    kd_idmap_free(&ix->idmap);
    if ((err = kd_idmap_init(&ix->idmap, m->live))) {
        kd_index_free(ix);
        return err;
    }
    *out = ix;
    return 0;
}

/* Stream offset where the first `nsec` sections end (as written by
 * kd_index_save), table and tail included when all eight are counted. */
static uint64_t stream_end(const struct kd_meta *m, uint64_t upper_bytes, int nsec)
{
    uint64_t n = m->count;
    uint64_t len[8] = {sizeof *m + meta_extra_bytes(m), n * 8, n, n * m->code_size, n,
                       n * (1 + (uint64_t)m->m0) * 4, upper_bytes, n * m->record_stride};
    uint64_t pos = KD_BLOCK;
    for (int i = 0; i < nsec; i++)
        pos = kd_round_up(pos + len[i], KD_BLOCK);
    return nsec == 8 ? pos + 8 * sizeof(struct kd_section) + KD_TAIL_BYTES : pos;
}

static int read_section(struct kd_container_reader *cr, uint32_t id, void *dst, size_t n)
{
    int err = kd_cr_section_begin(cr, id);
    if (!err)
        err = kd_cr_read(cr, dst, n);
    return err ? err : kd_cr_section_end(cr);
}

int kd_index_load(struct kd_index **out, struct kd_reader *r)
{
    struct kd_container_reader cr;
    struct kd_meta m;
    uint8_t *extra = NULL;
    struct kd_index *ix = NULL;
    int err = kd_cr_begin(&cr, r);
    if (!err)
        err = kd_cr_section_begin(&cr, KD_SEC_META);
    if (!err)
        err = kd_cr_read(&cr, &m, sizeof m);
    if (!err)
        err = check_meta(&m);
    size_t xb = err ? 0 : meta_extra_bytes(&m);
    if (!err && !(extra = malloc(xb)))
        err = kd_fail(-ENOMEM, "out of memory");
    if (!err)
        err = kd_cr_read(&cr, extra, xb);
    if (!err)
        err = kd_cr_section_end(&cr);
    uint64_t n = m.count;
    /* A size known in advance must hold what the metadata announces. */
    if (!err)
        err = kd_cr_need(&cr, n * (8 + 1 + m.code_size + 1 + (1 + (uint64_t)m.m0) * 4 +
                                   m.record_stride));
    if (!err)
        kd_cr_expect(&cr, stream_end(&m, 0, 6));
    if (!err)
        err = index_from_meta(&ix, &m, extra);
    free(extra);
    if (err)
        goto fail;
    struct kd_graph *g = &ix->graph;
    /* The owned layout packs vectors at dim floats; the file stride is kept
     * for the next save. */
    ix->record_stride = record_stride_for(m.dim);
    ix->cap = ix->count = 0;
    if ((err = grow(ix, n ? n : 1)))
        goto fail;
    memset(g->upper, 0, (n ? n : 1) * sizeof *g->upper);
    memset(g->locks, 0, n ? n : 1);
    ix->count = g->count = n;
    uint64_t upper = 0;
    if ((err = read_section(&cr, KD_SEC_IDS, ix->ids, n * 8)) ||
        (err = read_section(&cr, KD_SEC_DELETED, ix->deleted, n)) ||
        (err = read_section(&cr, KD_SEC_CODES, ix->codes, n * m.code_size)) ||
        (err = read_section(&cr, KD_SEC_LEVELS, g->levels, n)) ||
        (err = check_levels(g->levels, n, m.max_level, &upper)) ||
        (kd_cr_expect(&cr, stream_end(&m, upper * (1 + m.m) * 4, 8)), 0) ||
        (err = read_section(&cr, KD_SEC_LEVEL0, g->level0, n * (1 + m.m0) * 4)) ||
        (err = check_lists(g->level0, n, m.m0, n)) ||
        (err = kd_cr_section_begin(&cr, KD_SEC_UPPER)))
        goto fail;
    for (uint64_t i = 0; i < n; i++) {
        size_t words = (size_t)g->levels[i] * (1 + m.m);
        if (!words)
            continue;
        if (!(g->upper[i] = malloc(words * 4))) {
            err = kd_fail(-ENOMEM, "out of memory loading the graph");
            goto fail;
        }
        if ((err = kd_cr_read(&cr, g->upper[i], words * 4)) ||
            (err = check_lists(g->upper[i], g->levels[i], m.m, n)))
            goto fail;
    }
    if ((err = kd_cr_section_end(&cr)) || (err = kd_cr_section_begin(&cr, KD_SEC_VECTORS)))
        goto fail;
    if (m.record_stride == m.record_bytes) {
        err = kd_cr_read(&cr, ix->vectors, n * m.record_bytes);
    } else {
        for (uint64_t i = 0; !err && i < n; i++) {
            err = kd_cr_read(&cr, ix->vectors + i * m.dim, m.record_bytes);
            if (!err)
                err = kd_cr_read(&cr, NULL, m.record_stride - m.record_bytes);
        }
    }
    if (err || (err = kd_cr_section_end(&cr)) || (err = kd_cr_finish(&cr)))
        goto fail;
    uint64_t live = 0;
    if ((err = map_ids(ix, ix->ids, 0, n, &live)))
        goto fail;
    if (live != m.live) {
        err = kd_fail(-KD_ECORRUPT, "index file is corrupted (live count)");
        goto fail;
    }
    g->entry = n ? m.entry : KD_NONE;
    g->max_level = m.max_level;
    if (ix->inv_norms)
        for (uint64_t i = 0; i < n; i++)
            ix->inv_norms[i] = inv_norm_of(ix, ix->vectors + i * m.dim);
    *out = ix;
    return 0;
fail:
    kd_cr_discard(&cr);
    kd_index_free(ix);
    return err;
}

int kd_index_load_path(struct kd_index **out, const char *path)
{
    struct kd_reader r;
    struct kd_fd_reader fr;
    int err = kd_fd_reader_open(&r, &fr, path);
    if (err)
        return err;
    err = kd_index_load(out, &r);
    kd_reader_close(&r);
    if (err == -EINVAL || err == -KD_ECORRUPT)
        prefix_path(path);
    return err;
}

/* What the open-time scans of the metadata sections fill in. */
struct open_scan {
    struct kd_index *ix;
    const uint32_t *upper_base;   /* the mapped upper-level section */
    uint64_t upper_words;
    uint64_t live;
    int32_t max_level;
    uint32_t cap;                 /* neighbours per list of the section scanned */
};

static int scan_deleted(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    memcpy(o->ix->deleted + at, p, n);
    return 0;
}

static int scan_ids(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    return map_ids(o->ix, (const int64_t *)p, at / 8, n / 8, &o->live);
}

static int scan_levels(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    struct kd_graph *g = &o->ix->graph;
    uint64_t sum = 0;
    int err = check_levels(p, n, o->max_level, &sum);
    /* Pointers into the mapping; nothing is read through them before the
     * section's length has been checked against the levels. */
    for (size_t i = 0; !err && i < n; i++) {
        g->upper[at + i] = p[i] ? (uint32_t *)o->upper_base + o->upper_words : NULL;
        o->upper_words += (uint64_t)p[i] * (1 + g->m);
    }
    return err;
}

static int scan_lists(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    return check_lists((const uint32_t *)p, n / ((1 + o->cap) * 4), o->cap, o->ix->count);
}

int kd_index_open(struct kd_index **out, const char *path, const struct kd_open_params *op)
{
    /* O_NONBLOCK: a FIFO must not block the open (it is refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return kd_fail(-e, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    struct kd_scanner sc;
    int err = 0;
    uint8_t *map = MAP_FAILED;
    struct kd_index *ix = NULL;
    kd_scanner_init(&sc, NULL, NULL, 0);
    if (fstat(fd, &st) != 0) {
        err = kd_fail(-errno, "cannot stat %s", path);
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        err = kd_fail(-EISDIR, "%s is a directory, not an index file", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        err = kd_fail(-EINVAL, "%s is not a regular file (a device, pipe or socket): open maps "
                      "an index file; knndirect.load reads a stream", path);
        goto fail;
    }
    if ((uint64_t)st.st_size < KD_BLOCK + KD_TAIL_BYTES) {
        if ((uint64_t)st.st_size >= 8) {
            char magic[8];
            if (pread(fd, magic, 8, 0) == 8 && memcmp(magic, "KNNDIRCT", 8) == 0) {
                err = kd_fail(-KD_ECORRUPT, "%s: index file is truncated (%llu bytes)", path,
                              (unsigned long long)st.st_size);
                goto fail;
            }
        }
        err = kd_fail(-KD_ECORRUPT, "%s is not a knndirect index (too small)", path);
        goto fail;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        err = kd_fail(-e, "cannot map %s: %s", path, strerror(e));
        goto fail;
    }
    /* Every section reads only the pages it is asked for; preloaded ones are
     * read ahead explicitly below. */
    madvise(map, (size_t)st.st_size, MADV_RANDOM);
    struct kd_container c;
    if ((err = kd_container_parse(&c, map, (uint64_t)st.st_size, ~(1u << KD_SEC_META)))) {
        prefix_path(path);
        goto fail;
    }
    const struct kd_section *meta = kd_container_find(&c, KD_SEC_META), *ids, *deleted, *codes,
                            *levels, *level0, *upperp, *vectors;
#define NEED(var, id)                                                                   \
    if (!(var = kd_container_find(&c, id))) {                                           \
        err = kd_fail(-KD_ECORRUPT, "%s: index file lacks section %d", path, id);       \
        goto fail;                                                                      \
    }
    NEED(ids, KD_SEC_IDS)
    NEED(deleted, KD_SEC_DELETED)
    NEED(codes, KD_SEC_CODES)
    NEED(levels, KD_SEC_LEVELS)
    NEED(level0, KD_SEC_LEVEL0)
    NEED(upperp, KD_SEC_UPPER)
    NEED(vectors, KD_SEC_VECTORS)
#undef NEED
    struct kd_meta m;
    if (!meta || meta->length < sizeof m) {
        err = kd_fail(-KD_ECORRUPT, "%s: index metadata is missing or short", path);
        goto fail;
    }
    memcpy(&m, map + meta->offset, sizeof m);
    if ((err = check_meta(&m)) || meta->length != sizeof m + meta_extra_bytes(&m)) {
        err = err ? err : kd_fail(-KD_ECORRUPT, "index metadata has the wrong size");
        prefix_path(path);
        goto fail;
    }
    uint64_t n = m.count;
    if (ids->length != n * 8 || deleted->length != n || codes->length != n * m.code_size ||
        levels->length != n || level0->length != n * (1 + m.m0) * 4 ||
        vectors->length != n * m.record_stride) {
        err = kd_fail(-KD_ECORRUPT, "%s: index sections do not match the vector count", path);
        goto fail;
    }
    if ((err = index_from_meta(&ix, &m, map + meta->offset + sizeof m)))
        goto fail;
    ix->map = map;
    ix->map_len = (size_t)st.st_size;
    map = MAP_FAILED;
    ix->on_disk = 1;
    ix->loaded_from_file = 1;
    struct kd_graph *g = &ix->graph;
    g->owns = 0;
    g->count = n;
    g->entry = n ? m.entry : KD_NONE;
    g->max_level = m.max_level;
    ix->deleted = malloc(n ? n : 1);
    g->upper = calloc(n ? n : 1, sizeof *g->upper);
    if (!ix->deleted || !g->upper) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto fail;
    }
    kd_scanner_init(&sc, ix->map, path, op->direct_io);
    struct open_scan o = {ix, (const uint32_t *)(ix->map + upperp->offset), 0, 0, m.max_level, 0};
#define VIA_MAP(s) ((op->preload >> (s)->id) & 1)
    if ((err = kd_scan_section(&sc, deleted, VIA_MAP(deleted), 1, scan_deleted, &o)) ||
        (err = kd_scan_section(&sc, ids, VIA_MAP(ids), 8, scan_ids, &o)))
        goto scan_fail;
    if (o.live != m.live) {
        err = kd_fail(-KD_ECORRUPT, "index file is corrupted (live count)");
        goto scan_fail;
    }
    if ((err = kd_scan_section(&sc, levels, VIA_MAP(levels), 1, scan_levels, &o)))
        goto scan_fail;
    if (upperp->length != o.upper_words * 4) {
        err = kd_fail(-KD_ECORRUPT, "index graph is corrupted (upper levels)");
        goto scan_fail;
    }
    o.cap = m.m0;
    if ((err = kd_scan_section(&sc, level0, VIA_MAP(level0), (1 + m.m0) * 4, scan_lists, &o)))
        goto scan_fail;
    o.cap = m.m;
    if ((err = kd_scan_section(&sc, upperp, VIA_MAP(upperp), (1 + m.m) * 4, scan_lists, &o)) ||
        (err = kd_scan_section(&sc, codes, VIA_MAP(codes), 1, NULL, NULL)))
        goto scan_fail;
#undef VIA_MAP
    kd_scanner_free(&sc);
    ix->codes = ix->map + codes->offset;
    ix->ids = (int64_t *)(ix->map + ids->offset);
    g->level0 = (uint32_t *)(ix->map + level0->offset);
    g->levels = ix->map + levels->offset;
    if (!(ix->path = strdup(path))) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto fail;
    }
    if (n) {
        struct kd_vecio_config vc = {path, vectors->offset, n, ix->record_stride,
                                     ix->record_bytes, op->io_backend, op->direct_io,
                                     op->io_depth ? op->io_depth : 1};
        if ((err = kd_vecio_open(&ix->vio, &vc)))
            goto fail;
        struct kd_vecio_info vi;
        kd_vecio_get_info(ix->vio, &vi);
        /* Not with the thread pool: its workers, woken in the middle of the
         * beam, preempt it (1M x 768 on 2 cores: p99 8-12 ms against 1.3-1.5
         * without early reads, p50 about equal). */
        ix->read_early = vi.backend == KD_IO_URING;
        /* Vectors read with O_DIRECT never look at the page cache: only the
         * buffered backends gain from reading them ahead. */
        if ((op->preload >> KD_SEC_VECTORS & 1) && !vi.direct_io)
            posix_fadvise(fd, (off_t)vectors->offset, (off_t)vectors->length,
                          POSIX_FADV_WILLNEED);
    }
    close(fd);
    *out = ix;
    return 0;
scan_fail:
    prefix_path(path);
fail:
    kd_scanner_free(&sc);
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    kd_index_free(ix);
    close(fd);
    return err;
}

/* An opened index: every checksum of the file, vectors included (metadata
 * through the mapping, vectors with the index's own reads). A loaded index
 * had every checksum checked as it was read, and has no file. */
int kd_index_verify(struct kd_index *ix)
{
    if (!ix->map)
        return 0;
    pthread_rwlock_rdlock(&ix->lock);
    struct kd_container c;
    struct kd_scanner sc;
    uint8_t *buf = NULL;
    int err = kd_container_parse(&c, ix->map, ix->map_len, ~0u);
    kd_scanner_init(&sc, ix->map, NULL, 0);
    const struct kd_section *vs = err ? NULL : kd_container_find(&c, KD_SEC_VECTORS);
    for (uint32_t i = 0; !err && i < c.nsections; i++)
        if (c.sections[i].id != KD_SEC_VECTORS)
            err = kd_scan_section(&sc, &c.sections[i], 1, 1, NULL, NULL);
    kd_scanner_free(&sc);
    if (!err && !vs)
        err = kd_fail(-KD_ECORRUPT, "index file lacks section %d", KD_SEC_VECTORS);
    if (!err && ix->vio) {
        /* A range read delivers the padding of every record but its last: one
         * record more is read (the next chunk's first), and the padding that
         * ends the section comes from the mapping. */
        uint64_t stride = ix->record_stride;
        size_t chunk = (4u << 20) / stride;
        chunk = chunk ? chunk : 1;
        buf = kd_alloc_aligned(kd_vecio_buffer_alignment(ix->vio), (chunk + 1) * stride);
        if (!buf)
            err = kd_fail(-ENOMEM, "out of memory");
        uint32_t crc = 0;
        for (uint64_t at = 0; !err && at < ix->count; at += chunk) {
            uint64_t m = ix->count - at < chunk ? ix->count - at : chunk;
            int last = at + m == ix->count;
            struct kd_io_counters io = {0};
            err = kd_vecio_read_range(ix->vio, at, m + !last, buf, &io);
            if (!err)
                crc = kd_crc32c(crc, buf, last ? (m - 1) * stride + ix->record_bytes : m * stride);
        }
        if (!err)
            crc = kd_crc32c(crc, ix->map + vs->offset + vs->length - (stride - ix->record_bytes),
                            stride - ix->record_bytes);
        if (!err && crc != vs->crc)
            err = kd_fail(-KD_ECORRUPT, "index section %u (vectors) is corrupted (checksum mismatch)",
                          vs->id);
    }
    kd_free_aligned(buf);
    pthread_rwlock_unlock(&ix->lock);
    if ((err == -EINVAL || err == -KD_ECORRUPT) && ix->path)
        prefix_path(ix->path);
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

uint32_t kd_index_dim(const struct kd_index *ix)
{
    return ix->p.dim;
}

uint64_t kd_index_count(struct kd_index *ix)
{
    return __atomic_load_n(&ix->live, __ATOMIC_RELAXED);
}

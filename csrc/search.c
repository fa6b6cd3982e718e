/* search.c — the search pipeline of one index: per-thread contexts, the
 * two phases of a query (graph search over codes; shortlist reads and
 * rerank), early reads, batch workers, exact search and filters. */
#include "search.h"
#include "common.h"
#include "exact.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- contexts */

void kd_search_ctx_free(struct kd_search_ctx *c)
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
    free(c->refine_rows);
    free(c->refine_dist);
    free(c);
}

struct kd_search_ctx *kd_search_ctx_get(struct kd_index *ix)
{
    pthread_mutex_lock(&ix->pool_lock);
    struct kd_search_ctx *c = ix->pool;
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
        kd_search_ctx_free(c);
        return NULL;
    }
    return c;
}

void kd_search_ctx_put(struct kd_index *ix, struct kd_search_ctx *c)
{
    pthread_mutex_lock(&ix->pool_lock);
    c->next = ix->pool;
    ix->pool = c;
    pthread_mutex_unlock(&ix->pool_lock);
}

void kd_search_ctx_retire(struct kd_index *ix, struct kd_search_ctx *c)
{
    kd_index_stats_add(ix, &c->st);
    memset(&c->st, 0, sizeof c->st);
    kd_search_ctx_put(ix, c);
}

static int ctx_rows(struct kd_search_ctx *c, size_t n)
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

static int ctx_buf(struct kd_index *ix, struct kd_search_ctx *c, size_t rows)
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

static int ctx_pick(struct kd_search_ctx *c, size_t n)
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

static int ctx_refine(struct kd_search_ctx *c, size_t n)
{
    if (n <= c->refine_cap)
        return 0;
    uint32_t *r = realloc(c->refine_rows, n * sizeof *r);
    if (r)
        c->refine_rows = r;
    float *d = realloc(c->refine_dist, n * sizeof *d);
    if (d)
        c->refine_dist = d;
    if (!r || !d)
        return kd_fail(-ENOMEM, "out of memory for a search");
    c->refine_cap = n;
    return 0;
}

static int ctx_top(struct kd_search_ctx *c, size_t k)
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

/* ---- exact scoring of rows, from memory or by batch reads */

/* Score the shortlist in memory: rows are scattered, so keep a few vectors
 * in flight ahead of the one being scored. */
static void score_in_memory(struct kd_index *ix, struct kd_search_ctx *c, size_t k)
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
        kd_topk_offer(c->top, &c->ntop, k, kd_exact_dist(ix, c->q, v, inv), rows[i]);
    }
}

/* The final shortlist res[0..n) of an index in memory, scored at once. */
int kd_shortlist_score_memory(struct kd_index *ix, struct kd_search_ctx *c,
                              const struct kd_heap_item *res, size_t n, size_t k)
{
    c->finished = 1;
    int err = ctx_rows(c, n);
    if (err)
        return err;
    c->nshort = n;
    for (size_t i = 0; i < n; i++)
        c->rows[i] = res[i].row;
    score_in_memory(ix, c, k);
    c->st.rerank_ns += kd_now_ns() - c->t_graph;
    return 0;
}

static int by_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Score the shortlist records that the batch read left in c->buf. */
static void score_read(struct kd_index *ix, struct kd_search_ctx *c, size_t k)
{
    int normalized = ix->metric->normalized;
    for (size_t i = 0; i < c->nshort; i++) {
        if (i < c->nearly &&
            !bsearch(&c->rows[i], c->early_sorted, c->nkept, sizeof *c->early_sorted, by_u32))
            continue; /* read early, dropped by the final shortlist */
        const float *v = (const float *)(c->buf + i * ix->record_stride);
        float inv = normalized ? kd_inv_norm(ix, v) : 0;
        kd_topk_offer(c->top, &c->ntop, k, kd_exact_dist(ix, c->q, v, inv), c->rows[i]);
    }
}

/* ---- search */

/* Live vectors over the count sp's picks were chosen for (1: not grown, or
 * no count given). */
static double growth(const struct kd_index *ix, const struct kd_search_params *sp)
{
    return sp->serves && ix->live > sp->serves ? (double)ix->live / (double)sp->serves : 1.0;
}

size_t kd_shortlist_size(const struct kd_index *ix, const struct kd_search_params *sp)
{
    double os = sp->oversample > 0 ? sp->oversample
                                   : kd_default_oversample(ix->p.quantization, ix->quant.pdim);
    double L = ceil((double)sp->k * os - 1e-9); /* k * (L / k) may land a hair above L */
    L = fmax(L, nearbyint(L * growth(ix, sp))); /* to the nearest row, as Python's round() */
    if (L < (double)sp->k)
        L = (double)sp->k;
    return L > 1e7 ? 10000000 : (size_t)L;
}

size_t kd_beam_width(const struct kd_index *ix, const struct kd_search_params *sp)
{
    size_t ef = sp->ef ? sp->ef : KD_DEFAULT_EF;
    /* More vectors between a query and its neighbours: a wider beam, though
     * by less than the shortlist (by the square root of the growth,
     * measured to hold recall through a doubling). */
    double wide = nearbyint((double)ef * sqrt(growth(ix, sp)));
    if (wide > (double)ef)
        ef = wide > 1e7 ? 10000000 : (size_t)wide;
    return ef;
}

/* Graph search is worth it unless the filter leaves few vectors: compare code
 * estimates visited (more when the filter rejects most of them) with an exact
 * pass over the allowed ones. */
static int prefer_exact(const struct kd_index *ix, const struct kd_filter *f, size_t ef)
{
    if (!f->allowed)
        return 0;
    if (f->nrows == 0 || ix->live == 0)
        return 1;
    double sel = (double)f->nrows / (double)ix->live;
    double graph_cost = 0.1 * (double)ef * ix->graph.m0 / sel + (double)ef;
    double exact_cost = (double)f->nrows * ix->src->scan_cost;
    return exact_cost <= graph_cost;
}

int kd_search_prefers_exact(const struct kd_index *ix, const struct kd_search_params *sp,
                            const struct kd_filter *f)
{
    size_t L = kd_shortlist_size(ix, sp), ef = kd_beam_width(ix, sp);
    return sp->exact || ix->graph.entry == KD_NONE || prefer_exact(ix, f, ef > L ? ef : L);
}

static const float *normalized_query(const struct kd_index *ix, const float *q, float *buf)
{
    if (!ix->metric->normalized)
        return q;
    float inv = kd_inv_norm(ix, q);
    for (uint32_t i = 0; i < ix->p.dim; i++)
        buf[i] = q[i] * inv;
    return buf;
}

static void write_results(const struct kd_index *ix, const struct kd_heap_item *top, size_t ntop,
                          size_t k, float *D, int64_t *I)
{
    const struct kd_metric_info *m = ix->metric;
    for (size_t i = 0; i < k; i++) {
        if (i < ntop) {
            D[i] = kd_metric_to_user(m, top[i].dist);
            I[i] = ix->ids[top[i].row];
        } else {
            D[i] = m->missing;
            I[i] = -1;
        }
    }
}

static struct kd_exact_data exact_data(const struct kd_index *ix)
{
    struct kd_exact_data d = {ix->p.metric,      ix->p.dim,   ix->vectors, ix->vio,
                              ix->record_stride, ix->deleted, ix->count,   ix->kern};
    return d;
}

/* Early reads. Partway through the beam, the best part of the shortlist it
 * holds rarely changes any more: those records are read while the beam goes
 * on, and after it only the rest of the final shortlist. A record read early
 * that drops out of the shortlist is counted as early_unused and not scored:
 * the answer is the final shortlist's alone, whatever the early reads were
 * (they depend on the searches in flight beside this one).
 *
 * A search alone reads in three waves: the best quarter of the shortlist
 * at a quarter of the expansions a search usually makes, the best half (less
 * what is in flight) at half, three quarters at three quarters. Searches
 * that share the device with others read once, half at half: their reads
 * queue behind the others' anyway, and each wave costs a submission
 * (measured: docs/benchmarks.md, 'Design figures'). */
struct early_plan {
    int waves;
    double at[KD_EARLY_WAVES], share[KD_EARLY_WAVES];
};
static const struct early_plan early_alone = {3, {0.25, 0.5, 0.75}, {0.25, 0.5, 0.75}},
                               early_shared = {1, {0.5}, {0.5}};

struct early_job {
    struct kd_index *ix;
    struct kd_search_ctx *c;
    const struct early_plan *plan;
    struct kd_search_early *hook;
    size_t L, ef, most; /* most: early reads the buffer has room for */
    int wave;
};

static size_t early_after(const struct early_job *j)
{
    return j->wave < j->plan->waves
               ? (size_t)(j->plan->at[j->wave] * j->c->expand_ratio * (double)j->ef)
               : SIZE_MAX;
}

static int read_early(const struct kd_search_ctx *c, uint32_t row)
{
    return c->nearly && bsearch(&row, c->early_sorted, c->nearly, sizeof row, by_u32);
}

/* kd_search_early callback: read the best of the shortlist found so far that
 * is not in flight yet, then arm the next wave. */
static void start_early_reads(void *arg, const struct kd_heap_item *best, size_t n)
{
    struct early_job *j = arg;
    struct kd_search_ctx *c = j->c;
    int w = j->wave++;
    size_t want = (size_t)ceil(j->plan->share[w] * (double)j->L), fresh = 0, at = c->nearly;
    if (want > n)
        want = n;
    memcpy(c->pick, best, n * sizeof *best);
    kd_select_closest(c->pick, n, want);
    for (size_t i = 0; i < want && at + fresh < j->most; i++)
        if (!read_early(c, c->pick[i].row)) {
            c->rows[at + fresh] = c->pick[i].row;
            c->rows64[at + fresh++] = c->pick[i].row;
        }
    /* On failure the final batch simply reads them. */
    if (fresh &&
        kd_vecio_submit(j->ix->vio, c->rows64 + at, fresh, c->buf + at * j->ix->record_stride,
                        j->ix->record_stride, &c->early[w]) == 0) {
        memcpy(c->early_sorted + at, c->rows + at, fresh * sizeof *c->rows);
        c->nearly += fresh;
        qsort(c->early_sorted, c->nearly, sizeof *c->rows, by_u32);
    }
    size_t next = early_after(j), now = j->hook->after;
    j->hook->after = next > now ? next : now + 1;
}

/* The final shortlist res[0..n) of an index on disk: rows read early stay
 * at the front; the others follow them and go out as one batch. */
int kd_shortlist_read(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_heap_item *res,
                      size_t n, size_t k)
{
    (void)k; /* scored by query_end */
    size_t total = c->nearly, used = 0;
    for (size_t i = 0; i < n; i++) {
        if (read_early(c, res[i].row)) {
            c->pick[used++].row = res[i].row;
            continue;
        }
        c->rows[total] = res[i].row;
        c->rows64[total++] = res[i].row;
    }
    /* From here on early_sorted holds the early rows the shortlist kept:
     * only they are scored, so that the answer is the final shortlist's
     * whatever the early reads were (they vary with concurrent searches). */
    for (size_t i = 0; i < used; i++)
        c->early_sorted[i] = c->pick[i].row;
    if (used)
        qsort(c->early_sorted, used, sizeof *c->early_sorted, by_u32);
    c->nkept = used;
    c->st.early_reads += c->nearly;
    c->st.early_unused += c->nearly - used;
    c->nshort = total;
    c->finished = total == 0;
    if (total == c->nearly)
        return 0;
    int err = kd_vecio_submit(ix->vio, c->rows64 + c->nearly, total - c->nearly,
                              c->buf + c->nearly * ix->record_stride, ix->record_stride, &c->reads);
    c->finished = err != 0;
    return err;
}

static int by_estimate(const void *a, const void *b)
{
    const struct kd_heap_item *x = a, *y = b;
    return x->dist < y->dist ? -1 : x->dist > y->dist ? 1 : (x->row > y->row) - (x->row < y->row);
}

/* Re-estimate the first min(n, ef) candidates (the beam's best, ascending
 * by 1-bit estimate) with their refined codes and put the best L of them
 * first, ascending. What lies past ef keeps its place, so a shortlist of L
 * is a prefix of the order a longer one sees: the calibration measures every
 * length from one search. */
#define REFINE_CHUNK 8
static int refine_candidates(struct kd_index *ix, struct kd_search_ctx *c, struct kd_heap_item *res,
                             size_t n, size_t ef, size_t L)
{
    size_t m = n < ef ? n : ef;
    int err = ctx_refine(c, m);
    if (err)
        return err;
    const struct kd_quant *q = &ix->quant;
    for (size_t i = 0; i < m; i++)
        c->refine_rows[i] = res[i].row;
    /* A chunk's refinements are fetched while the one before is scored. */
    kd_prefetch_records(ix->refined, q->refine_size, c->refine_rows,
                        m < REFINE_CHUNK ? m : REFINE_CHUNK);
    for (size_t i = 0; i < m; i += REFINE_CHUNK) {
        size_t len = m - i < REFINE_CHUNK ? m - i : REFINE_CHUNK;
        if (i + REFINE_CHUNK < m) {
            size_t next = m - i - REFINE_CHUNK;
            kd_prefetch_records(ix->refined, q->refine_size, c->refine_rows + i + REFINE_CHUNK,
                                next < REFINE_CHUNK ? next : REFINE_CHUNK);
        }
        ix->refine(q, &c->qc, ix->codes, ix->refined, c->refine_rows + i, len, c->refine_dist + i);
    }
    for (size_t i = 0; i < m; i++)
        res[i].dist = c->refine_dist[i];
    size_t sorted = m;
    if (L < m) {
        kd_select_closest(res, m, L);
        sorted = L;
    }
    qsort(res, sorted, sizeof *res, by_estimate);
    c->st.refined += m;
    return 0;
}

/* The graph search of a query, with early reads when may_read_early. It
 * leaves the candidates c->s.out[0..*nres) clipped to the shortlist size,
 * or (c->finished) the exact answer of a query whose filter starved the beam. */
static int query_graph(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                       const struct kd_search_params *sp, const struct kd_filter *f,
                       uint32_t hidden, int may_read_early, unsigned searching, size_t *nres)
{
    size_t k = sp->k;
    *nres = 0;
    c->ntop = c->nshort = c->nearly = 0;
    c->finished = 1;
    int err = ctx_top(c, k);
    if (err)
        return err;
    c->q = normalized_query(ix, q, c->qn);
    size_t L = kd_shortlist_size(ix, sp), ef = kd_beam_width(ix, sp);
    if (ef < k)
        ef = k;
    if (ef > ix->count && ix->count >= k) /* a beam never holds more nodes than there are */
        ef = (size_t)ix->count;
    uint64_t t0 = kd_now_ns();
    if ((err = kd_scratch_reserve(&c->s, ix->count, ef, ix->graph.m0)))
        return err;
    /* Room for the shortlist and the early reads, taken before any is in flight. */
    /* No early reads over refined codes: they would follow the 1-bit order. */
    int reading = ix->src->batch_reads && sp->rerank,
        early_ok = reading && may_read_early && !ix->refine;
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
    struct kd_estimate_ctx e = {ix, &c->qc};
    /* Searches hold the read lock, so live and count are stable here; with
     * nothing removed the tombstones need not be read per scored node. */
    struct kd_accept a = {ix->live < ix->count ? ix->deleted : NULL, f->allowed, hidden};
    uint64_t scored = c->s.scored;
    size_t n = kd_graph_search(&ix->graph, &c->s, ef, L, kd_estimate_rows, kd_prefetch_codes, &e,
                               &a, &early);
    c->st.scored += c->s.scored - scored;
    float ratio = (float)early.expansions / (float)ef;
    c->expand_ratio = c->expand_ratio > 0 ? 0.9f * c->expand_ratio + 0.1f * ratio : ratio;
    c->t_graph = kd_now_ns();
    c->st.graph_ns += c->t_graph - t0;
    if (n < k && f->allowed && f->nrows > n) {
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
    if (ix->refine && (err = refine_candidates(ix, c, (struct kd_heap_item *)c->s.out, n, ef, L)))
        return err;
    c->finished = 0;
    *nres = n < L ? n : L;
    return 0;
}

int kd_query_graph(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                   const struct kd_search_params *sp, const struct kd_filter *f,
                   const struct kd_heap_item **res, size_t *nres)
{
    int err = query_graph(ix, c, q, sp, f, KD_NONE, 0, 0, nres);
    *res = c->s.out;
    return err;
}

int kd_query_graph_hiding(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                          const struct kd_search_params *sp, uint32_t hidden,
                          const struct kd_heap_item **res, size_t *nres)
{
    struct kd_filter none = {NULL, NULL, 0};
    int err = query_graph(ix, c, q, sp, &none, hidden, 0, 0, nres);
    *res = c->s.out;
    return err;
}

/* Phase one of a query: the graph search over codes. It leaves the
 * shortlist's reads in flight (on disk), or the answer final. */
int kd_query_begin(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                   const struct kd_search_params *sp, const struct kd_filter *f)
{
    /* Counted only where it chooses how to read early: one shared write less
     * per query elsewhere. */
    unsigned searching = ix->read_early ? __atomic_add_fetch(&ix->searching, 1, __ATOMIC_RELAXED)
                                        : 0;
    size_t nres;
    int err = query_graph(ix, c, q, sp, f, KD_NONE, ix->read_early, searching, &nres);
    if (err || c->finished)
        return err;
    const struct kd_heap_item *res = c->s.out;
    if (!sp->rerank) {
        for (; c->ntop < nres && c->ntop < sp->k; c->ntop++)
            c->top[c->ntop] = res[c->ntop];
        c->finished = 1;
        return 0;
    }
    return ix->src->shortlist(ix, c, res, nres, sp->k);
}

int kd_query_shortlist(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_heap_item *res,
                       size_t n, size_t k)
{
    if (n == 0) {
        c->finished = 1;
        return 0;
    }
    /* Other indexes' graph searches ran since this one's: not rerank time. */
    c->t_graph = kd_now_ns();
    return ix->src->shortlist(ix, c, res, n, k);
}

int kd_query_reap(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_search_params *sp,
                  int skip)
{
    int err = 0;
    if (c->nearly || !c->finished) {
        /* Early reads alone, the answer already final (the exact fallback
         * after a starved beam), are reaped and not scored. */
        int score = !c->finished;
        struct kd_io_counters io = {0, 0, 0};
        for (int w = 0; w < KD_EARLY_WAVES; w++)
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
    if (!err && !skip)
        c->st.rerank_vectors += c->nshort;
    return err;
}

/* Phase two: wait for the shortlist's records, rescore, write the answer.
 * Always called after query_begin, so reads in flight are reaped even when
 * the answer is not wanted (skip). */
int kd_query_end(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_search_params *sp,
                 float *D, int64_t *I, int skip)
{
    if (ix->read_early)
        __atomic_sub_fetch(&ix->searching, 1, __ATOMIC_RELAXED);
    int err = kd_query_reap(ix, c, sp, skip);
    if (err || skip)
        return err;
    kd_topk_sort(c->top, c->ntop);
    write_results(ix, c->top, c->ntop, sp->k, D, I);
    c->st.queries++;
    return 0;
}

int kd_exact_topk(struct kd_index *ix, const float *q, size_t nq, const struct kd_search_params *sp,
                  const struct kd_filter *f, struct kd_heap_item *top, size_t *ntop)
{
    size_t k = sp->k, dim = ix->p.dim;
    float *qn = NULL;
    int err = 0;
    if (ix->metric->normalized) {
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
                              kd_resolve_threads(sp->threads), top, ntop, &io);
        st.read_ops = io.read_ops;
        st.read_bytes = io.read_bytes;
        st.io_wait_ns = io.wait_ns;
    }
    if (!err) {
        st.exact_queries = nq;
        kd_index_stats_add(ix, &st);
    }
    free(qn);
    return err;
}

/* Brute force for a whole batch: one pass over the data serves all queries. */
static int search_exact(struct kd_index *ix, const float *q, size_t nq,
                        const struct kd_search_params *sp, const struct kd_filter *f, float *D,
                        int64_t *I)
{
    size_t k = sp->k;
    struct kd_heap_item *top = malloc(nq * k * sizeof *top);
    size_t *ntop = malloc(nq * sizeof *ntop);
    int err = top && ntop ? kd_exact_topk(ix, q, nq, sp, f, top, ntop)
                          : kd_fail(-ENOMEM, "out of memory for an exact search");
    for (size_t i = 0; !err && i < nq; i++)
        write_results(ix, top + i * k, ntop[i], k, D + i * k, I + i * k);
    if (!err) {
        struct kd_stats st = {.queries = nq};
        kd_index_stats_add(ix, &st);
    }
    free(top);
    free(ntop);
    return err;
}

struct batch {
    struct kd_index *ix;
    const float *q;
    size_t nq;
    const struct kd_search_params *sp;
    const struct kd_filter *f;
    float *D;
    int64_t *I;
    size_t next;
    struct kd_first_error fe;
};

/* Each worker keeps two queries going on disk: while the shortlist of one
 * is being read, the graph search of the next one runs. */
static void *batch_worker(void *arg)
{
    struct batch *b = arg;
    struct kd_index *ix = b->ix;
    struct kd_search_ctx *c[2] = {kd_search_ctx_get(ix), kd_search_ctx_get(ix)};
    size_t k = b->sp->k, pending = SIZE_MAX;
    int cur = 0, err = c[0] && c[1] ? 0 : kd_fail(-ENOMEM, "out of memory for a search");
    for (;;) {
        size_t i = SIZE_MAX;
        if (!err && !kd_first_error_set(&b->fe)) {
            i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
            if (i >= b->nq)
                i = SIZE_MAX;
        }
        if (i != SIZE_MAX)
            err = kd_query_begin(ix, c[cur], b->q + i * ix->p.dim, b->sp, b->f);
        if (pending != SIZE_MAX) {
            int e = kd_query_end(ix, c[!cur], b->sp, b->D + pending * k, b->I + pending * k,
                                 err != 0);
            err = err ? err : e;
        }
        if (i == SIZE_MAX || err) {
            if (i != SIZE_MAX) /* reap what query_begin may have left in flight */
                kd_query_end(ix, c[cur], b->sp, NULL, NULL, 1);
            break;
        }
        pending = i;
        cur = !cur;
    }
    kd_first_error_record(&b->fe, err);
    for (int j = 0; j < 2; j++)
        if (c[j])
            kd_search_ctx_retire(ix, c[j]);
    return NULL;
}

int kd_filter_build(struct kd_index *ix, const struct kd_search_params *sp, struct kd_filter *f)
{
    memset(f, 0, sizeof *f);
    if (!sp->filter)
        return 0;
    f->allowed = calloc(ix->count ? ix->count : 1, 1);
    f->rows = malloc((sp->nfilter ? sp->nfilter : 1) * sizeof(uint32_t));
    if (!f->allowed || !f->rows)
        return kd_fail(-ENOMEM, "out of memory for the filter");
    /* The rows land in f->rows first, then are kept where new and live. */
    kd_idmap_get_many(&ix->idmap, sp->filter, sp->nfilter, f->rows);
    for (size_t i = 0; i < sp->nfilter; i++) {
        uint32_t r = f->rows[i];
        /* Unknown and removed ids simply cannot be returned. */
        if (r == KD_NO_ROW || f->allowed[r])
            continue;
        f->allowed[r] = 1;
        f->rows[f->nrows++] = r;
    }
    return 0;
}

void kd_filter_free(struct kd_filter *f)
{
    free(f->allowed);
    free(f->rows);
    f->allowed = NULL;
    f->rows = NULL;
}

void kd_index_search_widths(struct kd_index *ix, const struct kd_search_params *sp, size_t *ef,
                            size_t *shortlist)
{
    pthread_rwlock_rdlock(&ix->lock);
    *ef = kd_beam_width(ix, sp);
    *shortlist = kd_shortlist_size(ix, sp);
    pthread_rwlock_unlock(&ix->lock);
}

int kd_index_search(struct kd_index *ix, const float *q, size_t nq,
                    const struct kd_search_params *sp, float *D, int64_t *I)
{
    if (sp->k == 0)
        return kd_fail(-EINVAL, "k must be at least 1");
    int err = kd_check_finite(q, nq, ix->p.dim, "query");
    if (err)
        return err;
    pthread_rwlock_rdlock(&ix->lock);
    struct kd_filter f;
    err = kd_filter_build(ix, sp, &f);
    /* A shortlist as large as the index is a full scan anyway. */
    int exact = kd_shortlist_size(ix, sp) >= ix->live || kd_search_prefers_exact(ix, sp, &f);
    if (!err && exact) {
        err = search_exact(ix, q, nq, sp, &f, D, I);
    } else if (!err) {
        struct batch b = {ix, q, nq, sp, &f, D, I, 0, KD_FIRST_ERROR_INIT};
        unsigned threads = kd_resolve_threads(sp->threads);
        if (threads > nq)
            threads = (unsigned)nq;
        kd_run_workers(batch_worker, &b, threads);
        err = kd_first_error_take(&b.fe);
    }
    kd_filter_free(&f);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

/* calibrate.c — recall against ef and shortlist length (calibrate.h). */
#include "calibrate.h"
#include "common.h"
#include "search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Sums over queries: per shortlist length, hits and each query's recall
 * (and its square); per query, the rest. The half's: per length, hits and
 * the queries whose shortlist it outran. */
struct sweep_sums {
    uint64_t *hits, truths, queries, scored, refined;
    double *sum, *sum2;
    uint64_t *half_hits, *half_cut, half_truths;
};

struct sweep_run {
    struct kd_index *ix;
    struct kd_sweep *sw;
    size_t next;
    struct kd_first_error fe;
    pthread_mutex_t lock; /* guards t */
    struct sweep_sums t;
    struct kd_filter half; /* sw->half_ids as rows; allowed NULL: by salt or none */
};

/* Per worker: the query's true neighbours, and those within the half, as
 * rows. */
struct sweep_worker {
    uint32_t *truth, *half_truth;
};

static int sums_alloc(struct sweep_sums *t, size_t nl)
{
    memset(t, 0, sizeof *t);
    t->hits = calloc(nl, sizeof *t->hits);
    t->sum = calloc(nl, sizeof *t->sum);
    t->sum2 = calloc(nl, sizeof *t->sum2);
    t->half_hits = calloc(nl, sizeof *t->half_hits);
    t->half_cut = calloc(nl, sizeof *t->half_cut);
    return t->hits && t->sum && t->sum2 && t->half_hits && t->half_cut ? 0 : -ENOMEM;
}

static void sums_free(struct sweep_sums *t)
{
    free(t->hits);
    free(t->sum);
    free(t->sum2);
    free(t->half_hits);
    free(t->half_cut);
}

/* The rows of a query's ids that are live: how many, into rows. */
static size_t truth_rows(const struct kd_index *ix, const int64_t *ids, size_t k, uint32_t *rows)
{
    size_t n = 0;
    for (size_t j = 0; j < k; j++) {
        uint32_t row = ids[j] < 0 ? KD_NO_ROW : kd_idmap_get(&ix->idmap, ids[j]);
        if (row != KD_NO_ROW)
            rows[n++] = row;
    }
    return n;
}

static int in_truth(uint32_t row, const uint32_t *truth, size_t nt)
{
    for (size_t j = 0; j < nt; j++)
        if (truth[j] == row)
            return 1;
    return 0;
}

/* Length l's sums get a query's hits among nt true neighbours. */
static void count_hits(struct sweep_sums *t, size_t l, size_t hits, size_t nt)
{
    double r = (double)hits / (double)nt;
    t->hits[l] += hits;
    t->sum[l] += r;
    t->sum2[l] += r * r;
}

int kd_in_half(int64_t id, uint64_t salt)
{
    uint64_t x = (uint64_t)id ^ salt;
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (int)((x ^ (x >> 31)) & 1);
}

static int row_in_half(const struct sweep_run *r, uint32_t row)
{
    return r->half.allowed ? r->half.allowed[row] : kd_in_half(r->ix->ids[row], r->sw->half_salt);
}

/* One query: the graph search with the longest shortlist, then the true
 * neighbours each prefix length holds. */
static int sweep_query(struct sweep_run *r, struct kd_search_ctx *c, struct sweep_worker *w,
                       size_t i, struct sweep_sums *t)
{
    struct kd_index *ix = r->ix;
    const struct kd_sweep *sw = r->sw;
    size_t k = sw->k, most = sw->lens[sw->nlens - 1];
    uint32_t hidden = KD_NONE;
    if (sw->hidden && sw->hidden[i] >= 0) {
        hidden = kd_idmap_get(&ix->idmap, sw->hidden[i]);
        if (hidden == KD_NO_ROW)
            return kd_fail(-ESRCH, "id %lld is not in the index", (long long)sw->hidden[i]);
    }
    size_t nt = truth_rows(ix, sw->truth + i * k, k, w->truth);
    size_t nh = sw->half_truth ? truth_rows(ix, sw->half_truth + i * k, k, w->half_truth) : 0;
    if (hidden == ix->graph.entry || nt == 0)
        return 0; /* left out */
    /* The oversample whose shortlist is `most` rows, clipped below. */
    struct kd_search_params sp = {k, sw->ef, (double)most / (double)k, 0, 0, 1, NULL, 0};
    const struct kd_heap_item *res;
    size_t n;
    uint64_t before = c->s.scored, refined = c->st.refined;
    int err = kd_query_graph_hiding(ix, c, sw->q + i * ix->p.dim, &sp, hidden, &res, &n);
    if (err)
        return err;
    t->scored += c->s.scored - before;
    /* A search with a shortlist of at most ef refines as many. */
    t->refined += c->st.refined - refined;
    n = n < most ? n : most;
    /* A true neighbour in a prefix is in that prefix's exact top k (fewer
     * than k vectors are closer than it): the rerank of a prefix finds
     * exactly the true neighbours it holds, and none need be read or
     * rescored. */
    size_t hits = 0, l = 0, half_hits = 0, half_seen = 0, hl = 0;
    for (size_t j = 0; j < n; j++) {
        hits += in_truth(res[j].row, w->truth, nt);
        for (; l < sw->nlens && sw->lens[l] == j + 1; l++)
            count_hits(t, l, hits, nt);
        if (nh && row_in_half(r, res[j].row)) {
            half_hits += in_truth(res[j].row, w->half_truth, nh);
            for (half_seen++; hl < sw->nlens && sw->lens[hl] == half_seen; hl++)
                t->half_hits[hl] += half_hits;
        }
    }
    for (; l < sw->nlens; l++)
        count_hits(t, l, hits, nt); /* lengths past what the beam scored */
    for (; nh && hl < sw->nlens; hl++) {
        t->half_hits[hl] += half_hits;
        t->half_cut[hl] += n == most; /* a full shortlist: the half's went on */
    }
    t->half_truths += nh;
    t->truths += nt;
    t->queries++;
    return 0;
}

static void *sweep_worker(void *arg)
{
    struct sweep_run *r = arg;
    struct kd_index *ix = r->ix;
    size_t nl = r->sw->nlens;
    struct kd_search_ctx *c = kd_search_ctx_get(ix);
    struct sweep_worker w = {malloc(r->sw->k * sizeof *w.truth),
                             malloc(r->sw->k * sizeof *w.half_truth)};
    struct sweep_sums t;
    int err = !sums_alloc(&t, nl) && c && w.truth && w.half_truth
                  ? 0
                  : kd_fail(-ENOMEM, "out of memory for a calibration");
    while (!err && !kd_first_error_set(&r->fe)) {
        size_t i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
        if (i >= r->sw->nq)
            break;
        err = sweep_query(r, c, &w, i, &t);
    }
    kd_first_error_record(&r->fe, err);
    pthread_mutex_lock(&r->lock);
    for (size_t l = 0; !err && l < nl; l++) {
        r->t.hits[l] += t.hits[l];
        r->t.sum[l] += t.sum[l];
        r->t.sum2[l] += t.sum2[l];
        r->t.half_hits[l] += t.half_hits[l];
        r->t.half_cut[l] += t.half_cut[l];
    }
    r->t.half_truths += t.half_truths;
    r->t.truths += t.truths;
    r->t.queries += t.queries;
    r->t.scored += t.scored;
    r->t.refined += t.refined;
    pthread_mutex_unlock(&r->lock);
    if (c) {
        memset(&c->st, 0, sizeof c->st); /* calibration is not the user's traffic */
        kd_search_ctx_put(ix, c);
    }
    free(w.truth);
    free(w.half_truth);
    sums_free(&t);
    return NULL;
}

int kd_index_recall_sweep(struct kd_index *ix, struct kd_sweep *sw)
{
    if (sw->k == 0 || sw->nlens == 0)
        return kd_fail(-EINVAL, "a calibration needs k >= 1 and a shortlist length");
    for (size_t l = 0; l < sw->nlens; l++)
        if (sw->lens[l] < sw->k || (l && sw->lens[l] <= sw->lens[l - 1]))
            return kd_fail(-EINVAL, "shortlist lengths must ascend from k");
    int err = kd_check_finite(sw->q, sw->nq, ix->p.dim, "query");
    if (err)
        return err;
    if (sw->half_ids && !sw->half_truth)
        return kd_fail(-EINVAL, "a calibration over half the rows needs their truth");
    struct sweep_run r = {ix, sw, 0, KD_FIRST_ERROR_INIT, PTHREAD_MUTEX_INITIALIZER};
    if (sums_alloc(&r.t, sw->nlens)) {
        err = kd_fail(-ENOMEM, "out of memory for a calibration");
        goto out;
    }
    struct kd_search_params half = {0};
    half.filter = sw->half_ids;
    half.nfilter = sw->nhalf;
    pthread_rwlock_rdlock(&ix->lock);
    err = kd_filter_build(ix, &half, &r.half);
    if (!err && ix->graph.entry != KD_NONE && sw->nq) {
        unsigned threads = kd_resolve_threads(sw->threads);
        kd_run_workers(sweep_worker, &r, threads < sw->nq ? threads : (unsigned)sw->nq);
    }
    pthread_rwlock_unlock(&ix->lock);
    kd_filter_free(&r.half);
    if (err)
        goto out;
    err = kd_first_error_take(&r.fe);
    double nq = (double)r.t.queries;
    for (size_t l = 0; l < sw->nlens; l++) {
        sw->recall[l] = r.t.truths ? (double)r.t.hits[l] / (double)r.t.truths : 1.0;
        double mean = nq ? r.t.sum[l] / nq : 0, var = nq ? r.t.sum2[l] / nq - mean * mean : 0;
        sw->spread[l] = var > 0 ? sqrt(var) : 0;
        if (sw->half_truth)
            sw->half_recall[l] = r.t.half_cut[l] || !r.t.half_truths
                                     ? NAN
                                     : (double)r.t.half_hits[l] / (double)r.t.half_truths;
    }
    sw->scored = nq ? (double)r.t.scored / nq : 0;
    sw->refined = nq ? (double)r.t.refined / nq : 0;
    sw->nqueries = (size_t)r.t.queries;
out:
    sums_free(&r.t);
    return err;
}

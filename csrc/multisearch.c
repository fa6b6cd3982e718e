/* multisearch.c — the search pipeline over several indexes (multisearch.h). */
#include "multisearch.h"
#include "common.h"
#include "exact.h"
#include "index_impl.h"
#include "search.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a call answers its queries in one index. */
enum part_mode {
    PART_SKIP,  /* nothing it could return */
    PART_EXACT, /* brute force for the whole batch, before the workers */
    PART_GRAPH, /* graph search, then its share of the common shortlist */
};

struct part {
    struct kd_index *ix;
    enum part_mode mode;
    struct kd_filter f;
    struct kd_heap_item *top; /* PART_EXACT: k items a query, ascending */
    size_t *ntop;
};

struct many {
    struct part *parts;
    size_t n;
    const float *q;
    size_t nq, dim, shortlist;
    const struct kd_search_params *sp;
    const struct kd_metric_info *metric;
    struct kd_index *credit; /* counts the queries */
    float *D;
    int64_t *I;
    size_t next;
    struct kd_first_error fe;
};

/* One index's answer to a query, ascending by distance: exact distances, or
 * estimates while the shortlist is being chosen. */
struct list {
    const struct kd_heap_item *it;
    size_t n, taken;
    int estimates;
};

/* The list whose next item is closest; SIZE_MAX when all are used up. Ties
 * go to the earlier list, so equal distances come out in a fixed order. */
static size_t closest_head(const struct list *l, size_t nl, int estimates_only)
{
    size_t best = SIZE_MAX;
    for (size_t j = 0; j < nl; j++) {
        if (l[j].taken == l[j].n || (estimates_only && !l[j].estimates))
            continue;
        if (best == SIZE_MAX || l[j].it[l[j].taken].dist < l[best].it[l[best].taken].dist)
            best = j;
    }
    return best;
}

/* The m closest estimates across the lists: a prefix of each. */
static void take_shortlist(struct list *l, size_t nl, size_t m)
{
    for (size_t j = 0; j < nl; j++)
        l[j].taken = 0;
    for (size_t got = 0; got < m; got++) {
        size_t j = closest_head(l, nl, 1);
        if (j == SIZE_MAX)
            break;
        l[j].taken++;
    }
}

static void write_merged(const struct many *m, struct list *l, float *D, int64_t *I)
{
    size_t k = m->sp->k;
    for (size_t j = 0; j < m->n; j++)
        l[j].taken = 0;
    for (size_t i = 0; i < k; i++) {
        size_t j = closest_head(l, m->n, 0);
        if (j == SIZE_MAX) {
            D[i] = m->metric->missing;
            I[i] = -1;
            continue;
        }
        const struct kd_heap_item *h = &l[j].it[l[j].taken++];
        D[i] = kd_metric_to_user(m->metric, h->dist);
        I[i] = m->parts[j].ix->ids[h->row];
    }
}

/* Query i: every graph search first, then the reads of the common shortlist
 * all in flight together, then the rescoring and the merge. */
static int many_query(struct many *m, struct kd_search_ctx **c, struct list *l, size_t i)
{
    const struct kd_search_params *sp = m->sp;
    size_t k = sp->k, n = m->n;
    const float *q = m->q + i * m->dim;
    int err = 0;
    for (size_t j = 0; j < n && !err; j++) {
        struct part *p = &m->parts[j];
        l[j] = (struct list){NULL, 0, 0, 0};
        if (p->mode == PART_EXACT) {
            l[j].it = p->top + i * k;
            l[j].n = p->ntop[i];
        } else if (p->mode == PART_GRAPH) {
            err = kd_query_graph(p->ix, c[j], q, sp, &p->f, &l[j].it, &l[j].n);
            if (!err && c[j]->finished) { /* the exact answer of a starved beam */
                kd_topk_sort(c[j]->top, c[j]->ntop);
                l[j].it = c[j]->top;
                l[j].n = c[j]->ntop;
            } else {
                l[j].estimates = 1;
            }
        }
    }
    if (err || !sp->rerank) {
        if (!err)
            write_merged(m, l, m->D + i * k, m->I + i * k);
        return err;
    }
    take_shortlist(l, n, m->shortlist);
    size_t started = 0;
    for (; started < n && !err; started++)
        if (l[started].estimates)
            err = kd_query_shortlist(m->parts[started].ix, c[started], l[started].it,
                                     l[started].taken, k);
    for (size_t j = 0; j < started; j++) {
        if (!l[j].estimates)
            continue;
        int e = kd_query_reap(m->parts[j].ix, c[j], sp, err != 0);
        err = err ? err : e;
        kd_topk_sort(c[j]->top, c[j]->ntop);
        l[j] = (struct list){c[j]->top, c[j]->ntop, 0, 0};
    }
    if (!err)
        write_merged(m, l, m->D + i * k, m->I + i * k);
    return err;
}

static void *many_worker(void *arg)
{
    struct many *m = arg;
    struct kd_search_ctx **c = calloc(m->n, sizeof *c);
    struct list *l = calloc(m->n, sizeof *l);
    int err = c && l ? 0 : kd_fail(-ENOMEM, "out of memory for a search");
    for (size_t j = 0; !err && j < m->n; j++)
        if (m->parts[j].mode == PART_GRAPH && !(c[j] = kd_search_ctx_get(m->parts[j].ix)))
            err = kd_fail(-ENOMEM, "out of memory for a search");
    uint64_t done = 0;
    while (!err && !kd_first_error_set(&m->fe)) {
        size_t i = __atomic_fetch_add(&m->next, 1, __ATOMIC_RELAXED);
        if (i >= m->nq)
            break;
        if (!(err = many_query(m, c, l, i)))
            done++;
    }
    kd_first_error_record(&m->fe, err);
    for (size_t j = 0; c && j < m->n; j++)
        if (c[j])
            kd_search_ctx_retire(m->parts[j].ix, c[j]);
    if (done && m->credit) {
        struct kd_stats st = {.queries = done};
        kd_index_stats_add(m->credit, &st);
    }
    free(c);
    free(l);
    return NULL;
}

static int by_address(const void *a, const void *b)
{
    struct kd_index *const *pa = a, *const *pb = b;
    uintptr_t x = (uintptr_t)*pa, y = (uintptr_t)*pb;
    return (x > y) - (x < y);
}

/* Decide how each index answers, and run the brute-force ones. */
static int plan_parts(struct many *m)
{
    const struct kd_search_params *sp = m->sp;
    int err = 0;
    for (size_t j = 0; j < m->n && !err; j++) {
        struct part *p = &m->parts[j];
        struct kd_index *ix = p->ix;
        if (ix->live == 0)
            continue;
        if (!m->credit)
            m->credit = ix;
        if ((err = kd_filter_build(ix, sp, &p->f)))
            break;
        size_t L = kd_shortlist_size(ix, sp);
        if (p->f.allowed && p->f.nrows == 0) {
            p->mode = PART_SKIP;
        } else if (kd_search_prefers_exact(ix, sp, &p->f) || (L >= ix->live && !ix->src->on_disk)) {
            /* A small index in memory is scanned for no more than its graph
             * search costs; one on disk still takes its share of the common
             * shortlist rather than reading all its vectors. */
            p->mode = PART_EXACT;
        } else {
            p->mode = PART_GRAPH;
            if (L > m->shortlist)
                m->shortlist = L;
        }
    }
    for (size_t j = 0; j < m->n && !err; j++) {
        struct part *p = &m->parts[j];
        if (p->mode != PART_EXACT)
            continue;
        p->top = malloc(m->nq * sp->k * sizeof *p->top);
        p->ntop = malloc(m->nq * sizeof *p->ntop);
        err = p->top && p->ntop ? kd_exact_topk(p->ix, m->q, m->nq, sp, &p->f, p->top, p->ntop)
                                : kd_fail(-ENOMEM, "out of memory for an exact search");
    }
    return err;
}

int kd_search_many(struct kd_index **ixs, size_t n, const float *q, size_t nq,
                   const struct kd_search_params *sp, float *D, int64_t *I)
{
    if (sp->k == 0)
        return kd_fail(-EINVAL, "k must be at least 1");
    if (n == 0) {
        for (size_t i = 0; i < nq * sp->k; i++) {
            D[i] = INFINITY;
            I[i] = -1;
        }
        return 0;
    }
    for (size_t j = 1; j < n; j++)
        if (ixs[j]->p.dim != ixs[0]->p.dim || ixs[j]->p.metric != ixs[0]->p.metric)
            return kd_fail(-EINVAL, "index %zu has dim %u and metric %s, index 0 dim %u and %s", j,
                           ixs[j]->p.dim, ixs[j]->metric->name, ixs[0]->p.dim,
                           ixs[0]->metric->name);
    int err = kd_check_finite(q, nq, ixs[0]->p.dim, "query");
    if (err)
        return err;
    struct kd_index **order = malloc(n * sizeof *order);
    struct part *parts = calloc(n, sizeof *parts);
    if (!order || !parts) {
        free(order);
        free(parts);
        return kd_fail(-ENOMEM, "out of memory for a search");
    }
    memcpy(order, ixs, n * sizeof *order);
    qsort(order, n, sizeof *order, by_address);
    for (size_t j = 1; j < n && !err; j++)
        if (order[j] == order[j - 1])
            err = kd_fail(-EINVAL, "the same index is given twice");
    size_t locked = 0;
    for (; !err && locked < n; locked++)
        pthread_rwlock_rdlock(&order[locked]->lock);

    struct many m = {.parts = parts,
                     .n = n,
                     .q = q,
                     .nq = nq,
                     .dim = ixs[0]->p.dim,
                     .sp = sp,
                     .metric = ixs[0]->metric,
                     .D = D,
                     .I = I,
                     .fe = KD_FIRST_ERROR_INIT};
    for (size_t j = 0; j < n; j++)
        parts[j].ix = ixs[j];
    if (!err && nq)
        err = plan_parts(&m);
    if (!err && nq) {
        unsigned threads = kd_resolve_threads(sp->threads);
        if (threads > nq)
            threads = (unsigned)nq;
        kd_run_workers(many_worker, &m, threads);
        err = kd_first_error_take(&m.fe);
    }
    for (size_t j = 0; j < n; j++) {
        kd_filter_free(&parts[j].f);
        free(parts[j].top);
        free(parts[j].ntop);
    }
    while (locked)
        pthread_rwlock_unlock(&order[--locked]->lock);
    free(order);
    free(parts);
    return err;
}

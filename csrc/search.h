/* search.h — the search pipeline of one index, internal to the core, in
 * pieces that a caller above several indexes can drive itself:
 *
 *   c = kd_search_ctx_get(ix)            per-thread state, pooled on ix
 *   kd_query_begin(ix, c, q, sp, f)      phase one: graph search over codes;
 *                                        the shortlist is scored (memory) or
 *                                        its reads are in flight (disk)
 *   kd_query_end(ix, c, sp, D, I, skip)  phase two: reap the reads, rescore,
 *                                        write the top k
 *   kd_search_ctx_put(ix, c)
 *
 * Both phases run under ix->lock held for reading, taken by the caller
 * (kd_index_search does) and held from begin to end. kd_index_search runs
 * them over a batch, two queries per worker, so that one query's reads
 * overlap the next one's graph search.
 *
 * A search over several indexes (multisearch.c) splits phase one further, to
 * choose one shortlist across them between the graph searches and the reads:
 *
 *   kd_query_graph(ix, c, q, sp, f, &res, &n)   candidates, no reads
 *   kd_query_shortlist(ix, c, res, m, k)        this index's part, m <= n
 *   kd_query_reap(ix, c, sp, skip)              c->top[0..ntop): exact, a heap */
#ifndef KD_SEARCH_H
#define KD_SEARCH_H

#include "index_impl.h"

#define KD_EARLY_WAVES 3 /* see struct early_plan in search.c */

/* Per-thread search state. Between begin and end it holds one query: */
struct kd_search_ctx {
    struct kd_search_ctx *next;
    struct kd_search_scratch s;
    struct kd_qcode qc;
    float *qn;    /* normalized query (cosine) */
    uint8_t *buf; /* aligned records for reranking */
    size_t buf_rows;
    uint32_t *rows;   /* the shortlist */
    uint64_t *rows64; /* the same, as record numbers to read */
    size_t rows_cap;
    struct kd_heap_item *top; /* exact top-k */
    size_t top_cap;
    struct kd_stats st; /* this thread's counters, folded in by the caller */
    /* A query between its two phases. */
    const float *q;      /* as searched (normalized for cosine) */
    size_t nshort, ntop; /* rows[0..nshort) and their records in buf; top[0..ntop) */
    int finished;        /* top-k is final, no reads outstanding */
    struct kd_vecio_pending *reads;
    uint64_t t_graph; /* when the graph search ended */
    /* Early reads: the likeliest part of the shortlist, read in waves while
     * the beam is still running. They are rows[0..nearly) and the first
     * slots of buf; early_sorted holds the same rows in order, for lookups,
     * until the final shortlist keeps nkept of them (only those are scored). */
    struct kd_vecio_pending *early[KD_EARLY_WAVES];
    size_t nearly;
    struct kd_heap_item *pick; /* scratch for choosing them */
    uint32_t *early_sorted;    /* after the shortlist: those of them it kept (nkept) */
    size_t pick_cap, nkept;
    float expand_ratio; /* level-0 expansions per ef, running mean; 0 unknown */
    /* Refined codes: the beam's best, re-estimated. */
    uint32_t *refine_rows;
    float *refine_dist;
    size_t refine_cap;
};

/* The rows a filter allows: built once per call, shared by its queries. */
struct kd_filter {
    uint8_t *allowed; /* per slot, NULL when no filter */
    uint32_t *rows;   /* allowed live rows */
    size_t nrows;
};

/* A context from ix's pool (or a new one; NULL when out of memory). Its
 * counters start at zero; fold them in with kd_index_stats_add before put. */
struct kd_search_ctx *kd_search_ctx_get(struct kd_index *ix);
void kd_search_ctx_put(struct kd_index *ix, struct kd_search_ctx *c);
/* Put c back after adding the counts it gathered to ix's statistics. */
void kd_search_ctx_retire(struct kd_index *ix, struct kd_search_ctx *c);
void kd_search_ctx_free(struct kd_search_ctx *c);

/* Phase one for query q (dim floats, finite). On return c holds the query as
 * searched (c->q) and either the final top-k (c->finished: no rerank, an
 * exact fallback, or a shortlist scored in memory) or the shortlist's rows
 * c->rows[0..nshort) with reads in flight into c->buf, early reads first.
 * c->q may point at q itself, which must stay valid until kd_query_end.
 * Always follow it with kd_query_end on the same c, even on error: reads
 * may be in flight. */
int kd_query_begin(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                   const struct kd_search_params *sp, const struct kd_filter *f);
/* The graph search of kd_query_begin alone (no early reads, nothing in
 * flight after it). Either c->finished, with the final exact top-k in
 * c->top[0..ntop) as a heap (the filter starved the beam), or the candidates
 * res[0..nres), ascending by estimate, at most the shortlist size; they stay
 * valid until the next search on c. */
int kd_query_graph(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                   const struct kd_search_params *sp, const struct kd_filter *f,
                   const struct kd_heap_item **res, size_t *nres);
/* kd_query_graph without a filter, the row `hidden` searched as if absent
 * (struct kd_accept); the candidates are at most the shortlist size. */
int kd_query_graph_hiding(struct kd_index *ix, struct kd_search_ctx *c, const float *q,
                          const struct kd_search_params *sp, uint32_t hidden,
                          const struct kd_heap_item **res, size_t *nres);
/* After kd_query_graph: score res[0..n) (memory) or start their reads (disk);
 * n may be 0. Follow it with kd_query_reap on the same c, even on error. */
int kd_query_shortlist(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_heap_item *res,
                       size_t n, size_t k);
/* kd_query_end without the answer: reap, rescore into c->top[0..ntop), a
 * max-heap of internal distances (kd_topk_sort orders it). */
int kd_query_reap(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_search_params *sp,
                  int skip);
/* Phase two: wait for every read begin left, rescore, sort, write sp->k
 * results to D and I (missing ones as the metric's missing value and -1).
 * skip: reap only, write nothing (D and I may be NULL). */
int kd_query_end(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_search_params *sp,
                 float *D, int64_t *I, int skip);

/* The rows of sp->filter's ids, under the same read lock as the queries
 * that use it. Free it with kd_filter_free, after a failure too. */
int kd_filter_build(struct kd_index *ix, const struct kd_search_params *sp, struct kd_filter *f);
void kd_filter_free(struct kd_filter *f);
/* Rows the shortlist of a query with these parameters holds, and the beam
 * width of its graph search (both widened for live vectors past sp->serves;
 * call them under the index's lock). */
size_t kd_shortlist_size(const struct kd_index *ix, const struct kd_search_params *sp);
size_t kd_beam_width(const struct kd_index *ix, const struct kd_search_params *sp);
/* 1 when queries with these parameters are better answered by brute force:
 * asked for, no graph, or a filter too selective for a beam. */
int kd_search_prefers_exact(const struct kd_index *ix, const struct kd_search_params *sp,
                            const struct kd_filter *f);
/* Brute force for nq queries (normalized here for cosine): top[i*k..) holds
 * ntop[i] items of query i, ascending. Counts read I/O and exact_queries in
 * ix's stats, not queries. */
int kd_exact_topk(struct kd_index *ix, const float *q, size_t nq, const struct kd_search_params *sp,
                  const struct kd_filter *f, struct kd_heap_item *top, size_t *ntop);

/* The two kd_vsource shortlist operations. */
int kd_shortlist_score_memory(struct kd_index *ix, struct kd_search_ctx *c,
                              const struct kd_heap_item *res, size_t n, size_t k);
int kd_shortlist_read(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_heap_item *res,
                      size_t n, size_t k);

#endif

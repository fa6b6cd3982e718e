/* hnsw.h — the proximity graph: layered neighbour lists, parallel insertion
 * over a distance oracle (build codes), and beam search driven by any batch distance
 * (quantized estimates at query time). */
#ifndef KD_HNSW_H
#define KD_HNSW_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define KD_MAX_LEVEL 15
#define KD_NONE UINT32_MAX

struct kd_graph {
    uint32_t m, m0;   /* list capacity on upper levels / level 0 (2m) */
    uint64_t count;   /* nodes present */
    uint32_t *level0; /* per node: [n, nbr * m0] */
    uint8_t *levels;  /* top level of each node */
    uint32_t **upper; /* per node with level > 0: level * [n, nbr * m] */
    uint8_t *locks;   /* per-node list change counts, build only (hnsw.c) */
    int owns;         /* arrays are heap-owned (not mapped) */
    uint32_t entry;
    int max_level;
    pthread_mutex_t entry_lock;
};

static inline uint32_t *kd_graph_list(const struct kd_graph *g, uint32_t node, int level)
{
    if (level == 0)
        return g->level0 + (size_t)node * (1 + g->m0);
    return g->upper[node] + (size_t)(level - 1) * (1 + g->m);
}

/* Batch distance from the current query to rows[0..n). */
typedef void (*kd_batch_dist_fn)(void *ctx, const uint32_t *rows, size_t n, float *out);
/* Start fetching what scoring rows[0..n) will read (may be NULL). */
typedef void (*kd_prefetch_fn)(void *ctx, const uint32_t *rows, size_t n);

struct kd_heap_item {
    float dist;
    uint32_t row;
};

/* Move the m closest of a[0..n) to a[0..m), in no particular order
 * (quickselect: the early reads' waves and a refined shortlist need the set,
 * and a sort of an ef-sized beam three times a query is not free). Ties go
 * by row; rows are distinct. */
void kd_select_closest(struct kd_heap_item *a, size_t n, size_t m);

/* Per-thread search scratch. */
struct kd_visited {
    uint8_t *tags; /* one byte a node: half the cache of a 16-bit tag */
    uint64_t cap;
    uint8_t now;
};

struct kd_search_scratch {
    struct kd_visited visited;
    struct kd_heap_item *cand, *res;
    uint64_t *done; /* heap_cap bits: which of res a sorted beam expanded */
    size_t heap_cap;
    struct kd_heap_item *pool; /* the best `keep` of all nodes scored (hnsw.c, struct pool) */
    size_t pool_cap;
    const struct kd_heap_item *out; /* results of the last search */
    uint32_t *rows;
    float *dists;
    uint32_t *list;  /* copy of one neighbour list */
    uint64_t scored; /* distances computed by searches with this scratch */
};

int kd_scratch_reserve(struct kd_search_scratch *s, uint64_t nodes, size_t ef, uint32_t m0);
void kd_scratch_free(struct kd_search_scratch *s);

/* Which nodes may be results: not tombstoned, and allowed by a filter.
 * Either array may be NULL (no constraint); other nodes are still walked.
 * The hidden node is neither walked nor returned, as if it had never been
 * added: a query made of a node's own vector then meets the graph as an
 * unseen query would (calibration, calibrate.c). It must not be the entry. */
struct kd_accept {
    const uint8_t *deleted; /* NULL: nothing removed */
    const uint8_t *allowed; /* NULL: no filter */
    uint32_t hidden;        /* KD_NONE: none */
};

/* An optional call in the middle of the level-0 beam: after `after`
 * expansions, fn gets the best nodes found so far (unordered), so that a
 * caller can start work on the likely answer while the beam goes on.
 * `expansions` returns how many the beam made in all. */
struct kd_search_early {
    size_t after;
    void (*fn)(void *arg, const struct kd_heap_item *best, size_t n);
    void *arg;
    size_t expansions;
};

/* Greedy descent from the entry to level 1, then a beam of width ef on level
 * 0. Results, ascending by distance, are left at s->out; returns how many.
 * With keep > ef they are the best `keep` of every node the beam scored, not
 * only of the beam: a deep shortlist then costs no wider a beam. early may be
 * NULL. */
size_t kd_graph_search(const struct kd_graph *g, struct kd_search_scratch *s, size_t ef,
                       size_t keep, kd_batch_dist_fn dist, kd_prefetch_fn prefetch, void *dctx,
                       const struct kd_accept *accept, struct kd_search_early *early);

int kd_graph_init(struct kd_graph *g, uint32_t m);
void kd_graph_free(struct kd_graph *g);
/* Grow heap-owned arrays to hold cap nodes. */
int kd_graph_reserve(struct kd_graph *g, uint64_t cap);
int kd_graph_level_for(uint64_t seed, uint64_t row, uint32_t m);
/* Give nodes [first, last) their levels and empty lists; node i's level is
 * drawn from (seed, i). */
int kd_graph_prepare(struct kd_graph *g, uint64_t first, uint64_t last, uint64_t seed);
/* The same, node i's level drawn from (seed, keys[i - first]): for rows
 * whose numbers recur from one build to the next (a merge appends its
 * inserted rows at the same row numbers every time), a key of their own
 * keeps the levels independent draws. */
int kd_graph_prepare_keyed(struct kd_graph *g, uint64_t first, uint64_t last, uint64_t seed,
                           const uint64_t *keys);

/* Distances from a stored node to others, what insertion needs: exact, or
 * estimates over build codes (buildcode.h, merge.c). */
struct kd_build_oracle {
    void (*from)(void *ctx, uint32_t a, const uint32_t *rows, size_t n, float *out);
    void *ctx;
    const struct kd_beam_oracle *beam; /* NULL: the beam scores with from */
    void *beam_ctx;                    /* what beam->open is given */
};

#define KD_BEAM_AHEAD 12 /* nodes a worker claims at a time, told to ahead */

/* A cheaper estimate for insertion's beam, whose best are re-scored with
 * `from` before neighbours are chosen: smaller codes keep the beam's reads
 * in cache where the build codes no longer fit. State is per thread: open
 * returns it (NULL when out of memory) and prepare points it at node a. */
struct kd_beam_oracle {
    void *(*open)(void *ctx);
    void (*close)(void *state);
    /* The next up to KD_BEAM_AHEAD nodes the state will be prepared for,
     * so that it can make their terms together; NULL: none to make. */
    void (*ahead)(void *state, const uint32_t *nodes, size_t n);
    void (*prepare)(void *state, uint32_t a);
    kd_batch_dist_fn dist;
    kd_prefetch_fn prefetch;
};

/* The diversity rule insertion uses, for a caller that rebuilds a list:
 * of candidates c[0..n), ascending by distance to the node, keep in order
 * those closer to the node than to any one kept before, at most cap; their
 * rows go to out. Returns how many were kept. */
size_t kd_graph_select(const struct kd_build_oracle *o, const struct kd_heap_item *c, size_t n,
                       size_t cap, uint32_t *out);

/* Nodes[0..n), already in the graph (count and entry set), whose level-0
 * lists have grown thin: each is searched for from the entry as insertion
 * does, its remaining neighbours are merged with what the beam found, the
 * diverse ones become its list (at most m) and link back to it. */
int kd_graph_reconnect(struct kd_graph *g, const uint32_t *nodes, size_t n,
                       uint32_t ef_construction, const struct kd_build_oracle *o, unsigned threads);

/* order[0..n) names nodes [first, first + n), prepared, in some order; it
 * becomes an insertion order: the nodes with upper levels as they came (a
 * sparse skeleton over every region), then the level-0 nodes by row, so
 * that rows stored a neighbourhood at a time are inserted so too. */
void kd_graph_skeleton_first(const struct kd_graph *g, uint64_t first, size_t n, uint32_t *order);

/* Insert nodes [first, last), whose levels and upper lists kd_graph_prepare
 * has set, using `threads` workers, in row order; or, with order, the nodes
 * order[0..last - first) names in that order. The graph's count becomes at
 * least last and above every node inserted. */
int kd_graph_insert_range(struct kd_graph *g, uint64_t first, uint64_t last, const uint32_t *order,
                          uint32_t ef_construction, const struct kd_build_oracle *o,
                          unsigned threads);

#endif

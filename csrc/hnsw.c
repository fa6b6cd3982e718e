#include "hnsw.h"
#include "common.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch */

/* Words of the marks of n beam places (hnsw.h, done). */
static size_t marks_words(size_t n) { return n / 64 + 1; }

int kd_scratch_reserve(struct kd_search_scratch *s, uint64_t nodes, size_t ef, uint32_t m0)
{
    if (nodes > s->visited.cap) {
        uint64_t cap = nodes + nodes / 4 + 1024;
        uint8_t *t = calloc(cap, sizeof *t);
        if (!t)
            return kd_fail(-ENOMEM, "out of memory for search scratch");
        free(s->visited.tags);
        s->visited.tags = t;
        s->visited.cap = cap;
        s->visited.now = 0;
    }
    if (ef > SIZE_MAX / sizeof(struct kd_heap_item) - m0 - 2)
        return kd_fail(-ENOMEM, "out of memory for search scratch (ef %zu)", ef);
    size_t need = ef + m0 + 2;
    if (need > s->heap_cap) {
        struct kd_heap_item *c = realloc(s->cand, need * sizeof *c);
        if (c)
            s->cand = c;
        struct kd_heap_item *r = realloc(s->res, need * sizeof *r);
        if (r)
            s->res = r;
        uint64_t *d = realloc(s->done, marks_words(need) * sizeof *d);
        if (d)
            s->done = d;
        if (!c || !r || !d)
            return kd_fail(-ENOMEM, "out of memory for search scratch");
        s->heap_cap = need;
    }
    if (!s->rows) {
        s->rows = malloc((m0 + 1) * sizeof(uint32_t));
        s->dists = malloc((m0 + 1) * sizeof(float));
        s->list = malloc((m0 + 1) * sizeof(uint32_t));
        if (!s->rows || !s->dists || !s->list)
            return kd_fail(-ENOMEM, "out of memory for search scratch");
    }
    return 0;
}

void kd_scratch_free(struct kd_search_scratch *s)
{
    free(s->visited.tags);
    free(s->cand);
    free(s->res);
    free(s->done);
    free(s->pool);
    free(s->rows);
    free(s->dists);
    free(s->list);
    memset(s, 0, sizeof *s);
}

static void visited_next(struct kd_visited *v)
{
    if (++v->now == 0) {
        memset(v->tags, 0, v->cap * sizeof *v->tags);
        v->now = 1;
    }
}

/* ---- binary heaps: cand is a min-heap, res a max-heap, on dist. */

static inline int before(struct kd_heap_item a, struct kd_heap_item b, int max)
{
    return max ? a.dist > b.dist : a.dist < b.dist;
}

static void heap_push(struct kd_heap_item *h, size_t *n, struct kd_heap_item it, int max)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(it, h[p], max))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

/* Put `it` at the root's place and sift it down through h[0..len). */
static inline void sift_down(struct kd_heap_item *h, size_t len, struct kd_heap_item it, int max)
{
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len)
            break;
        if (c + 1 < len && before(h[c + 1], h[c], max))
            c++;
        if (!before(h[c], it, max))
            break;
        h[i] = h[c];
        i = c;
    }
    if (len)
        h[i] = it;
}

static struct kd_heap_item heap_pop(struct kd_heap_item *h, size_t *n, int max)
{
    struct kd_heap_item top = h[0];
    --(*n);
    sift_down(h, *n, h[*n], max);
    return top;
}

static int cand_grow(struct kd_search_scratch *s, size_t n)
{
    if (n < s->heap_cap)
        return 0;
    size_t cap = s->heap_cap * 2;
    struct kd_heap_item *c = realloc(s->cand, cap * sizeof *c);
    struct kd_heap_item *r = c ? realloc(s->res, cap * sizeof *r) : NULL;
    uint64_t *d = r ? realloc(s->done, marks_words(cap) * sizeof *d) : NULL;
    if (c)
        s->cand = c;
    if (r)
        s->res = r;
    if (d)
        s->done = d;
    if (!c || !r || !d)
        return -ENOMEM;
    s->heap_cap = cap;
    return 0;
}

/* ---- list locks (build only)
 *
 * A node's lock byte counts its list changes: odd while a writer holds it.
 * Writers exclude each other on it. Readers take no lock and copy again if
 * a writer came by: a locked instruction per expanded node stalled the
 * prefetches in flight (a quarter of the insertion loop's own time). List
 * words change only through release stores and are read by acquire loads
 * (plain moves on x86): a copy that saw any word of a writer's then sees
 * the writer's odd count, and is taken again. */

static inline void node_lock(const struct kd_graph *g, uint32_t i)
{
    for (;;) {
        uint8_t s = __atomic_load_n(&g->locks[i], __ATOMIC_RELAXED);
        if (!(s & 1) && __atomic_compare_exchange_n(&g->locks[i], &s, (uint8_t)(s + 1), 0,
                                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
        sched_yield();
    }
}

static inline void node_unlock(const struct kd_graph *g, uint32_t i)
{
    uint8_t s = __atomic_load_n(&g->locks[i], __ATOMIC_RELAXED);
    __atomic_store_n(&g->locks[i], (uint8_t)(s + 1), __ATOMIC_RELEASE);
}

/* Set a locked list to src[0..n). */
static void list_store(uint32_t *l, const uint32_t *src, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        __atomic_store_n(&l[1 + i], src[i], __ATOMIC_RELEASE);
    __atomic_store_n(&l[0], n, __ATOMIC_RELEASE);
}

/* Append node to a locked list that has room. */
static void list_push(uint32_t *l, uint32_t n, uint32_t node)
{
    __atomic_store_n(&l[1 + n], node, __ATOMIC_RELEASE);
    __atomic_store_n(&l[0], n + 1, __ATOMIC_RELEASE);
}

/* Copy a node's list (consistently, while building); returns its length. */
static uint32_t read_list(const struct kd_graph *g, uint32_t node, int level, uint32_t *out,
                          int locked)
{
    const uint32_t *l = kd_graph_list(g, node, level);
    if (!locked) {
        uint32_t n = l[0];
        memcpy(out, l + 1, n * sizeof(uint32_t));
        return n;
    }
    uint32_t cap = level == 0 ? g->m0 : g->m;
    for (;;) {
        uint8_t s = __atomic_load_n(&g->locks[node], __ATOMIC_ACQUIRE);
        if (s & 1) {
            sched_yield();
            continue;
        }
        uint32_t n = __atomic_load_n(&l[0], __ATOMIC_ACQUIRE);
        n = n < cap ? n : cap;
        for (uint32_t i = 0; i < n; i++)
            out[i] = __atomic_load_n(&l[1 + i], __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&g->locks[node], __ATOMIC_RELAXED) == s)
            return n;
    }
}

/* ---- search */

/* Start fetching all of a list's lines: a level-0 list of 2m + 1 words
 * spans three. While building, its lock byte too: read_list waits on it
 * first (half of read_list's time in a 544k x 384 build was that miss). */
static inline void prefetch_list(const struct kd_graph *g, uint32_t node, int level, int locked)
{
    if (locked)
        __builtin_prefetch(&g->locks[node]);
    const uint32_t *l = kd_graph_list(g, node, level);
    uintptr_t end = (uintptr_t)(l + 1 + (level ? g->m : g->m0));
    for (uintptr_t a = (uintptr_t)l & ~(uintptr_t)63; a < end; a += 64)
        __builtin_prefetch((const void *)a);
}

/* Whether a row may be returned: not deleted, and allowed by the filter. */
static inline int accepted(const struct kd_accept *a, uint32_t row)
{
    return !a || ((!a->deleted || !a->deleted[row]) && (!a->allowed || a->allowed[row]));
}

static inline int closer(const struct kd_heap_item *x, const struct kd_heap_item *y)
{
    return x->dist < y->dist || (x->dist == y->dist && x->row < y->row);
}

void kd_select_closest(struct kd_heap_item *a, size_t n, size_t m)
{
    size_t lo = 0, hi = n;
    while (lo < m && m < hi && hi - lo > 1) {
        struct kd_heap_item pivot = a[lo + (hi - lo) / 2], t;
        size_t lt = lo, i = lo, gt = hi; /* [lo,lt) < pivot, [gt,hi) > pivot */
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

/* A distance's bits as an unsigned key in the same order (negatives too). */
static inline uint32_t order_key(float d)
{
    uint32_t u;
    memcpy(&u, &d, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* h[0..n) into ascending order, tmp[0..n) its spare. A radix sort, a byte
 * a pass, skipping the bytes that every key shares: a heap sort's
 * unpredictable branches took 6% of a build (100k x 256). Stable, so ties
 * keep one order and threads=1 builds stay reproducible. */
static void sort_ascending(struct kd_heap_item *h, struct kd_heap_item *tmp, size_t n)
{
    if (n < 32) {
        for (size_t i = 1; i < n; i++) {
            struct kd_heap_item it = h[i];
            size_t j = i;
            for (; j > 0 && h[j - 1].dist > it.dist; j--)
                h[j] = h[j - 1];
            h[j] = it;
        }
        return;
    }
    uint32_t count[4][256] = {{0}};
    for (size_t i = 0; i < n; i++) {
        uint32_t k = order_key(h[i].dist);
        for (int b = 0; b < 4; b++)
            count[b][(k >> (8 * b)) & 0xff]++;
    }
    struct kd_heap_item *from = h, *to = tmp;
    for (int b = 0; b < 4; b++) {
        uint32_t *c = count[b], at = 0;
        if (c[(order_key(h[0].dist) >> (8 * b)) & 0xff] == n)
            continue;
        for (int v = 0; v < 256; v++) {
            uint32_t m = c[v];
            c[v] = at;
            at += m;
        }
        for (size_t i = 0; i < n; i++)
            to[c[(order_key(from[i].dist) >> (8 * b)) & 0xff]++] = from[i];
        struct kd_heap_item *t = from;
        from = to;
        to = t;
    }
    if (from != h)
        memcpy(h, from, n * sizeof *h);
}

/* The best `keep` of every node scored, gathered without a heap: an offer
 * whose key is under the bound is appended, without a branch. When the next
 * offers might not fit, the buffer is narrowed by a histogram of its keys to
 * the buckets that hold its keep closest, and the bound tightens to their
 * edge; the last narrowing and the sort pick the keep. A bounded heap's sift,
 * whose branches are coin tosses, took 13% of a search at 256 dimensions
 * with a shortlist of 120. The buffer holds pool_cap items, then
 * as many as the sort's spare (kd_graph_search). */
struct pool {
    struct kd_heap_item *h;
    size_t n, keep, cap;
    uint64_t edge; /* keys from here on are out */
};

/* The buffer's room past keep: 7 * keep, at most POOL_SLACK (a beam at ef
 * 54 scores about 850 nodes; the room spares most searches any narrowing
 * before the last). */
#define POOL_SLACK 8192

static size_t pool_cap(size_t keep, uint32_t m0)
{
    return keep + (keep < POOL_SLACK / 7 ? 7 * keep : POOL_SLACK) + m0;
}

static struct pool pool_start(struct kd_search_scratch *s, size_t keep, uint32_t m0)
{
    struct pool p = {s->pool, 0, keep, pool_cap(keep, m0), UINT64_MAX};
    return p;
}

static inline void pool_offer(struct pool *p, struct kd_heap_item it)
{
    p->h[p->n] = it;
    p->n += order_key(it.dist) < p->edge;
}

/* Down to the buckets of keys that hold the keep closest; exact: to the keep
 * closest themselves. */
static void pool_trim(struct pool *p, int exact)
{
    struct kd_heap_item *h = p->h;
    size_t n = p->n;
    if (n <= p->keep)
        return;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = order_key(h[i].dist);
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    unsigned shift = 0;
    while ((hi - lo) >> shift > 255)
        shift++;
    uint32_t count[256] = {0};
    for (size_t i = 0; i < n; i++)
        count[(order_key(h[i].dist) - lo) >> shift]++;
    size_t b = 0, below = count[0];
    while (below < p->keep)
        below += count[++b];
    uint64_t edge = (uint64_t)lo + ((uint64_t)(b + 1) << shift);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct kd_heap_item it = h[i];
        h[m] = it;
        m += order_key(it.dist) < edge;
    }
    p->n = m;
    p->edge = edge < p->edge ? edge : p->edge;
    if (exact && m > p->keep) {
        kd_select_closest(h, m, p->keep);
        p->n = p->keep;
    }
}

/* Room for `more` offers. */
static inline void pool_room(struct pool *p, size_t more)
{
    if (p->n + more <= p->cap)
        return;
    pool_trim(p, 0);
    if (p->n + more > p->cap) /* keys alike: the histogram could not split them */
        pool_trim(p, 1);
}

/* The keep closest, ascending, at p->h; spare: room for p->n more. */
static size_t pool_sorted(struct pool *p, struct kd_heap_item *spare)
{
    pool_trim(p, 0);
    sort_ascending(p->h, spare, p->n);
    return p->n < p->keep ? p->n : p->keep;
}

/* The nodes of list[0..n) not seen yet, copied to rows and marked seen;
 * returns how many. */
static inline uint32_t take_unseen(uint8_t *tags, uint8_t now, const uint32_t *list, uint32_t n,
                                   uint32_t *rows)
{
    for (uint32_t i = 0; i < n; i++) /* the tags are scattered: ask for all at once */
        __builtin_prefetch(&tags[list[i]]);
    /* Without a branch: whether a neighbour was seen is a coin toss the
     * predictor loses (an eighth of insertion's own time). */
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = list[i];
        uint8_t seen = tags[r];
        tags[r] = now;
        rows[m] = r;
        m += seen != now;
    }
    return m;
}

/* Beam search on one level from the entries in s->res[0..nentry), with a
 * heap of candidates beside the results: a filter may keep a node out of
 * the results that the beam still walks through. */
static size_t search_layer_heaps(const struct kd_graph *g, struct kd_search_scratch *s, int level,
                                 size_t ef, size_t nentry, kd_batch_dist_fn dist, void *dctx,
                                 const struct kd_accept *accept, int locked, size_t keep,
                                 kd_prefetch_fn prefetch, struct kd_search_early *early)
{
    struct kd_visited *v = &s->visited;
    visited_next(v);
    if (accept && accept->hidden != KD_NONE)
        v->tags[accept->hidden] = v->now; /* never scored, never expanded */
    size_t ncand = 0, nres = 0;
    if (keep <= ef)
        keep = 0;
    struct pool pool = pool_start(s, keep, g->m0);
    /* Entries arrive in s->res, which is about to become the result heap. */
    struct kd_heap_item tmp[64];
    size_t ne = nentry < 64 ? nentry : 64;
    memcpy(tmp, s->res, ne * sizeof *tmp);
    for (size_t i = 0; i < ne; i++) {
        v->tags[tmp[i].row] = v->now;
        heap_push(s->cand, &ncand, tmp[i], 0);
        if (accepted(accept, tmp[i].row)) {
            heap_push(s->res, &nres, tmp[i], 1);
            if (keep) {
                pool_room(&pool, 1);
                pool_offer(&pool, tmp[i]);
            }
        }
    }
    size_t expanded = 0;
    while (ncand > 0) {
        struct kd_heap_item c = heap_pop(s->cand, &ncand, 0);
        if (nres >= ef && c.dist > s->res[0].dist)
            break;
        if (early && expanded++ == early->after) {
            pool_trim(&pool, 1);
            early->fn(early->arg, keep ? pool.h : s->res, keep ? pool.n : nres);
        }
        uint32_t n = read_list(g, c.row, level, s->list, locked);
        if (ncand) /* the next list to expand, most likely */
            prefetch_list(g, s->cand[0].row, level, locked);
        uint32_t m = take_unseen(v->tags, v->now, s->list, n, s->rows);
        if (!m)
            continue;
        if (prefetch)
            prefetch(dctx, s->rows, m);
        dist(dctx, s->rows, m, s->dists);
        s->scored += m;
        if (keep)
            pool_room(&pool, m);
        for (uint32_t i = 0; i < m; i++) {
            struct kd_heap_item it = {s->dists[i], s->rows[i]};
            int ok = -1;
            if (keep && (ok = accepted(accept, it.row)))
                pool_offer(&pool, it);
            if (nres < ef || it.dist < s->res[0].dist) {
                if (cand_grow(s, ncand + 1))
                    return 0;
                heap_push(s->cand, &ncand, it, 0);
                /* a candidate now is likely expanded soon: start its list */
                __builtin_prefetch(kd_graph_list(g, it.row, level));
                if (ok < 0)
                    ok = accepted(accept, it.row);
                if (ok) {
                    if (nres < ef)
                        heap_push(s->res, &nres, it, 1);
                    else
                        sift_down(s->res, nres, it, 1);
                }
            }
        }
    }
    if (early)
        early->expansions = expanded;
    if (keep) {
        s->out = pool.h;
        return pool_sorted(&pool, pool.h + pool.cap);
    }
    /* The sort's spare: the candidates' heap (done with, and as large as
     * the results'). */
    sort_ascending(s->res, s->cand, nres);
    s->out = s->res;
    return nres;
}

#define SORTED_BEAM_MAX 1024 /* ef 2048: 1.05x the heaps' time; 1024: equal */

/* Mark `at` of the marks w[0..n) (n >= 1 after) cleared, the marks from at
 * up moved one place along: the words of a beam of 64 or fewer are one. */
static inline void marks_insert(uint64_t *w, size_t at, size_t n)
{
    size_t a = at / 64;
    for (size_t i = (n - 1) / 64; i > a; i--)
        w[i] = (w[i] << 1) | (w[i - 1] >> 63);
    uint64_t low = (UINT64_C(1) << (at % 64)) - 1;
    w[a] = (w[a] & low) | ((w[a] & ~low) << 1);
}

/* The first unmarked of from..n, or n. */
static inline size_t first_unmarked(const uint64_t *w, size_t from, size_t n)
{
    while (from < n) {
        uint64_t open = ~w[from / 64] >> (from % 64);
        if (open) {
            from += (size_t)__builtin_ctzll(open);
            return from < n ? from : n;
        }
        from = (from / 64 + 1) * 64;
    }
    return n;
}

/* Put it in the ascending r[0..*n) of at most cap (cap >= 1, and it beats
 * r[cap - 1] when full), unexpanded, after any equal; returns its place. */
static inline size_t sorted_insert(struct kd_heap_item *r, uint64_t *done, size_t *n, size_t cap,
                                   struct kd_heap_item it)
{
    /* Branch-free halving: which half holds the place is a coin toss. */
    const struct kd_heap_item *base = r;
    size_t len = *n;
    while (len > 1) {
        size_t half = len / 2;
        base = base[half].dist <= it.dist ? base + half : base;
        len -= half;
    }
    size_t lo = (size_t)(base - r) + (len == 1 && base->dist <= it.dist);
    size_t moved = (*n < cap ? *n : cap - 1) - lo;
    memmove(r + lo + 1, r + lo, moved * sizeof *r);
    r[lo] = it;
    if (*n < cap)
        (*n)++;
    marks_insert(done, lo, *n);
    return lo;
}

/* The beam with every node a possible result: the best ef found so far,
 * kept ascending in s->res with a mark for each expanded, and the next to
 * expand the first unmarked. This is the heaps' walk (expand the nearest
 * candidate while it beats the ef-th result), but a node that falls out of
 * the results is dropped at once, and the results need no sort. With the
 * place found without branches, the graph phase of a search took 0.91-0.95
 * of the heaps' time (100k x 384, ef 16 to 256); each insertion moves up to
 * ef items, so past SORTED_BEAM_MAX the heaps are the cheaper. */
static size_t search_layer_sorted(const struct kd_graph *g, struct kd_search_scratch *s, int level,
                                  size_t ef, size_t nentry, kd_batch_dist_fn dist, void *dctx,
                                  uint32_t hidden, int locked, size_t keep, kd_prefetch_fn prefetch,
                                  struct kd_search_early *early)
{
    struct kd_visited *v = &s->visited;
    visited_next(v);
    uint8_t *tags = v->tags, now = v->now;
    if (hidden != KD_NONE)
        tags[hidden] = now; /* never scored, never expanded */
    if (keep <= ef)
        keep = 0;
    struct pool pool = pool_start(s, keep, g->m0);
    struct kd_heap_item *res = s->res, tmp[64];
    uint64_t *done = s->done;
    size_t nres = 0, ne = nentry < 64 ? nentry : 64;
    memcpy(tmp, res, ne * sizeof *tmp); /* the entries arrive where the results go */
    for (size_t i = 0; i < ne; i++) {
        tags[tmp[i].row] = now;
        if (nres < ef || tmp[i].dist < res[nres - 1].dist)
            sorted_insert(res, done, &nres, ef, tmp[i]);
        if (keep) {
            pool_room(&pool, 1);
            pool_offer(&pool, tmp[i]);
        }
    }
    uint32_t *rows = s->rows, *list = s->list;
    float *dists = s->dists;
    size_t expanded = 0, next = 0;
    while (next < nres) {
        struct kd_heap_item c = res[next];
        done[next / 64] |= UINT64_C(1) << (next % 64);
        next = first_unmarked(done, next, nres);
        if (early && expanded++ == early->after) {
            pool_trim(&pool, 1);
            early->fn(early->arg, keep ? pool.h : res, keep ? pool.n : nres);
        }
        uint32_t n = read_list(g, c.row, level, list, locked);
        if (next < nres) /* the next list to expand, most likely */
            prefetch_list(g, res[next].row, level, locked);
        uint32_t m = take_unseen(tags, now, list, n, rows);
        if (!m)
            continue;
        if (prefetch)
            prefetch(dctx, rows, m);
        dist(dctx, rows, m, dists);
        s->scored += m;
        if (keep)
            pool_room(&pool, m);
        for (uint32_t i = 0; i < m; i++) {
            struct kd_heap_item it = {dists[i], rows[i]};
            if (keep)
                pool_offer(&pool, it);
            if (nres < ef || it.dist < res[nres - 1].dist) {
                size_t at = sorted_insert(res, done, &nres, ef, it);
                next = at < next ? at : next;
                __builtin_prefetch(kd_graph_list(g, it.row, level));
            }
        }
    }
    if (early)
        early->expansions = expanded;
    if (keep) {
        s->out = pool.h;
        return pool_sorted(&pool, pool.h + pool.cap);
    }
    s->out = res;
    return nres;
}

/* Beam search on one level from the entries in s->res[0..nentry). */
static size_t search_layer(const struct kd_graph *g, struct kd_search_scratch *s, int level,
                           size_t ef, size_t nentry, kd_batch_dist_fn dist, void *dctx,
                           const struct kd_accept *accept, int locked, size_t keep,
                           kd_prefetch_fn prefetch, struct kd_search_early *early)
{
    if (ef <= SORTED_BEAM_MAX && (!accept || (!accept->deleted && !accept->allowed)))
        return search_layer_sorted(g, s, level, ef, nentry, dist, dctx,
                                   accept ? accept->hidden : KD_NONE, locked, keep, prefetch,
                                   early);
    return search_layer_heaps(g, s, level, ef, nentry, dist, dctx, accept, locked, keep, prefetch,
                              early);
}

/* Greedy walk down to `stop`+1, starting from the entry; result in s->res[0]. */
static void descend(const struct kd_graph *g, struct kd_search_scratch *s, uint32_t ep, int top,
                    int stop, kd_batch_dist_fn dist, void *dctx, int locked, uint32_t hidden)
{
    float d;
    dist(dctx, &ep, 1, &d);
    for (int level = top; level > stop; level--) {
        for (int changed = 1; changed;) {
            changed = 0;
            uint32_t n = read_list(g, ep, level, s->rows, locked);
            if (!n)
                break;
            dist(dctx, s->rows, n, s->dists);
            s->scored += n;
            for (uint32_t i = 0; i < n; i++)
                if (s->dists[i] < d && s->rows[i] != hidden) {
                    d = s->dists[i];
                    ep = s->rows[i];
                    changed = 1;
                }
        }
    }
    s->res[0].row = ep;
    s->res[0].dist = d;
}

size_t kd_graph_search(const struct kd_graph *g, struct kd_search_scratch *s, size_t ef,
                       size_t keep, kd_batch_dist_fn dist, kd_prefetch_fn prefetch, void *dctx,
                       const struct kd_accept *accept, struct kd_search_early *early)
{
    if (g->entry == KD_NONE)
        return 0;
    size_t pool = 2 * pool_cap(keep, g->m0); /* struct pool, and the sort's spare */
    if (keep && pool > s->pool_cap) {
        struct kd_heap_item *p = realloc(s->pool, pool * sizeof *p);
        if (!p)
            return 0;
        s->pool = p;
        s->pool_cap = pool;
    }
    descend(g, s, g->entry, g->max_level, 0, dist, dctx, 0, accept ? accept->hidden : KD_NONE);
    return search_layer(g, s, 0, ef, 1, dist, dctx, accept, 0, keep, prefetch, early);
}

/* ---- structure */

int kd_graph_init(struct kd_graph *g, uint32_t m)
{
    memset(g, 0, sizeof *g);
    g->m = m;
    g->m0 = 2 * m;
    g->entry = KD_NONE;
    g->max_level = -1;
    g->owns = 1;
    pthread_mutex_init(&g->entry_lock, NULL);
    return 0;
}

void kd_graph_free(struct kd_graph *g)
{
    if (g->owns) {
        for (uint64_t i = 0; g->upper && i < g->count; i++)
            free(g->upper[i]);
        free(g->level0);
        free(g->levels);
    }
    free(g->upper);
    free(g->locks);
    pthread_mutex_destroy(&g->entry_lock);
    memset(g, 0, sizeof *g);
}

int kd_graph_reserve(struct kd_graph *g, uint64_t cap)
{
    uint32_t *l0 = realloc(g->level0, cap * (1 + g->m0) * sizeof(uint32_t));
    if (l0)
        g->level0 = l0;
    uint8_t *lv = realloc(g->levels, cap);
    if (lv)
        g->levels = lv;
    uint32_t **up = realloc(g->upper, cap * sizeof(uint32_t *));
    if (up)
        g->upper = up;
    uint8_t *lk = realloc(g->locks, cap);
    if (lk)
        g->locks = lk;
    if (!l0 || !lv || !up || !lk)
        return kd_fail(-ENOMEM, "out of memory for the graph");
    kd_advise_huge(l0, cap * (1 + g->m0) * sizeof(uint32_t));
    return 0;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int kd_graph_level_for(uint64_t seed, uint64_t row, uint32_t m)
{
    uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + row + 1);
    double u = ((double)(h >> 11) + 0.5) / 9007199254740992.0;
    int level = (int)(-log(u) / log((double)m));
    return level > KD_MAX_LEVEL ? KD_MAX_LEVEL : level;
}

int kd_graph_prepare(struct kd_graph *g, uint64_t first, uint64_t last, uint64_t seed)
{
    return kd_graph_prepare_keyed(g, first, last, seed, NULL);
}

int kd_graph_prepare_keyed(struct kd_graph *g, uint64_t first, uint64_t last, uint64_t seed,
                           const uint64_t *keys)
{
    for (uint64_t i = first; i < last; i++) {
        int level = kd_graph_level_for(seed, keys ? keys[i - first] : i, g->m);
        g->levels[i] = (uint8_t)level;
        /* The whole list, not only its count: saves write unused slots too,
         * and they must not carry old heap bytes (reproducible files). */
        memset(g->level0 + i * (1 + g->m0), 0, (1 + g->m0) * sizeof(uint32_t));
        g->locks[i] = 0;
        g->upper[i] = NULL;
        if (level > 0) {
            g->upper[i] = calloc((size_t)level * (1 + g->m), sizeof(uint32_t));
            if (!g->upper[i]) {
                for (uint64_t j = first; j < i; j++) {
                    free(g->upper[j]);
                    g->upper[j] = NULL;
                }
                return kd_fail(-ENOMEM, "out of memory for the graph");
            }
        }
    }
    return 0;
}

/* ---- insertion */

/* In place: the first pass writes only where it has read. */
void kd_graph_skeleton_first(const struct kd_graph *g, uint64_t first, size_t n, uint32_t *order)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (g->levels[order[i]] > 0)
            order[k++] = order[i];
    for (size_t r = 0; r < n; r++)
        if (g->levels[first + r] == 0)
            order[k++] = (uint32_t)(first + r);
}

struct insert_ctx {
    struct kd_graph *g;
    const struct kd_build_oracle *o;
    uint32_t ef;
    uint64_t next, last;
    int err;
    const uint32_t *nodes; /* reconnect nodes[next..last) instead of inserting */
    const uint32_t *order; /* else insertion i takes node order[i - first], or i */
    uint64_t first;
};

struct from_node {
    const struct kd_build_oracle *o;
    uint32_t node;
};

static void dist_from_node(void *ctx, const uint32_t *rows, size_t n, float *out)
{
    struct from_node *f = ctx;
    f->o->from(f->o->ctx, f->node, rows, n, out);
}

/* Keep candidates (ascending) that are closer to the base than to any kept
 * one: the HNSW diversity heuristic. */
static size_t select_diverse(const struct kd_build_oracle *o, const struct kd_heap_item *c,
                             size_t n, size_t cap, uint32_t *out)
{
    size_t kept = 0;
    float d[4];
    for (size_t i = 0; i < n && kept < cap; i++) {
        int good = 1;
        /* Stop at the first kept neighbour that is closer. Of the candidates
         * turned away, 59% are turned away by the first kept and 16% by the
         * second (a 20k x 384 clustered build): those two are tried alone,
         * then two, then four a pass. Half the distances of four a pass
         * throughout, and the same choice. */
        for (size_t j = 0, m; j < kept && good; j += m) {
            m = j < 2 ? 1 : (j < 4 ? 2 : 4);
            m = kept - j < m ? kept - j : m;
            o->from(o->ctx, c[i].row, out + j, m, d);
            for (size_t t = 0; t < m; t++)
                good &= d[t] >= c[i].dist;
        }
        if (good)
            out[kept++] = c[i].row;
    }
    return kept;
}

size_t kd_graph_select(const struct kd_build_oracle *o, const struct kd_heap_item *c, size_t n,
                       size_t cap, uint32_t *out)
{
    return select_diverse(o, c, n, cap, out);
}

static int cmp_item(const void *a, const void *b)
{
    const struct kd_heap_item *x = a, *y = b;
    return (x->dist > y->dist) - (x->dist < y->dist);
}

/* Add node to nb's list, pruning it when full; returns whether node stayed. */
static int link_back(struct kd_graph *g, const struct kd_build_oracle *o, uint32_t nb,
                     uint32_t node, int level, struct kd_heap_item *buf, uint32_t *rows,
                     float *dists)
{
    uint32_t cap = level == 0 ? g->m0 : g->m;
    int kept = 1;
    node_lock(g, nb);
    uint32_t *l = kd_graph_list(g, nb, level);
    uint32_t n = l[0];
    for (uint32_t i = 0; i < n; i++)
        if (l[1 + i] == node) {
            node_unlock(g, nb);
            return 1;
        }
    if (n < cap) {
        list_push(l, n, node);
    } else {
        memcpy(rows, l + 1, n * sizeof(uint32_t));
        rows[n] = node;
        o->from(o->ctx, nb, rows, n + 1, dists);
        for (uint32_t i = 0; i <= n; i++) {
            buf[i].row = rows[i];
            buf[i].dist = dists[i];
        }
        qsort(buf, n + 1, sizeof *buf, cmp_item);
        uint32_t left = (uint32_t)select_diverse(o, buf, n + 1, cap, rows);
        list_store(l, rows, left);
        kept = 0;
        for (uint32_t i = 0; i < left && !kept; i++)
            kept = rows[i] == node;
    }
    node_unlock(g, nb);
    return kept;
}

/* An outlier can be pruned from every neighbour's list and so become
 * unreachable; give it one in-link from its nearest neighbour. */
static void force_in_link(struct kd_graph *g, uint32_t nb, uint32_t node, int level)
{
    uint32_t cap = level == 0 ? g->m0 : g->m;
    node_lock(g, nb);
    uint32_t *l = kd_graph_list(g, nb, level);
    uint32_t n = l[0];
    if (n < cap)
        list_push(l, n, node);
    else
        __atomic_store_n(&l[cap], node, __ATOMIC_RELEASE); /* the farthest kept goes */
    node_unlock(g, nb);
}

/* Node's list on a level becomes chosen[0..kept); each chosen neighbour
 * links back, and if none keeps it, the nearest is made to. */
static void set_list(struct kd_graph *g, const struct kd_build_oracle *o, uint32_t node, int level,
                     const uint32_t *chosen, size_t kept, struct kd_heap_item *buf, uint32_t *rows,
                     float *dists)
{
    uint32_t *l = kd_graph_list(g, node, level);
    node_lock(g, node);
    list_store(l, chosen, (uint32_t)kept);
    node_unlock(g, node);
    int linked = 0;
    for (size_t i = 0; i < kept; i++)
        linked |= link_back(g, o, chosen[i], node, level, buf, rows, dists);
    if (!linked && kept)
        force_in_link(g, chosen[0], node, level);
}

/* A thread's state for a beam over the oracle's cheaper estimates. */
struct beam_scratch {
    void *state;
    struct kd_heap_item *items; /* ef each: the beam's best, re-scored */
    uint32_t *rows;
    float *dists;
};

/* The beam's best res[0..n), re-scored with the oracle and sorted, so that
 * neighbours are chosen on the distances that prune the lists. */
static const struct kd_heap_item *rescore(const struct kd_build_oracle *o, uint32_t node,
                                          const struct kd_heap_item *res, size_t n,
                                          struct beam_scratch *b)
{
    for (size_t i = 0; i < n; i++)
        b->rows[i] = res[i].row;
    o->from(o->ctx, node, b->rows, n, b->dists);
    /* The estimates' order is nearly right: an insertion sort moves little. */
    for (size_t i = 0; i < n; i++) {
        struct kd_heap_item it = {b->dists[i], b->rows[i]};
        size_t j = i;
        for (; j > 0 && b->items[j - 1].dist > it.dist; j--)
            b->items[j] = b->items[j - 1];
        b->items[j] = it;
    }
    return b->items;
}

static int insert_one(struct kd_graph *g, const struct kd_build_oracle *o, uint32_t node,
                      uint32_t ef, struct kd_search_scratch *s, struct kd_heap_item *buf,
                      uint32_t *rows, float *dists, struct beam_scratch *b)
{
    int level = g->levels[node];
    pthread_mutex_lock(&g->entry_lock);
    uint32_t ep = g->entry;
    int top = g->max_level;
    int hold = level > top;
    if (ep == KD_NONE) {
        g->entry = node;
        g->max_level = level;
        pthread_mutex_unlock(&g->entry_lock);
        return 0;
    }
    if (!hold)
        pthread_mutex_unlock(&g->entry_lock);

    struct from_node f = {o, node};
    kd_batch_dist_fn dist = dist_from_node;
    kd_prefetch_fn prefetch = NULL;
    void *dctx = &f;
    if (b) {
        o->beam->prepare(b->state, node);
        dist = o->beam->dist;
        prefetch = o->beam->prefetch;
        dctx = b->state;
    }
    descend(g, s, ep, top, level, dist, dctx, 1, KD_NONE);
    size_t nentry = 1;
    uint32_t *chosen = rows + g->m0 + 2;
    for (int lc = level < top ? level : top; lc >= 0; lc--) {
        size_t nres = search_layer(g, s, lc, ef, nentry, dist, dctx, NULL, 1, 0, prefetch, NULL);
        if (!nres) {
            if (hold)
                pthread_mutex_unlock(&g->entry_lock);
            return kd_fail(-ENOMEM, "out of memory while building the graph");
        }
        const struct kd_heap_item *best = b ? rescore(o, node, s->res, nres, b) : s->res;
        size_t kept = select_diverse(o, best, nres, g->m, chosen);
        set_list(g, o, node, lc, chosen, kept, buf, rows, dists);
        nentry = nres < 64 ? nres : 64;
    }
    if (hold) {
        g->entry = node;
        g->max_level = level;
        pthread_mutex_unlock(&g->entry_lock);
    }
    return 0;
}

/* A node already in the graph whose level-0 list has grown thin (its
 * neighbours were removed): search for it from the entry as insertion does,
 * merge its remaining neighbours into what the beam found, keep the diverse
 * ones and link back to them. buf holds ef + m0 + 2 items. */
static int reconnect_one(struct kd_graph *g, const struct kd_build_oracle *o, uint32_t node,
                         uint32_t ef, struct kd_search_scratch *s, struct kd_heap_item *buf,
                         uint32_t *rows, float *dists)
{
    pthread_mutex_lock(&g->entry_lock);
    uint32_t ep = g->entry;
    int top = g->max_level;
    pthread_mutex_unlock(&g->entry_lock);
    if (ep == KD_NONE)
        return 0;
    struct from_node f = {o, node};
    descend(g, s, ep, top, 0, dist_from_node, &f, 1, KD_NONE);
    size_t nres = search_layer(g, s, 0, ef, 1, dist_from_node, &f, NULL, 1, 0, NULL, NULL);
    if (!nres)
        return kd_fail(-ENOMEM, "out of memory while repairing the graph");
    struct kd_heap_item *c = buf + g->m0 + 2;
    size_t n = 0;
    for (size_t i = 0; i < nres; i++)
        if (s->res[i].row != node)
            c[n++] = s->res[i];
    /* The neighbours it kept that the beam did not score. */
    uint32_t had = read_list(g, node, 0, s->list, 1), m = 0;
    for (uint32_t i = 0; i < had; i++) {
        size_t j = 0;
        while (j < n && c[j].row != s->list[i])
            j++;
        if (j == n && s->list[i] != node)
            rows[m++] = s->list[i];
    }
    if (m) {
        o->from(o->ctx, node, rows, m, dists);
        for (uint32_t i = 0; i < m; i++)
            c[n++] = (struct kd_heap_item){dists[i], rows[i]};
        qsort(c, n, sizeof *c, cmp_item);
    }
    uint32_t *chosen = rows + g->m0 + 2;
    size_t kept = select_diverse(o, c, n, g->m, chosen);
    set_list(g, o, node, 0, chosen, kept, buf, rows, dists);
    return 0;
}

static void *insert_worker(void *arg)
{
    struct insert_ctx *c = arg;
    struct kd_graph *g = c->g;
    struct kd_search_scratch s = {0};
    /* A reconnect keeps its candidates after the first m0 + 2 items. */
    size_t nbuf = g->m0 + 2 + (c->nodes ? c->ef + g->m0 + 2 : 0);
    struct kd_heap_item *buf = malloc(nbuf * sizeof *buf);
    uint32_t *rows = malloc((2 * g->m0 + 4) * sizeof(uint32_t));
    float *dists = malloc((g->m0 + 2) * sizeof(float));
    int err = kd_scratch_reserve(&s, g->count, c->ef, g->m0);
    struct beam_scratch bs = {0}, *beam = NULL;
    if (c->o->beam && !c->nodes) {
        beam = &bs;
        bs.state = c->o->beam->open(c->o->beam_ctx);
        bs.items = malloc(c->ef * sizeof *bs.items);
        bs.rows = malloc(c->ef * sizeof *bs.rows);
        bs.dists = malloc(c->ef * sizeof *bs.dists);
    }
    if (!err &&
        (!buf || !rows || !dists || (beam && (!bs.state || !bs.items || !bs.rows || !bs.dists))))
        err = kd_fail(-ENOMEM, "out of memory while building the graph");
    /* With a beam oracle that makes its terms ahead, nodes are claimed a
     * block at a time (in order, so threads=1 builds stay reproducible). */
    uint64_t claim = beam && c->o->beam->ahead ? KD_BEAM_AHEAD : 1;
    uint32_t block[KD_BEAM_AHEAD];
    while (!err && !__atomic_load_n(&c->err, __ATOMIC_RELAXED)) {
        uint64_t i = __atomic_fetch_add(&c->next, claim, __ATOMIC_RELAXED);
        if (i >= c->last)
            break;
        uint64_t end = c->last - i < claim ? c->last : i + claim;
        for (uint64_t j = i; j < end; j++)
            block[j - i] = c->order ? c->order[j - c->first] : (uint32_t)j;
        if (claim > 1)
            c->o->beam->ahead(bs.state, block, (size_t)(end - i));
        for (uint64_t j = i; j < end && !err && !__atomic_load_n(&c->err, __ATOMIC_RELAXED); j++) {
            if (c->nodes)
                err = reconnect_one(g, c->o, c->nodes[j], c->ef, &s, buf, rows, dists);
            else
                err = insert_one(g, c->o, block[j - i], c->ef, &s, buf, rows, dists, beam);
        }
    }
    if (err)
        __atomic_store_n(&c->err, err, __ATOMIC_RELAXED);
    if (bs.state)
        c->o->beam->close(bs.state);
    free(bs.items);
    free(bs.rows);
    free(bs.dists);
    kd_scratch_free(&s);
    free(buf);
    free(rows);
    free(dists);
    return NULL;
}

int kd_graph_insert_range(struct kd_graph *g, uint64_t first, uint64_t last, const uint32_t *order,
                          uint32_t ef_construction, const struct kd_build_oracle *o,
                          unsigned threads)
{
    struct insert_ctx c = {g, o, ef_construction, first, last, 0, NULL, order, first};
    /* Every node inserted, and every node a beam may reach, is below count. */
    uint64_t end = last;
    for (uint64_t i = 0; order && i < last - first; i++)
        end = order[i] >= end ? (uint64_t)order[i] + 1 : end;
    if (g->count < end)
        g->count = end;
    /* The first node alone sets the entry point, so workers start from it. */
    if (g->entry == KD_NONE && first < last) {
        struct insert_ctx one = {g, o, ef_construction, first, first + 1, 0, NULL, order, first};
        insert_worker(&one);
        if (one.err)
            return one.err;
        c.next = first + 1;
    }
    if (threads > last - c.next)
        threads = (unsigned)(last - c.next);
    kd_run_workers(insert_worker, &c, threads);
    return c.err;
}

int kd_graph_reconnect(struct kd_graph *g, const uint32_t *nodes, size_t n,
                       uint32_t ef_construction, const struct kd_build_oracle *o, unsigned threads)
{
    struct insert_ctx c = {g, o, ef_construction, 0, n, 0, nodes, NULL, 0};
    if (threads > n)
        threads = (unsigned)n;
    if (threads)
        kd_run_workers(insert_worker, &c, threads);
    return c.err;
}

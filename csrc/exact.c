#include "exact.h"
#include "common.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PANEL_MIN 12            /* queries in a pass from which rows are packed into panels */
#define HEAP_BUDGET (64u << 20) /* bytes of per-thread heaps; more queries go in passes */

static int cmp_item(const void *a, const void *b)
{
    const struct kd_heap_item *x = a, *y = b;
    if (x->dist != y->dist)
        return (x->dist > y->dist) - (x->dist < y->dist);
    return (x->row > y->row) - (x->row < y->row);
}

void kd_topk_sort(struct kd_heap_item *h, size_t n) { qsort(h, n, sizeof *h, cmp_item); }

/* -cos from the inner product and the row's norm (the query is unit). */
static inline float cosine_scaled(float qx, float norm) { return norm > 0 ? -qx / norm : -0.0f; }
static inline float cosine_from(float qx, float xx) { return cosine_scaled(qx, sqrtf(xx)); }

/* One pass of scoring: queries [q0, q1) against positions [begin, end) of a
 * block of vectors. Position i is row rows[i] (or row i without rows); its
 * vector is found by row (memory, streamed chunks) or by position (a batch
 * read of a subset). */
struct pass {
    const struct kd_exact_data *d;
    const float *q;
    size_t q0, q1, k;
    const uint8_t *block;
    size_t pitch;
    uint64_t first; /* row or position at block[0] */
    int by_position;
    const uint32_t *rows;
    uint64_t begin, end;
    unsigned threads, all_threads;
    struct kd_heap_item *heaps; /* all_threads x (q1-q0) x k */
    size_t *fill;               /* all_threads x (q1-q0) */
    float *panels;              /* all_threads x KD_PANEL_ROWS x dim */
    float *qnorms;              /* l2 with panels: |q| of each query, for the bound */
    unsigned next_thread;
};

/* Offer one query's inner products with a panel's n rows to its heap (ip,
 * cosine). Once the heap is full, a panel none of whose rows beats its
 * worst costs one pass over 32 floats. */
static void offer_sums(const struct kd_exact_data *d, struct kd_heap_item *h, size_t *fill,
                       size_t k, const float *sums, const float *norms, const uint32_t *rs,
                       size_t n)
{
    float dist[KD_PANEL_ROWS];
    for (size_t r = 0; r < n; r++)
        dist[r] = d->metric == KD_IP ? -sums[r] : cosine_scaled(sums[r], norms[r]);
    float worst = *fill < k ? INFINITY : h[0].dist, least = dist[0];
    for (size_t r = 1; r < n; r++)
        least = dist[r] < least ? dist[r] : least;
    if (*fill == k && !(least < worst))
        return; /* the usual case once the heap is full */
    for (size_t r = 0; r < n; r++)
        if (*fill < k || dist[r] < worst) {
            kd_topk_offer(h, fill, k, dist[r], rs[r]);
            worst = *fill < k ? INFINITY : h[0].dist;
        }
}

/* l2 through inner products: |q|^2 + |x|^2 - 2 q.x is a lower bound on the
 * distance once the rounding of every sum is taken off it: each of the d
 * fused steps errs by at most 2^-24 of the running magnitude, which none of
 * the sums (|q|^2, |x|^2, |q.x|, (q - x)^2) takes past (|q| + |x|)^2, so
 * 4 (d + 8) 2^-24 (|q| + |x|)^2 covers all of them and the few operations
 * after. A row whose bound clears the heap's worst cannot enter; the rest
 * (about k ln(n / k) a query) are scored as the re-rank scores them, by
 * (q - x)^2, which keeps precision far from the origin. */
static void offer_l2(const struct kd_exact_data *d, struct kd_heap_item *h, size_t *fill, size_t k,
                     const float *q, float qn, const float *sums, const float *xx,
                     const float *norms, const float *const *xs, const uint32_t *rs, size_t n)
{
    float slack = 4.0f * (float)(d->dim + 8) * 0x1p-24f, lower[KD_PANEL_ROWS];
    for (size_t r = 0; r < n; r++) {
        float reach = qn + norms[r];
        float bound = (qn * qn + xx[r] - 2.0f * sums[r]) - slack * reach * reach;
        lower[r] = bound == bound ? bound : -INFINITY; /* overflow: score it */
    }
    float worst = *fill < k ? INFINITY : h[0].dist, least = lower[0];
    for (size_t r = 1; r < n; r++)
        least = lower[r] < least ? lower[r] : least;
    if (*fill == k && least >= worst)
        return;
    for (size_t r = 0; r < n; r++) {
        if (*fill == k && lower[r] >= worst)
            continue;
        float dist = d->kern->l2sq(q, xs[r], d->dim);
        if (*fill < k || dist < worst) {
            kd_topk_offer(h, fill, k, dist, rs[r]);
            worst = *fill < k ? INFINITY : h[0].dist;
        }
    }
}

/* Score rows one at a time against the pass's queries, four a block kernel
 * call (a lone query through the pair kernels): below PANEL_MIN queries,
 * packing a panel costs more than its sums save. */
static void score_rows(const struct pass *p, struct kd_heap_item *heaps, size_t *fill,
                       const float *const *xs, const uint32_t *rs, size_t n)
{
    const struct kd_exact_data *d = p->d;
    size_t nq = p->q1 - p->q0, k = p->k, dim = d->dim;
    for (size_t qb = 0; qb < nq; qb += 4) {
        const float *qs[4];
        size_t lanes = nq - qb < 4 ? nq - qb : 4;
        for (size_t j = 0; j < 4; j++)
            qs[j] = p->q + (p->q0 + qb + (j < lanes ? j : 0)) * dim;
        for (size_t t = 0; t < n; t++) {
            float out[4], xx = 0;
            if (lanes == 1) {
                out[0] = d->metric == KD_L2 ? d->kern->l2sq(qs[0], xs[t], dim)
                                            : d->kern->dot(qs[0], xs[t], dim);
                if (d->metric == KD_COSINE)
                    xx = d->kern->dot(xs[t], xs[t], dim);
            } else if (d->metric == KD_L2) {
                d->kern->l2sq4(qs, xs[t], dim, out);
            } else {
                d->kern->dot4(qs, xs[t], dim, out, &xx);
            }
            for (size_t j = 0; j < lanes; j++) {
                float v = out[j];
                if (d->metric != KD_L2)
                    v = d->metric == KD_IP ? -v : cosine_from(v, xx);
                kd_topk_offer(heaps + (qb + j) * k, &fill[qb + j], k, v, rs[t]);
            }
        }
    }
}

/* Score n <= KD_PANEL_ROWS rows (vectors xs, rows rs) against every query
 * of the pass: packed once into a dim-major panel, then KD_PANEL_QUERIES
 * queries a kernel call. */
static void score_panel(const struct pass *p, struct kd_heap_item *heaps, size_t *fill,
                        float *panel, const float *const *xs, const uint32_t *rs, size_t n)
{
    const struct kd_exact_data *d = p->d;
    const struct kd_kernels *kern = d->kern;
    size_t nq = p->q1 - p->q0, k = p->k, dim = d->dim;
    float xx[KD_PANEL_ROWS], norms[KD_PANEL_ROWS], sums[KD_PANEL_QUERIES * KD_PANEL_ROWS];
    kern->panel_pack(xs, n, dim, panel);
    if (d->metric != KD_IP) {
        kern->panel_norms(panel, dim, xx);
        for (size_t r = 0; r < n; r++)
            norms[r] = sqrtf(xx[r]);
    }
    for (size_t qb = 0; qb < nq; qb += KD_PANEL_QUERIES) {
        size_t m = nq - qb < KD_PANEL_QUERIES ? nq - qb : KD_PANEL_QUERIES;
        const float *qs = p->q + (p->q0 + qb) * dim;
        kern->panel_dot(qs, dim, m, panel, dim, sums);
        for (size_t j = 0; j < m; j++) {
            struct kd_heap_item *h = heaps + (qb + j) * k;
            const float *sj = sums + j * KD_PANEL_ROWS;
            if (d->metric == KD_L2)
                offer_l2(d, h, &fill[qb + j], k, qs + j * dim, p->qnorms[p->q0 + qb + j], sj, xx,
                         norms, xs, rs, n);
            else
                offer_sums(d, h, &fill[qb + j], k, sj, norms, rs, n);
        }
    }
}

static void *pass_worker(void *arg)
{
    struct pass *p = arg;
    unsigned me = __atomic_fetch_add(&p->next_thread, 1, __ATOMIC_RELAXED);
    size_t nq = p->q1 - p->q0;
    struct kd_heap_item *heaps = p->heaps + (size_t)me * nq * p->k;
    size_t *fill = p->fill + (size_t)me * nq;
    uint64_t span = p->end - p->begin, lo = p->begin + span * me / p->threads;
    uint64_t hi = p->begin + span * (me + 1) / p->threads;
    float *panel = p->panels && nq >= PANEL_MIN ? p->panels + (size_t)me * KD_PANEL_ROWS * p->d->dim
                                                : NULL;
    const float *xs[KD_PANEL_ROWS];
    uint32_t rs[KD_PANEL_ROWS];
    size_t ntile = 0;
    for (uint64_t i = lo; i < hi; i++) {
        uint64_t r = p->rows ? p->rows[i] : i;
        if (p->d->deleted[r])
            continue;
        uint64_t at = (p->by_position ? i : r) - p->first;
        xs[ntile] = (const float *)(p->block + at * p->pitch);
        rs[ntile++] = (uint32_t)r;
        if (ntile == KD_PANEL_ROWS) {
            if (!panel)
                score_rows(p, heaps, fill, xs, rs, ntile);
            else
                score_panel(p, heaps, fill, panel, xs, rs, ntile);
            ntile = 0;
        }
    }
    if (ntile && !panel)
        score_rows(p, heaps, fill, xs, rs, ntile);
    else if (ntile)
        score_panel(p, heaps, fill, panel, xs, rs, ntile);
    return NULL;
}

static void run_pass(struct pass *p)
{
    uint64_t span = p->end - p->begin;
    unsigned t = p->all_threads;
    /* Each thread should get a few tiles, or starting it costs more than it saves. */
    if (span < (uint64_t)t * 4 * KD_PANEL_ROWS)
        t = span / (4 * KD_PANEL_ROWS) ? (unsigned)(span / (4 * KD_PANEL_ROWS)) : 1;
    p->threads = t;
    p->next_thread = 0;
    kd_run_workers(pass_worker, p, t);
}

/* Fold the per-thread heaps of queries [q0, q1) into out. */
static void merge(const struct pass *p, struct kd_heap_item *out, size_t *nout)
{
    size_t nq = p->q1 - p->q0, k = p->k;
    for (size_t i = 0; i < nq; i++) {
        struct kd_heap_item *dst = out + (p->q0 + i) * k;
        size_t n = 0;
        for (unsigned t = 0; t < p->all_threads; t++) {
            const struct kd_heap_item *h = p->heaps + ((size_t)t * nq + i) * k;
            for (size_t j = 0; j < p->fill[(size_t)t * nq + i]; j++)
                kd_topk_offer(dst, &n, k, h[j].dist, h[j].row);
        }
        kd_topk_sort(dst, n);
        nout[p->q0 + i] = n;
    }
}

struct probe {
    const float *x;
    size_t n;
    unsigned threads, next;
    float sums[256];
};

static void *probe_worker(void *arg)
{
    struct probe *p = arg;
    unsigned me = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
    size_t lo = p->n * me / p->threads, hi = p->n * (me + 1) / p->threads;
    const struct kd_kernels *k = kd_kernels();
    static const float ones[1024] = {0};
    float s = 0;
    /* A dot with a cached zero block streams x like a plain sum would. */
    for (size_t i = lo; i < hi; i += 1024)
        s += k->dot(p->x + i, ones, hi - i < 1024 ? hi - i : 1024);
    p->sums[me] = s;
    return NULL;
}

double kd_exact_read_probe(const float *x, size_t n, unsigned threads)
{
    struct probe p = {x, n, threads < 1 ? 1 : (threads > 256 ? 256 : threads), 0, {0}};
    uint64_t t0 = kd_now_ns();
    kd_run_workers(probe_worker, &p, p.threads);
    double secs = (double)(kd_now_ns() - t0) * 1e-9;
    volatile float keep = p.sums[0];
    (void)keep;
    return secs;
}

static void add_io(struct kd_io_counters *to, const struct kd_io_counters *c)
{
    to->read_ops += c->read_ops;
    to->read_bytes += c->read_bytes;
    to->wait_ns += c->wait_ns;
}

/* Stream the whole vector section, scoring each chunk while the next ones
 * are read. */
static int score_stream(struct pass *p, struct kd_io_counters *io)
{
    struct kd_vecio_stream *st;
    int err = kd_vecio_stream_open(p->d->vio, 0, p->d->count, &st);
    if (err)
        return err;
    const void *buf;
    uint64_t first;
    int64_t got;
    while ((got = kd_vecio_stream_next(st, &buf, &first, io)) > 0) {
        p->block = buf;
        p->pitch = p->d->stride;
        p->first = first;
        p->by_position = 0;
        p->rows = NULL;
        p->begin = first;
        p->end = first + (uint64_t)got;
        run_pass(p);
    }
    kd_vecio_stream_close(st);
    return got < 0 ? (int)got : 0;
}

/* A subset on disk: one batch read per 8 MiB of records. */
static int score_subset_from_disk(struct pass *p, const uint32_t *rows, size_t nrows,
                                  struct kd_io_counters *io)
{
    const struct kd_exact_data *d = p->d;
    size_t batch = (8u << 20) / d->stride ? (8u << 20) / d->stride : 1;
    if (batch > nrows)
        batch = nrows;
    uint8_t *buf = kd_alloc_aligned(kd_vecio_buffer_alignment(d->vio), batch * d->stride);
    uint64_t *r64 = malloc(batch * sizeof *r64);
    int err = buf && r64 ? 0 : kd_fail(-ENOMEM, "out of memory for an exact scan");
    for (size_t at = 0; !err && at < nrows; at += batch) {
        size_t m = nrows - at < batch ? nrows - at : batch;
        for (size_t i = 0; i < m; i++)
            r64[i] = rows[at + i];
        struct kd_io_counters c = {0, 0, 0};
        err = kd_vecio_read(d->vio, r64, m, buf, d->stride, &c);
        add_io(io, &c);
        if (err)
            break;
        p->block = buf;
        p->pitch = d->stride;
        p->first = at;
        p->by_position = 1;
        p->rows = rows;
        p->begin = at;
        p->end = at + m;
        run_pass(p);
    }
    kd_free_aligned(buf);
    free(r64);
    return err;
}

int kd_exact_search(const struct kd_exact_data *d, const float *q, size_t nq, size_t k,
                    const uint32_t *rows, size_t nrows, unsigned threads, struct kd_heap_item *out,
                    size_t *nout, struct kd_io_counters *io)
{
    if (nq == 0)
        return 0;
    if (threads < 1)
        threads = 1;
    /* Bound the per-thread heaps: more queries than fit go in several passes. */
    size_t group = HEAP_BUDGET / ((size_t)threads * k * sizeof(struct kd_heap_item) + 1);
    group = group < 4 ? 4 : group - group % 4;
    size_t g = nq < group ? nq : group;
    struct pass p = {0};
    p.d = d;
    p.q = q;
    p.k = k;
    p.all_threads = threads;
    p.heaps = malloc((size_t)threads * g * k * sizeof *p.heaps);
    p.fill = malloc((size_t)threads * g * sizeof *p.fill);
    int panels = g >= PANEL_MIN && d->kern->fused_panels, bounds = panels && d->metric == KD_L2;
    if (panels)
        p.panels = kd_alloc_aligned(64, (size_t)threads * KD_PANEL_ROWS * d->dim * sizeof(float));
    if (bounds && (p.qnorms = malloc(nq * sizeof *p.qnorms)))
        for (size_t i = 0; i < nq; i++)
            p.qnorms[i] = sqrtf(d->kern->dot(q + i * d->dim, q + i * d->dim, d->dim));
    int err = p.heaps && p.fill && (!panels || p.panels) && (!bounds || p.qnorms)
                  ? 0
                  : kd_fail(-ENOMEM, "out of memory for an exact search");
    for (size_t q0 = 0; !err && q0 < nq; q0 += g) {
        p.q0 = q0;
        p.q1 = q0 + g < nq ? q0 + g : nq;
        memset(p.fill, 0, (size_t)threads * g * sizeof *p.fill);
        if (d->vectors) {
            p.block = (const uint8_t *)d->vectors;
            p.pitch = d->dim * sizeof(float);
            p.first = 0;
            p.by_position = 0;
            p.rows = rows;
            p.begin = 0;
            p.end = rows ? nrows : d->count;
            run_pass(&p);
        } else if (rows) {
            err = score_subset_from_disk(&p, rows, nrows, io);
        } else {
            err = score_stream(&p, io);
        }
        if (!err)
            merge(&p, out, nout);
    }
    free(p.heaps);
    free(p.fill);
    kd_free_aligned(p.panels);
    free(p.qnorms);
    return err;
}

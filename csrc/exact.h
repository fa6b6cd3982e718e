/* exact.h — brute-force top-k: over vectors in memory, streamed from disk,
 * or over a subset of rows. Rows are split across threads. A batch packs
 * each 32 rows into a dim-major panel that every query block then scores
 * with no horizontal sums (compute-bound, near the FMA units' peak); a few
 * queries score rows where they lie, four queries a pass, so a single query
 * streams the data once. */
#ifndef KD_EXACT_H
#define KD_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "distance.h"
#include "hnsw.h"
#include "vecio.h"

/* Where the float32 vectors are. */
struct kd_exact_data {
    int metric; /* enum kd_metric */
    uint32_t dim;
    const float *vectors; /* in memory: row r at vectors + r*dim; NULL: on disk */
    struct kd_vecio *vio; /* on disk: records of `stride` bytes */
    uint32_t stride;
    const uint8_t *deleted; /* tombstones, one byte per row */
    uint64_t count;
    const struct kd_kernels *kern;
};

/* Top k (smallest internal distance: l2 -> squared distance, ip/cosine ->
 * minus the score) of each of nq queries, over all live rows or over
 * rows[0..nrows). Queries are normalized already for cosine. out holds nq*k
 * items, each query's sorted ascending; nout[i] how many it has. */
int kd_exact_search(const struct kd_exact_data *d, const float *q, size_t nq, size_t k,
                    const uint32_t *rows, size_t nrows, unsigned threads, struct kd_heap_item *out,
                    size_t *nout, struct kd_io_counters *io);

/* Read n floats with `threads` threads as fast as the memory allows (a sum
 * the compiler cannot drop); returns the seconds taken. The probe that exact
 * search's throughput is compared with. */
double kd_exact_read_probe(const float *x, size_t n, unsigned threads);

/* Keep the k smallest in a max-heap h of *n <= k items. */
static inline void kd_topk_offer(struct kd_heap_item *h, size_t *n, size_t k, float d, uint32_t row)
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

/* Sort ascending by distance, ties by row, so results are reproducible. */
void kd_topk_sort(struct kd_heap_item *h, size_t n);

#endif

/* index_impl.h — struct kd_index and what its three files share, private to
 * the core: index.c (the object: build, add, remove, lookups, reporting),
 * search.c (the query pipeline) and persist.c (save, load, open, verify). */
#ifndef KD_INDEX_IMPL_H
#define KD_INDEX_IMPL_H

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "buildcode.h"
#include "common.h"
#include "distance.h"
#include "format.h"
#include "hnsw.h"
#include "idmap.h"
#include "index.h"
#include "metric.h"
#include "quant.h"
#include "vecio.h"

/* The search codes' alignment: a cache line. */
#define KD_CODE_ALIGN 64

#define KD_DEFAULT_EF 64

struct kd_index;
struct kd_search_ctx;

/* Where the float32 vectors live: what differs between an index in RAM
 * (built, or loaded) and one opened with its vectors left on disk. Chosen
 * once, at create, load or open. */
struct kd_vsource {
    const char *name;
    int on_disk;      /* vectors are read from the file, not held */
    int read_only;    /* add and train are refused */
    int batch_reads;  /* the shortlist is read into the context's buffer */
    double scan_cost; /* cost of an exact scan per row, memory = 1 */
    /* The final shortlist res[0..n): score it now (memory), or start the
     * batch read of its records that query_end reaps (disk). */
    int (*shortlist)(struct kd_index *ix, struct kd_search_ctx *c, const struct kd_heap_item *res,
                     size_t n, size_t k);
    /* Records of rows[0..n) to dst + i*stride; I/O is counted in io. */
    int (*get_rows)(struct kd_index *ix, const uint64_t *rows, size_t n, void *dst, size_t stride,
                    struct kd_io_counters *io);
    /* The vector section's content, record_stride bytes a record. */
    int (*save)(struct kd_index *ix, struct kd_container_writer *cw);
};

extern const struct kd_vsource kd_vsource_memory, kd_vsource_file;

struct kd_index {
    struct kd_index_params p;
    const struct kd_metric_info *metric;
    const struct kd_vsource *src;
    uint32_t record_stride, record_bytes;
    struct kd_quant quant;
    int trained;
    int adopted; /* the quantizer came from another index: train leaves it */
    const struct kd_kernels *kern;
    kd_estimate_fn estimate;
    kd_refine_fn refine; /* with refinements: their estimate; else NULL */

    uint64_t count, cap, live;
    float *vectors;     /* in memory: count x dim */
    float *inv_norms;   /* cosine, in memory */
    uint8_t *codes;     /* KD_CODE_ALIGN-aligned: a 64-byte code is one line */
    uint8_t *own_codes; /* opened from an older format: its codes converted */
    uint8_t *refined;   /* a refinement per code (quant.h), or NULL */
    int64_t *ids;
    uint8_t *deleted; /* one byte per slot, always heap-owned */
    struct kd_graph graph;
    struct kd_idmap idmap;
    struct kd_bcode bcode; /* what insertion scores with; made at the first add */
    uint8_t *calib;        /* the recall calibration, opaque here (calibrate.h); NULL: none */
    uint32_t calib_bytes;

    int loaded_from_file;
    char *path;
    uint8_t *map;
    size_t map_len;
    struct kd_vecio *vio;
    int read_early;     /* early reads pay off (io_uring) */
    unsigned searching; /* with read_early: queries between query_begin and query_end */

    pthread_rwlock_t lock;
    pthread_mutex_t pool_lock;
    struct kd_search_ctx *pool;
    struct kd_stats st; /* updated atomically */
};

static inline float kd_inv_norm(const struct kd_index *ix, const float *v)
{
    float n = ix->kern->dot(v, v, ix->p.dim);
    return n > 0 ? 1.0f / sqrtf(n) : 0.0f;
}

/* The internal distance of a stored vector to a query as searched (normalized
 * for cosine): smaller is better. inv_norm: 1/|v|, cosine only. */
static inline float kd_exact_dist(const struct kd_index *ix, const float *qn, const float *v,
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

/* Every line of each row's record of `size` bytes in base: records do not
 * start on line bounds. */
static inline void kd_prefetch_records(const uint8_t *base, size_t size, const uint32_t *rows,
                                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uintptr_t at = (uintptr_t)(base + (size_t)rows[i] * size);
        for (uintptr_t line = at & ~(uintptr_t)63; line < at + size; line += 64)
            __builtin_prefetch((const void *)line);
    }
}

/* The graph search's estimate over the search codes, for a prepared query:
 * a kd_graph_search oracle and its prefetch, shared by searches and by
 * insertion's 1-bit beam. */
struct kd_estimate_ctx {
    const struct kd_index *ix;
    const struct kd_qcode *qc;
};

static inline void kd_estimate_rows(void *p, const uint32_t *rows, size_t n, float *out)
{
    const struct kd_estimate_ctx *e = p;
    e->ix->estimate(&e->ix->quant, e->qc, e->ix->codes, rows, n, out);
}

static inline void kd_prefetch_codes(void *p, const uint32_t *rows, size_t n)
{
    const struct kd_estimate_ctx *e = p;
    kd_prefetch_records(e->ix->codes, e->ix->quant.code_size, rows, n);
}

/* Where insertion's 1-bit beam (kd_beam_1bit, opened with this) takes a
 * node's vector: vector(ctx, a, scratch) gives node a (unit length for
 * cosine), made in scratch, of scratch_floats, where it must be. */
struct kd_beam_source {
    const struct kd_index *ix; /* whose search codes the beam reads */
    const float *(*vector)(const void *ctx, uint32_t a, float *scratch);
    const void *ctx;
    size_t scratch_floats;
};

static inline unsigned kd_resolve_threads(unsigned t) { return t ? t : kd_cpu_count(); }

/* index.c */
/* A new empty index with checked parameters, its vectors in memory. */
int kd_index_alloc(struct kd_index **out, const struct kd_index_params *p);
/* Room for `need` slots in every per-slot array. */
int kd_index_grow(struct kd_index *ix, uint64_t need);
uint32_t kd_record_stride_for(uint32_t dim);
int kd_valid_quantization(uint32_t q);
int kd_check_finite(const float *x, size_t n, uint32_t dim, const char *what);
/* Fold a thread's counters into the index's. */
void kd_index_stats_add(struct kd_index *ix, const struct kd_stats *s);
extern const struct kd_beam_oracle kd_beam_1bit;
/* Whether insertion's beam should read ix's 1-bit search codes rather than
 * build codes of build_code_bytes in all. */
int kd_beam_pays(const struct kd_index *ix, uint64_t build_code_bytes);
/* Whether insertion's beam should read the 1-bit search codes for all of rows
 * [first, last) of src->ix, whatever the cache: their quantizer's centres
 * explain too little of the rows' spread for the layout to keep beams local. */
int kd_beam_spread(const struct kd_beam_source *src, uint64_t first, uint64_t last);

#endif

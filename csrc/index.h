/* index.h — the index object and its two-phase search pipeline:
 *
 *   query -> rotate + 4-bit encode -> HNSW beam over 1-bit codes (RAM)
 *         -> shortlist of ceil(k * oversample) rows
 *         -> one batch read of their float32 records (RAM, or SSD via vecio)
 *         -> exact rescoring -> top k.
 *
 * An index lives in memory (built by add, or loaded) or is opened from a file
 * with its graph, codes and ids mapped and its vectors left on disk. Searches
 * share a read lock; add and remove take it exclusively. */
#ifndef KD_INDEX_H
#define KD_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "storage.h"
#include "vecio.h"

/* The code width in bits names the quantization. */
/* The low nibble is the width of the codes the beam scores, the high one
 * that of the refinement re-ordering the beam's best (quant.h). */
enum kd_quantization { KD_Q_1BIT = 1, KD_Q_4BIT = 4, KD_Q_8BIT = 8, KD_Q_1BIT_4BIT = 0x41 };

static inline unsigned kd_q_bits(int quantization) { return (unsigned)quantization & 15; }
static inline unsigned kd_q_refine(int quantization) { return (unsigned)quantization >> 4; }
/* "1bit", "4bit", "8bit" or "1bit+4bit". */
const char *kd_quantization_name(int quantization);

struct kd_index_params {
    uint32_t dim;
    int metric; /* enum kd_metric (metric.h) */
    uint32_t m;
    uint32_t ef_construction;
    int quantization; /* enum kd_quantization */
    uint64_t seed;
};

struct kd_open_params {
    int direct_io;
    int io_backend; /* enum kd_io_backend */
    unsigned io_depth;
    unsigned preload; /* bit set of 1 << enum kd_section_id */
};

struct kd_search_params {
    size_t k;
    size_t ef;         /* 0: default */
    double oversample; /* <= 0: default */
    int rerank;
    int exact;
    unsigned threads;      /* 0: all cores */
    const int64_t *filter; /* allowed ids, or NULL */
    size_t nfilter;
    /* The vector count ef and oversample were chosen for (0: none). More
     * live vectors at search time widen the shortlist in proportion and the
     * beam by the square root, read under the search's lock so that both
     * match the graph searched. */
    size_t serves;
};

struct kd_stats {
    uint64_t queries, read_ops, read_bytes, rerank_vectors;
    uint64_t io_wait_ns, graph_ns, rerank_ns, exact_queries;
    uint64_t early_reads, early_unused; /* read while the beam ran; of them, not shortlisted */
    uint64_t refined;                   /* candidates re-estimated with refined codes */
    uint64_t scored;                    /* code distances the graph searches computed */
};

struct kd_info {
    struct kd_index_params params;
    uint64_t count; /* live vectors */
    uint64_t slots; /* stored vectors, removed ones included */
    int on_disk;
    int loaded_from_file;
    const char *path;
    uint32_t record_size; /* bytes per vector record in the file */
    uint32_t code_size;
    uint32_t centres; /* the quantizer's; 0 before it is fitted */
    uint64_t resident_bytes;
    struct kd_vecio_info io; /* valid when on_disk */
    double default_oversample;
    size_t default_ef;
};

struct kd_index;

int kd_index_create(struct kd_index **out, const struct kd_index_params *p);
void kd_index_free(struct kd_index *ix);

/* Fit the quantizer's centre to a sample; later adds are encoded against it.
 * Without it, the first add fits the centre to its own vectors. */
int kd_index_train(struct kd_index *ix, const float *x, size_t n);
/* Take from's quantizer (ix writable, of the same dim, metric and code
 * width), so that both encode alike and codes can be copied between them;
 * rows ix holds already are encoded again with it, and its calibration,
 * measured on their old codes, is dropped. */
int kd_index_adopt_quantizer(struct kd_index *ix, struct kd_index *from);
/* 1 when a and b encode every vector identically. */
int kd_index_same_quantizer(struct kd_index *a, struct kd_index *b);
/* Room for `more` vectors beyond those held, made at once, so that an add
 * fed in chunks grows its arrays once, to their size (a trained, writable
 * index; untrained, nothing is done). */
int kd_index_reserve(struct kd_index *ix, uint64_t more);
/* Add n vectors; ids NULL means slot numbers. All or nothing. */
int kd_index_add(struct kd_index *ix, const float *x, size_t n, const int64_t *ids,
                 unsigned threads);
/* out[i] = 1 when ids[i] is a live id of the index. */
void kd_index_contains(struct kd_index *ix, const int64_t *ids, size_t n, uint8_t *out);
/* The live ids in row order: writes min(cap, live) to out, returns live. */
size_t kd_index_live_ids(struct kd_index *ix, int64_t *out, size_t cap);
/* Tombstone ids; all must exist (else -ESRCH and nothing changes). */
int kd_index_remove(struct kd_index *ix, const int64_t *ids, size_t n);

/* dist: nq*k scores, ids: nq*k ids, best first, missing = -1 / +-inf. */
int kd_index_search(struct kd_index *ix, const float *q, size_t nq,
                    const struct kd_search_params *sp, float *dist, int64_t *ids);
/* The beam width and shortlist length a search with sp would use now
 * (widened for live vectors past sp->serves). */
void kd_index_search_widths(struct kd_index *ix, const struct kd_search_params *sp, size_t *ef,
                            size_t *shortlist);

/* Row i of the result lands at dst + i*dst_stride (bytes). */
int kd_index_get_vectors(struct kd_index *ix, const int64_t *ids, size_t n, void *dst,
                         size_t dst_stride);
/* Alignment and row stride get_vectors prefers for zero-copy reads. */
void kd_index_vector_layout(const struct kd_index *ix, size_t *alignment, size_t *stride);

int kd_index_save(struct kd_index *ix, struct kd_writer *w);
int kd_index_save_path(struct kd_index *ix, const char *path);
/* Read an index from a stream into memory (vectors included), checking every
 * checksum; a truncated, damaged or foreign stream gives -KD_ECORRUPT. */
int kd_index_load(struct kd_index **out, struct kd_reader *r);
int kd_index_load_path(struct kd_index **out, const char *path);
int kd_index_open(struct kd_index **out, const char *path, const struct kd_open_params *op);
/* Check every checksum, vectors included (-KD_ECORRUPT on a mismatch). */
int kd_index_verify(struct kd_index *ix);

void kd_index_info(struct kd_index *ix, struct kd_info *info);
void kd_index_stats(struct kd_index *ix, struct kd_stats *st, int reset);
uint64_t kd_index_count(struct kd_index *ix);
/* The dimension, fixed at creation: no lock, no walk over the index (which
 * kd_index_info does to count resident bytes). */
uint32_t kd_index_dim(const struct kd_index *ix);

double kd_default_oversample(int quantization, uint32_t pdim);

/* The recall calibration: bytes the core stores with the index and saves in
 * its file, without reading them (the Python layer encodes them). */
#define KD_MAX_CALIBRATION (1u << 20)
/* Replace it with n bytes (n = 0: none); -EINVAL past KD_MAX_CALIBRATION. */
int kd_index_set_calibration(struct kd_index *ix, const void *p, size_t n);
/* Copy min(n, its size) bytes to dst; returns its size (0: none). */
size_t kd_index_calibration(struct kd_index *ix, void *dst, size_t n);

#endif

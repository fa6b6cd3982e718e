/* merge.h — several indexes (the segments of a collection) written as one
 * new index file, without ever holding their float32 vectors in RAM.
 *
 * The input with the most live rows is the base: its graph is kept,
 * renumbered, its removed nodes dropped and the lists that pointed at them
 * repaired; the live rows of the other inputs are then inserted. Graph
 * distances come from per-dimension scalar codes of every live vector's
 * residual from its quantizer centre (the build codes, 8 or 4 bits a
 * dimension, fitted and encoded in two sequential passes over the
 * vectors); a third sequential pass copies the
 * float32 records into the new file. Vectors are only ever read in large
 * sequential chunks: straight from memory, or through a vecio stream
 * (O_DIRECT) for an index opened from its file.
 *
 * Measured (clustered data, 32-128 dims): recall of the merged graph on a
 * par with a fresh build over the same rows, also when the base lost 30-40%
 * of its rows, with 4-bit build codes (tests/test_merge.py), and after 50
 * rounds of 2% removed, 2% added and merged (tests/test_collection_rot.py). */
#ifndef KD_MERGE_H
#define KD_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "index.h"

struct kd_merge_params {
    unsigned threads; /* 0: all cores */
    /* Bytes for the build codes: 8 bits a dimension when the rows' codes
     * fit (dim rounded up to 8 bytes, plus 6, a row), else 4. 0: unlimited. */
    uint64_t memory_budget;
    uint64_t seed; /* levels of the inserted nodes: drawn from (seed, id) */
    /* Called on the merging thread after each step of work (done of total
     * units, see below); nonzero cancels the merge: kd_merge then returns
     * -ECANCELED and leaves nothing at path. May be NULL. It runs while the
     * inputs' read locks are held: it must not add to, remove from or free
     * an input (nor search one, which could wait behind a waiting writer). */
    int (*progress)(void *arg, uint64_t done, uint64_t total);
    void *progress_arg;
    /* The output's quantizer, when not NULL: a trained index (it may hold no
     * rows) of the inputs' dim, metric and quantization; every row whose
     * input encodes otherwise, the base's included, is encoded anew. NULL:
     * the base's. Its read lock is held throughout as well. */
    struct kd_index *quantizer;
};

/* What a merge did. Progress units: the output's rows four times over (the
 * fitting pass, the encoding pass, the graph, the writing pass). */
struct kd_merge_report {
    uint64_t rows_written;      /* live rows of all inputs: the output's rows */
    uint64_t rows_reused;       /* of them, nodes of the base's graph */
    uint64_t rows_inserted;     /* of them, inserted into that graph */
    uint64_t nodes_repaired;    /* reused nodes whose lists lost a neighbour */
    uint64_t nodes_reconnected; /* of them, searched for again (level 0 left thin) */
    uint64_t codes_reencoded;   /* rows whose search codes were encoded anew */
    uint32_t build_code_bits;   /* 8 or 4; 0 when there was no row */
    uint32_t base;              /* which input was the base */
    double fit_seconds, encode_seconds, repair_seconds, insert_seconds, write_seconds;
    double total_seconds;
};

/* Memory a row's build code takes at `bits` (8 or 4) a dimension: the
 * code, padded to 8 bytes, its centre and its decoded norm. What
 * memory_budget must hold for each row of a merge. */
uint64_t kd_merge_row_bytes(uint32_t bits, uint32_t dim);

/* Merge the live rows of in[0..n) into a new index file at path (written
 * atomically: a temporary file renamed over path). All inputs must share
 * dim, metric, quantization and m, and no id may be live in two of them
 * (-EINVAL, -EEXIST). The output takes the base's parameters and quantizer
 * (or mp->quantizer's); a search code is copied from its input when that
 * input's quantizer equals the output's, and encoded anew from the float32
 * vector otherwise. Its rows are the base's live rows in row order, then
 * each other input's in turn. Each input's read lock is held throughout.
 * rep may be NULL. */
int kd_merge(const char *path, struct kd_index **in, size_t n, const struct kd_merge_params *mp,
             struct kd_merge_report *rep);

/* Test hook: over random codes of `bits` and `dim` around three centres,
 * the largest difference between a distance of the build-code loops
 * (scalar, and AVX2 and AVX-512 where the CPU has them) and the same
 * distance in double precision, relative to the sum of its terms' sizes;
 * -1 when out of memory. */
double kd_merge_kernel_gap(uint32_t bits, uint32_t dim, int metric, uint64_t seed);

#endif

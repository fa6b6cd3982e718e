/* persist.h — the index metadata as stored in the file, internal to the
 * core. Its layout is part of the file format: never change it without a
 * new format version (format.h). */
#ifndef KD_PERSIST_H
#define KD_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include "index_impl.h"

/* Section META, followed by the centres, rotation signs and scalar ranges. */
struct kd_meta {
    uint32_t dim, metric, quantization, m;
    uint32_t m0, ef_construction, pdim, code_size;
    uint32_t record_stride, record_bytes, entry;
    int32_t max_level;
    uint64_t count, live, seed;
    uint32_t ncentres;
    uint32_t calib_bytes; /* the calibration section's length (format 2; 0: none) */
};

_Static_assert(sizeof(struct kd_meta) == 80, "kd_meta is stored in files");
_Static_assert(offsetof(struct kd_meta, record_stride) == 32, "kd_meta is stored in files");
_Static_assert(offsetof(struct kd_meta, count) == 48, "kd_meta is stored in files");
_Static_assert(offsetof(struct kd_meta, ncentres) == 72, "kd_meta is stored in files");

/* The two kd_vsource save operations: the vector section's content. */
int kd_save_vectors_memory(struct kd_index *ix, struct kd_container_writer *cw);
int kd_save_vectors_file(struct kd_index *ix, struct kd_container_writer *cw);

#endif

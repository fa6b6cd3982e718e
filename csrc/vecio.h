/* vecio.h — batch reads of fixed-stride vector records from one file section.
 *
 * A batch of record reads is issued in parallel (io_uring, or a pool of
 * threads doing pread), or serially (pread, the baseline), or copied from a
 * MADV_RANDOM mapping (mmap, page cache). With O_DIRECT, records land straight
 * in the caller's buffer when the buffer, the stride and the file offsets meet
 * the file's direct-I/O alignment; otherwise the aligned block holding a record
 * is read into a bounce buffer and only the record is copied out.
 *
 * All functions return 0 or a negative errno and set kd_fail()'s message.
 * kd_vecio_read and kd_vecio_read_range are safe to call from many threads at
 * once on one handle. */
#ifndef KD_VECIO_H
#define KD_VECIO_H

#include <stddef.h>
#include <stdint.h>

enum kd_io_backend {
    KD_IO_AUTO = 0, /* io_uring, else threads */
    KD_IO_URING = 1,
    KD_IO_THREADS = 2,
    KD_IO_PREAD = 3, /* one synchronous pread per record */
    KD_IO_MMAP = 4,  /* page cache through a MADV_RANDOM mapping */
};

struct kd_vecio_config {
    const char *path;
    uint64_t offset;       /* file offset of record 0; a multiple of 4096 */
    uint64_t count;        /* number of records in the section */
    uint32_t stride;       /* bytes from one record to the next in the file */
    uint32_t record_bytes; /* payload bytes of a record, <= stride */
    int backend;           /* enum kd_io_backend */
    int direct_io;         /* ask for O_DIRECT */
    unsigned io_depth;     /* bound on reads in flight per batch, >= 1 */
};

/* Why the handle runs differently from what was asked. */
enum kd_vecio_fallback {
    KD_FALLBACK_NONE = 0,
    KD_FALLBACK_NO_DIRECT = 1, /* O_DIRECT unsupported: buffered, read-ahead off */
    KD_FALLBACK_NO_URING = 2,  /* io_uring missing or blocked: threads */
};

struct kd_vecio_info {
    int backend;        /* the backend in use (never KD_IO_AUTO) */
    int direct_io;      /* 1 when O_DIRECT is in force */
    uint32_t alignment; /* direct-I/O alignment of offsets, lengths, memory */
    unsigned fallbacks; /* bit set of enum kd_vecio_fallback */
};

/* Per-call counters; the caller adds them to its totals. */
struct kd_io_counters {
    uint64_t read_ops;   /* read requests issued to the kernel */
    uint64_t read_bytes; /* bytes requested from the file */
    uint64_t wait_ns;    /* wall time spent in the call waiting for reads */
};

struct kd_vecio;

int kd_vecio_open(struct kd_vecio **out, const struct kd_vecio_config *cfg);
void kd_vecio_close(struct kd_vecio *v);
void kd_vecio_get_info(const struct kd_vecio *v, struct kd_vecio_info *info);

/* Alignment a destination buffer needs for zero-copy reads (>= 64). */
uint32_t kd_vecio_buffer_alignment(const struct kd_vecio *v);

/* Read records rows[0..n) so that record rows[i] lands at dst + i*dst_stride.
 * dst_stride >= record_bytes. Rows may repeat and come in any order; each row
 * must be < count (else -EINVAL). Bytes of dst beyond record_bytes in each
 * slot are unspecified. */
int kd_vecio_read(struct kd_vecio *v, const uint64_t *rows, size_t n, void *dst, size_t dst_stride,
                  struct kd_io_counters *c);

/* The same read in two halves, so the caller can work while it is in flight:
 * submit puts the reads in flight (the pread baseline completes them right
 * away), complete waits for them and frees the handle. Every submit must be
 * completed; rows and dst must stay valid until then. Counters are added to
 * c, wait_ns being the time spent waiting in complete. */
struct kd_vecio_pending;
int kd_vecio_submit(struct kd_vecio *v, const uint64_t *rows, size_t n, void *dst,
                    size_t dst_stride, struct kd_vecio_pending **out);
int kd_vecio_complete(struct kd_vecio_pending *p, struct kd_io_counters *c);

/* Read the contiguous records [first, first+n) into dst laid out with the
 * file's stride (dst must hold n*stride bytes), in large sequential reads. */
int kd_vecio_read_range(struct kd_vecio *v, uint64_t first, uint64_t n, void *dst,
                        struct kd_io_counters *c);

/* Sequential streaming of records [first, first+n) in chunks of about 8 MiB,
 * with the next chunks already being read while the caller scores the
 * current one (triple buffering: io_uring reads in flight with the io_uring
 * backend, a reader thread otherwise). One consumer per stream. */
struct kd_vecio_stream;

int kd_vecio_stream_open(struct kd_vecio *v, uint64_t first, uint64_t n,
                         struct kd_vecio_stream **out);
/* Hand out the next chunk: records laid out with the file's stride start at
 * *buf, the first being record *first_row. Returns the number of records, 0
 * at the end, or a negative errno. The chunk stays valid until the next call.
 * Counters (reads issued, bytes, time spent waiting) are added to c. */
int64_t kd_vecio_stream_next(struct kd_vecio_stream *s, const void **buf, uint64_t *first_row,
                             struct kd_io_counters *c);
void kd_vecio_stream_close(struct kd_vecio_stream *s);

const char *kd_io_backend_name(int backend);

/* 1 when this build has io_uring support compiled in. */
int kd_vecio_have_uring(void);

#endif

/* vecio_backend.h — internals shared by vecio.c and its I/O backends.
 *
 * How to add a backend:
 *   1. Give it a number in enum kd_io_backend (vecio.h) and a name in
 *      kd_io_backend_name (vecio.c).
 *   2. In a new csrc/vecio_<name>.c, fill a `const struct kd_vecio_ops`
 *      (below): submit and read_range are required, the rest optional.
 *      Count every read it issues with req_issue() or io_count(), never
 *      wait_ns (the shared layer times the calls).
 *   3. Register it in `backends[]` in vecio.c (and declare it at the end of
 *      this header); wrap both in #ifdef if it needs an optional library.
 *   4. The builds pick up csrc/vecio_*.c by wildcard (setup.py, tests/c/
 *      Makefile, tests/test_vecio_native.py). Extend the backend lists in
 *      tests/c/test_vecio.c, tests/test_io_backends.py and
 *      tests/test_read_volume.py, so it is checked against the others.
 */
#ifndef KD_VECIO_BACKEND_H
#define KD_VECIO_BACKEND_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "vecio.h"
#include "common.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KD_RANGE_CHUNK (8u << 20) /* read_range issues reads of at most this */
#define KD_MAX_THREADS 64
#define KD_MAX_RING 4096
#define KD_MIN_BUF_ALIGN 64
/* Under O_DIRECT our read buffers are page aligned and no record read crosses
 * a page: a read whose buffer straddles a page boundary reaches the device as
 * two segments, which cut the random 4 KiB read rate on a virtio disk at the
 * same queue depth (measured: docs/benchmarks.md, 'Design figures'). */
#define KD_PAGE_ALIGN 4096u
#define KD_STREAM_BUFS 3

/* One read of one record (or one chunk of a range). */
struct kd_req {
    uint64_t row;  /* record number, for error messages */
    char *buf;     /* where the file range lands */
    uint64_t off;  /* file offset of buf[0] */
    uint32_t len;  /* bytes requested */
    uint32_t need; /* leading bytes that must arrive; the rest may be past EOF */
    uint32_t done; /* bytes already read */
    char *copy_to; /* non-NULL: copy the record from buf + skip to here */
    uint32_t skip;
};

/* Resources of one calling thread, kept on a free list on the handle: its
 * bounce slots, then ops->ctx_size bytes for the backend (io_uring: a ring). */
struct kd_caller_ctx {
    struct kd_caller_ctx *next;
    char *bounce;
    size_t bounce_size;
    max_align_t be[];
};

struct kd_vecio_ops;

struct kd_vecio {
    const struct kd_vecio_ops *ops; /* chosen once, after the fallbacks */
    char *path;
    int fd;
    uint64_t offset, count, file_size;
    uint32_t stride, record_bytes;
    int backend;
    int direct;
    uint32_t alignment;  /* probed direct-I/O alignment, reported in info */
    uint32_t read_align; /* alignment reads must respect: alignment, or 1 if buffered */
    uint32_t buf_align;  /* alignment of buffers we allocate / want from callers */
    size_t slot_bytes;   /* bounce bytes per in-flight read: max_span, buf_align-rounded */
    size_t bounce_bytes; /* bounce a batch needs per caller (set by ops->open) */
    unsigned fallbacks;
    unsigned io_depth;
    unsigned ring_entries; /* io_uring: power of two >= in-flight bound */
    unsigned inflight;     /* bound on reads in flight per call */
    size_t max_span;       /* largest aligned span covering one record */

    pthread_mutex_t ctx_mu;
    int ctx_mu_ok;
    struct kd_caller_ctx *free_ctx;

    void *be; /* the backend's own state (thread pool, mapping) */
};

/* A batch of record reads between kd_vecio_submit and kd_vecio_complete,
 * followed by ops->pending_size bytes for the backend. */
struct kd_vecio_pending {
    struct kd_vecio *v;
    struct kd_caller_ctx *x; /* NULL for backends without ops->ctx_size */
    const uint64_t *rows;
    size_t n;
    char *dst;
    size_t dst_stride;
    int zc;     /* records go straight into dst */
    int err;    /* first error, reported by complete */
    int broken; /* x can no longer be trusted: destroy it */
    struct kd_io_counters c;
    max_align_t be[];
};

/* A stream's chunk buffer. */
struct kd_stream_buf {
    char *data;
    uint64_t first, rows; /* the chunk it holds; rows == 0: none */
    unsigned pending;     /* io_uring pieces still in flight */
    int ready, err;       /* reader thread: chunk complete / its error */
};

struct kd_stream_ops;

struct kd_vecio_stream {
    struct kd_vecio *v;
    const struct kd_stream_ops *ops;
    uint64_t end, next_issue; /* records [next_issue, end) are not yet requested */
    uint64_t chunk_rows;
    unsigned head; /* buffer holding the next chunk, in order */
    int handed;    /* the buffer before head is with the consumer */
    struct kd_stream_buf buf[KD_STREAM_BUFS];
    struct kd_io_counters c;       /* reads and bytes, counted as they are issued */
    uint64_t told_ops, told_bytes; /* already added to a caller's counters */
    char errmsg[KD_ERRMSG_LEN];
    void *be;         /* io_uring: the stream's ring */
    pthread_t thread; /* reader thread streams */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, reader_done;
};

/* How a stream's chunks get read; chosen by ops->stream_start. */
struct kd_stream_ops {
    /* Give buffer prev back for reading when s->handed, then wait for buffer
     * i: 1 when it holds a chunk, 0 at the end, or a negative errno. */
    int (*wait)(struct kd_vecio_stream *s, unsigned i, unsigned prev);
    void (*stop)(struct kd_vecio_stream *s); /* before the buffers go */
};

/* What differs between backends. Batch calls go through the table; the
 * per-record loops stay inside each backend. */
struct kd_vecio_ops {
    size_t ctx_size;     /* per-caller bytes; 0: batches take no caller context */
    size_t pending_size; /* per-batch bytes after struct kd_vecio_pending */
    /* After the fallbacks are decided: start what the handle needs and set
     * v->bounce_bytes. Optional; close must undo a partial open. */
    int (*open)(struct kd_vecio *v);
    void (*close)(struct kd_vecio *v);
    /* Set up / tear down the backend part of a new caller context. */
    int (*ctx_init)(struct kd_vecio *v, struct kd_caller_ctx *x);
    void (*ctx_fini)(struct kd_vecio *v, struct kd_caller_ctx *x);
    /* Put p's reads in flight, or do them (complete == NULL). Bounce space
     * (v->bounce_bytes) is in p->x already. A failure to start returns <0;
     * a failed read sets p->err. */
    int (*submit)(struct kd_vecio *v, struct kd_vecio_pending *p);
    int (*complete)(struct kd_vecio *v, struct kd_vecio_pending *p);
    /* Records [first, first+n), arguments checked; dst holds n*stride. */
    int (*read_range)(struct kd_vecio *v, uint64_t first, uint64_t n, char *dst,
                      struct kd_io_counters *c);
    /* Set s->ops and put the first chunks in flight; s->buf are allocated. */
    int (*stream_start)(struct kd_vecio_stream *s);
};

static inline uint64_t round_down(uint64_t x, uint64_t a) { return x / a * a; }
static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static inline void *pending_be(struct kd_vecio_pending *p) { return p->be; }
static inline void *caller_be(struct kd_caller_ctx *x) { return x->be; }

/* Counters: every read handed to the kernel is counted by io_count, through
 * req_issue for record reads; wait_ns is kept only by the shared layer
 * (vecio.c, vecio_stream.c), which times each call. */
static inline void io_count(struct kd_io_counters *c, uint64_t bytes)
{
    c->read_ops++;
    c->read_bytes += bytes;
}

static inline void io_add(struct kd_io_counters *to, const struct kd_io_counters *from)
{
    to->read_ops += from->read_ops;
    to->read_bytes += from->read_bytes;
    to->wait_ns += from->wait_ns;
}

/* Bytes of records [.., +rows) that must arrive: the last record of the
 * section may end the file, so only its payload counts. */
static inline uint64_t chunk_need(const struct kd_vecio *v, uint64_t rows)
{
    return (rows - 1) * v->stride + v->record_bytes;
}

/* Set up the read of record `row` whose slot in the destination is `slot`.
 * zc: read straight into the slot; else direct mode reads the aligned span
 * into `bounce`, buffered mode reads the record into the slot. */
static inline void req_init(const struct kd_vecio *v, struct kd_req *r, uint64_t row, char *slot,
                            size_t dst_stride, int zc, char *bounce)
{
    uint64_t abs = v->offset + row * v->stride;
    r->row = row;
    r->done = 0;
    r->copy_to = NULL;
    r->skip = 0;
    if (!v->direct) {
        r->buf = slot;
        r->off = abs;
        r->len = r->need = v->record_bytes;
    } else if (zc) {
        r->buf = slot;
        r->off = abs;
        /* The whole stride when the slot holds it (one aligned unit per
         * record); else the aligned cover of the payload, which fits the
         * slot because dst_stride is an aligned size >= record_bytes. */
        r->len = dst_stride >= v->stride ? v->stride
                                         : (uint32_t)kd_round_up(v->record_bytes, v->read_align);
        r->need = v->record_bytes;
    } else {
        uint64_t start = round_down(abs, v->read_align);
        uint64_t end = kd_round_up(abs + v->record_bytes, v->read_align);
        r->buf = bounce;
        r->off = start;
        r->len = (uint32_t)(end - start);
        r->skip = (uint32_t)(abs - start);
        r->need = r->skip + v->record_bytes;
        r->copy_to = slot;
    }
}

/* The rest of r is about to be issued: count it, return its length. */
static inline uint32_t req_issue(struct kd_req *r, struct kd_io_counters *c)
{
    uint32_t want = r->len - r->done;
    io_count(c, want);
    return want;
}

int kd_req_eof(const struct kd_vecio *v, const struct kd_req *r);
int kd_req_error(const struct kd_vecio *v, const struct kd_req *r, int err);

/* Account for `res` more bytes read. 1: complete, 0: read the rest, <0: error. */
static inline int req_advance(const struct kd_vecio *v, struct kd_req *r, uint32_t res)
{
    uint32_t before = r->done;
    r->done += res;
    if (r->done >= r->len)
        return 1;
    if (res == 0 || r->off + r->done >= v->file_size)
        return r->done >= r->need ? 1 : kd_req_eof(v, r);
    /* A retry under O_DIRECT must start aligned: re-read the partial block.
     * A short unaligned read means the file ended before the size seen at
     * open, so no progress is EOF. */
    r->done = (uint32_t)round_down(r->done, v->read_align);
    if (r->done <= before) {
        r->done = before + res;
        return r->done >= r->need ? 1 : kd_req_eof(v, r);
    }
    return 0;
}

static inline void req_finish(const struct kd_vecio *v, const struct kd_req *r)
{
    if (r->copy_to)
        memcpy(r->copy_to, r->buf + r->skip, v->record_bytes);
}

/* vecio.c: helpers the backends share. */
const char *kd_errstr(int err); /* strerror, safe with many reading threads */
int kd_env_disabled(const char *name);
int kd_req_pread(const struct kd_vecio *v, struct kd_req *r, struct kd_io_counters *c);
int kd_read_rows_sync(const struct kd_vecio *v, const uint64_t *rows, size_t n, char *dst,
                      size_t dst_stride, int zc, char *bounce, struct kd_io_counters *c);
int kd_read_range_pread(struct kd_vecio *v, uint64_t first, uint64_t n, char *dst,
                        struct kd_io_counters *c);
int kd_caller_new(struct kd_vecio *v, struct kd_caller_ctx **out);
void kd_caller_put(struct kd_vecio *v, struct kd_caller_ctx *x);
void kd_caller_destroy(struct kd_vecio *v, struct kd_caller_ctx *x);

/* vecio_stream.c: the reader-thread stream, for every backend. */
int kd_stream_reader_start(struct kd_vecio_stream *s);
void kd_stream_assign(struct kd_vecio_stream *s, struct kd_stream_buf *b);

/* The backends. */
extern const struct kd_vecio_ops kd_threads_ops; /* vecio_threads.c */
extern const struct kd_vecio_ops kd_pread_ops;   /* vecio_sync.c */
extern const struct kd_vecio_ops kd_mmap_ops;    /* vecio_sync.c */
#ifdef KD_HAVE_LIBURING
extern const struct kd_vecio_ops kd_uring_ops; /* vecio_uring.c */
#endif

#endif

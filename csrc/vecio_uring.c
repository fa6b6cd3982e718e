/* vecio_uring.c — the io_uring backend: one ring per calling thread, at most
 * v->inflight record reads in flight per batch, each in its own bounce slot
 * when it cannot land in the caller's buffer; streams of aligned ranges get
 * a ring of their own. Built only with liburing. */
#include "vecio_backend.h"

#ifdef KD_HAVE_LIBURING
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <time.h>

/* Reads go to the kernel in chunks of this many, so that the device starts on
 * the first ones while the kernel is still issuing the rest: issuing an
 * O_DIRECT read takes a while, and a batch holds dozens (measured:
 * docs/benchmarks.md, 'Design figures'). */
#define KD_SUBMIT_CHUNK 8
#define KD_STREAM_PIECE (1u << 20) /* a stream chunk is read in pieces of this */

/* The caller context's backend part. */
struct uring_ctx {
    struct io_uring ring;
    struct kd_req *slots; /* one per read in flight */
    unsigned *free_slots; /* stack of unused slot numbers */
};

/* A batch's backend part. */
struct uring_batch {
    unsigned nfree, inflight;
    size_t next; /* rows[next..n) are not queued yet */
};

static unsigned ring_size_for(unsigned depth)
{
    unsigned e = 1;
    while (e < depth && e < KD_MAX_RING)
        e <<= 1;
    return e;
}

static int uring_ctx_init(struct kd_vecio *v, struct kd_caller_ctx *x)
{
    struct uring_ctx *u = caller_be(x);
    int rc = io_uring_queue_init(v->ring_entries, &u->ring, 0);
    if (rc < 0)
        return kd_fail(rc, "cannot set up an io_uring of %u entries for %s: %s", v->ring_entries,
                       v->path, kd_errstr(-rc));
    u->slots = calloc(v->inflight, sizeof *u->slots);
    u->free_slots = calloc(v->inflight, sizeof *u->free_slots);
    if (!u->slots || !u->free_slots) {
        free(u->slots);
        free(u->free_slots);
        io_uring_queue_exit(&u->ring);
        return kd_fail(-ENOMEM, "out of memory for io_uring slots on %s", v->path);
    }
    return 0;
}

static void uring_ctx_fini(struct kd_vecio *v, struct kd_caller_ctx *x)
{
    struct uring_ctx *u = caller_be(x);
    (void)v;
    io_uring_queue_exit(&u->ring);
    free(u->slots);
    free(u->free_slots);
}

/* The probe is the first caller's ring, of the size reads will use. */
static int uring_open(struct kd_vecio *v)
{
    v->ring_entries = ring_size_for(v->inflight);
    v->bounce_bytes = (size_t)v->inflight * v->slot_bytes;
    struct kd_caller_ctx *x = NULL;
    int err = kd_caller_new(v, &x);
    if (err < 0)
        return kd_fail(err,
                       "io_uring_queue_init(%u entries) failed: %s (io_uring_disabled "
                       "sysctl, seccomp filter, or a kernel without io_uring)",
                       v->ring_entries, kd_errstr(-err));
    kd_caller_put(v, x);
    return 0;
}

static void uring_close(struct kd_vecio *v) { (void)v; /* the rings go with the caller contexts */ }

/* ------------------------------------------------------------------ */
/* Record batches                                                      */

static void uring_prep(struct io_uring *ring, const struct kd_vecio *v, struct kd_req *r,
                       unsigned slot, struct kd_io_counters *c)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) {
        /* Cannot happen while in-flight <= ring size; flush and retry anyway. */
        io_uring_submit(ring);
        sqe = io_uring_get_sqe(ring);
    }
    uint32_t want = req_issue(r, c);
    io_uring_prep_read(sqe, v->fd, r->buf + r->done, want, r->off + r->done);
    io_uring_sqe_set_data(sqe, (void *)(uintptr_t)slot); /* *_data64 needs liburing 2.2 */
}

/* Queue reads until the in-flight count reaches the depth or the batch is
 * queued. */
static void uring_fill(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct uring_ctx *u = caller_be(p->x);
    struct uring_batch *ub = pending_be(p);
    char *bounce = p->x->bounce;
    unsigned queued = 0;
    while (!p->err && ub->next < p->n && ub->nfree > 0) {
        unsigned s = u->free_slots[--ub->nfree];
        struct kd_req *r = &u->slots[s];
        req_init(v, r, p->rows[ub->next], p->dst + ub->next * p->dst_stride, p->dst_stride, p->zc,
                 bounce ? bounce + (size_t)s * v->slot_bytes : NULL);
        uring_prep(&u->ring, v, r, s, &p->c);
        ub->inflight++;
        ub->next++;
        if (++queued % KD_SUBMIT_CHUNK == 0)
            io_uring_submit(&u->ring); /* errors resurface in uring_complete */
    }
}

/* Put the first reads in flight without waiting for any. */
static int uring_submit(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct uring_ctx *u = caller_be(p->x);
    struct uring_batch *ub = pending_be(p);
    unsigned depth = v->inflight;
    for (unsigned s = 0; s < depth; s++)
        u->free_slots[s] = depth - 1 - s;
    ub->nfree = depth;
    uring_fill(v, p);
    io_uring_submit(&u->ring); /* errors resurface in uring_complete */
    return 0;
}

/* Sets p->broken when the ring can no longer be trusted. */
static int uring_complete(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct uring_ctx *u = caller_be(p->x);
    struct uring_batch *ub = pending_be(p);
    struct io_uring *ring = &u->ring;

    for (;;) {
        uring_fill(v, p);
        if (ub->inflight == 0)
            break;

        int rc = io_uring_submit_and_wait(ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            p->err = kd_fail(rc, "io_uring submit failed reading %s: %s", v->path, kd_errstr(-rc));
            /* Wait out what the kernel took; the unsubmitted SQEs die with the ring. */
            unsigned taken = ub->inflight - io_uring_sq_ready(ring);
            while (taken > 0) {
                struct io_uring_cqe *cqe;
                int w = io_uring_wait_cqe(ring, &cqe);
                if (w == -EINTR || w == -EAGAIN)
                    continue;
                if (w < 0)
                    break;
                io_uring_cqe_seen(ring, cqe);
                taken--;
            }
            p->broken = 1;
            return p->err;
        }

        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe (ring, head, cqe) {
            unsigned s = (unsigned)(uintptr_t)io_uring_cqe_get_data(cqe);
            struct kd_req *r = &u->slots[s];
            int res = (int)kd_fault(0, cqe->res), st;
            seen++;
            if (p->err) { /* draining after a failure: keep the first message */
                u->free_slots[ub->nfree++] = s;
                ub->inflight--;
                continue;
            }
            if (res == -EINTR || res == -EAGAIN)
                st = 0;
            else if (res < 0)
                st = kd_req_error(v, r, res);
            else
                st = req_advance(v, r, (uint32_t)res);
            if (st == 0) {
                uring_prep(ring, v, r, s, &p->c); /* the rest of a short read */
                continue;
            }
            if (st == 1)
                req_finish(v, r);
            else
                p->err = st;
            u->free_slots[ub->nfree++] = s;
            ub->inflight--;
        }
        io_uring_cq_advance(ring, seen);

        if (seen == 0 && (rc == -EAGAIN || rc == -EBUSY)) {
            /* Kernel short of resources: wait for a completion if any read is
             * in the kernel, else back off briefly before resubmitting. */
            if (ub->inflight > io_uring_sq_ready(ring)) {
                struct io_uring_cqe *w;
                io_uring_wait_cqe(ring, &w);
            } else {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
        }
    }
    return p->err;
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */

/* User data of a piece: buffer index and piece number. */
#define PIECE_DATA(bi, k) ((void *)(uintptr_t)(((uint64_t)(k) << 8) | (bi)))

static int stream_ring_issue(struct kd_vecio_stream *s, unsigned bi)
{
    struct kd_vecio *v = s->v;
    struct io_uring *ring = s->be;
    struct kd_stream_buf *b = &s->buf[bi];
    kd_stream_assign(s, b);
    uint64_t off = v->offset + b->first * v->stride;
    uint64_t total = kd_round_up(chunk_need(v, b->rows), v->read_align);
    for (uint64_t pos = 0, k = 0; pos < total; pos += KD_STREAM_PIECE, k++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (!sqe) {
            io_uring_submit(ring);
            if (!(sqe = io_uring_get_sqe(ring)))
                return kd_fail(-EBUSY, "io_uring queue full streaming %s", v->path);
        }
        unsigned len = (unsigned)min_u64(KD_STREAM_PIECE, total - pos);
        io_uring_prep_read(sqe, v->fd, b->data + pos, len, off + pos);
        io_uring_sqe_set_data(sqe, PIECE_DATA(bi, k));
        b->pending++;
        io_count(&s->c, len);
    }
    int rc = io_uring_submit(ring);
    return rc < 0 ? kd_fail(rc, "io_uring submit failed streaming %s", v->path) : 0;
}

/* Reap completions (of any buffer) until buffer bi is complete. */
static int stream_ring_reap(struct kd_vecio_stream *s, unsigned bi)
{
    struct kd_vecio *v = s->v;
    struct io_uring *ring = s->be;
    while (s->buf[bi].pending) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            return kd_fail(rc, "io_uring wait failed streaming %s", v->path);
        uint64_t data = (uintptr_t)io_uring_cqe_get_data(cqe);
        struct kd_stream_buf *b = &s->buf[data & 0xff];
        uint64_t pos = (data >> 8) * KD_STREAM_PIECE, need = chunk_need(v, b->rows);
        uint64_t want = pos < need ? min_u64(KD_STREAM_PIECE, need - pos) : 0;
        int res = (int)kd_fault(0, cqe->res);
        if (res < 0 && !b->err)
            b->err = res;
        else if (res >= 0 && (uint64_t)res < want && !b->err)
            b->err = -EIO; /* short read before the records' end */
        b->pending--;
        io_uring_cqe_seen(ring, cqe);
    }
    struct kd_stream_buf *b = &s->buf[bi];
    if (b->err)
        return kd_fail(b->err, "reading records %llu.. of %s: %s", (unsigned long long)b->first,
                       v->path, kd_errstr(-b->err));
    return 0;
}

static int stream_ring_wait(struct kd_vecio_stream *s, unsigned i, unsigned prev)
{
    int rc;
    if (s->handed && s->next_issue < s->end && (rc = stream_ring_issue(s, prev)) < 0)
        return rc;
    s->handed = 0;
    if (s->buf[i].rows == 0)
        return 0;
    rc = stream_ring_reap(s, i);
    return rc < 0 ? rc : 1;
}

static void stream_ring_stop(struct kd_vecio_stream *s)
{
    struct io_uring *ring = s->be;
    /* Reads may still target our buffers: drain them before freeing. */
    for (unsigned i = 0; i < KD_STREAM_BUFS; i++)
        while (s->buf[i].pending) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(ring, &cqe) < 0)
                break;
            s->buf[(uintptr_t)io_uring_cqe_get_data(cqe) & 0xff].pending--;
            io_uring_cqe_seen(ring, cqe);
        }
    io_uring_queue_exit(ring);
    free(ring);
    s->be = NULL;
}

static const struct kd_stream_ops stream_ring_ops = {
    .wait = stream_ring_wait,
    .stop = stream_ring_stop,
};

/* Offsets and buffers aligned: pieces go straight into the chunk buffers
 * from a ring of the stream's own; else the reader thread. */
static int uring_stream_start(struct kd_vecio_stream *s)
{
    struct kd_vecio *v = s->v;
    uint64_t first = s->next_issue;
    if ((v->offset + first * v->stride) % v->read_align != 0 ||
        (s->chunk_rows * v->stride) % v->read_align != 0)
        return kd_stream_reader_start(s);
    struct io_uring *ring = calloc(1, sizeof *ring);
    if (!ring || io_uring_queue_init(KD_STREAM_BUFS * (KD_RANGE_CHUNK / KD_STREAM_PIECE + 2), ring,
                                     0) != 0) {
        free(ring);
        return kd_stream_reader_start(s);
    }
    s->be = ring;
    s->ops = &stream_ring_ops;
    int err = 0;
    for (unsigned i = 0; i < KD_STREAM_BUFS && s->next_issue < s->end && !err; i++)
        err = stream_ring_issue(s, i);
    return err;
}

const struct kd_vecio_ops kd_uring_ops = {
    .ctx_size = sizeof(struct uring_ctx),
    .pending_size = sizeof(struct uring_batch),
    .open = uring_open,
    .close = uring_close,
    .ctx_init = uring_ctx_init,
    .ctx_fini = uring_ctx_fini,
    .submit = uring_submit,
    .complete = uring_complete,
    .read_range = kd_read_range_pread,
    .stream_start = uring_stream_start,
};
#endif

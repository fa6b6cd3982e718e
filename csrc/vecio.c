/* vecio.c — batch reads of fixed-stride vector records (see vecio.h).
 *
 * Every record read is described by a struct kd_req: a file range to read
 * into a buffer, the number of leading bytes that must arrive (`need`; the
 * rest may lie past EOF), and where to copy the record when the range was read
 * into a bounce buffer. The backends differ only in how they issue requests:
 * io_uring (one ring per calling thread, at most io_depth in flight), a pool
 * of threads doing pread, or a plain pread loop. mmap copies from a mapping. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "vecio.h"

#include <sys/vfs.h>
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#ifdef KD_HAVE_LIBURING
#include <liburing.h>
#endif

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

#define KD_RANGE_CHUNK (8u << 20)   /* read_range issues reads of at most this */
#define KD_MAX_THREADS 64
#define KD_MAX_RING 4096
#define KD_MIN_BUF_ALIGN 64
/* Under O_DIRECT our read buffers are page aligned and no record read crosses
 * a page: a read whose buffer straddles a page boundary reaches the device as
 * two segments, and on a virtio disk that cut random 4 KiB reads from ~160k to
 * ~117k per second (two threads keeping 80 reads each in flight, the same
 * queue depth in /sys/block/.../stat either way). */
#define KD_PAGE_ALIGN 4096u

/* One read of one record (or one chunk of a range). */
struct kd_req {
    uint64_t row;       /* record number, for error messages */
    char *buf;          /* where the file range lands */
    uint64_t off;       /* file offset of buf[0] */
    uint32_t len;       /* bytes requested */
    uint32_t need;      /* leading bytes that must arrive; the rest may be past EOF */
    uint32_t done;      /* bytes already read */
    char *copy_to;      /* non-NULL: copy the record from buf + skip to here */
    uint32_t skip;
};

/* Per-calling-thread resources, kept on a free list on the handle. */
struct kd_ctx {
    struct kd_ctx *next;
    char *bounce;
    size_t bounce_size;
#ifdef KD_HAVE_LIBURING
    int ring_ok;
    struct io_uring ring;
    struct kd_req *slots;   /* one per read in flight */
    unsigned *free_slots;   /* stack of unused slot numbers */
#endif
};

/* A kd_vecio_read batch handed to the thread pool. Lives on the caller's
 * stack; workers touch it only between claiming a chunk and completing it. */
struct kd_batch {
    struct kd_batch *qnext;
    const uint64_t *rows;
    size_t n;
    char *dst;
    size_t dst_stride;
    int zc;
    size_t chunk, nchunks, next, done;
    int err;
    char errmsg[KD_ERRMSG_LEN];
    uint64_t ops, bytes;
    pthread_cond_t cv;
};

struct kd_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    struct kd_batch *head;   /* batches with unclaimed chunks */
    int stop;
    unsigned nthreads;
    pthread_t *threads;
};

struct kd_vecio {
    char *path;
    int fd;
    uint64_t offset, count, file_size;
    uint32_t stride, record_bytes;
    int backend;
    int direct;
    uint32_t alignment;     /* probed direct-I/O alignment, reported in info */
    uint32_t read_align;    /* alignment reads must respect: alignment, or 1 if buffered */
    uint32_t buf_align;     /* alignment of buffers we allocate / want from callers */
    size_t slot_bytes;      /* bounce bytes per in-flight read: max_span, buf_align-rounded */
    unsigned fallbacks;
    unsigned io_depth;
    unsigned ring_entries;  /* power of two >= in-flight bound */
    unsigned inflight;      /* bound on io_uring reads in flight per call */
    size_t max_span;        /* largest aligned span covering one record */

    pthread_mutex_t ctx_mu;
    int ctx_mu_ok;
    struct kd_ctx *free_ctx;

    char *map;              /* mmap backend */
    size_t map_len;
    uint64_t map_off;       /* file offset of map[0] */

    struct kd_pool pool;
    int pool_ok;
};

/* A batch of record reads between kd_vecio_submit and kd_vecio_complete. */
struct kd_vecio_pending {
    struct kd_vecio *v;
    struct kd_ctx *x;
    const uint64_t *rows;
    size_t n;
    char *dst;
    size_t dst_stride;
    int zc;
    int how;                   /* PENDING_DONE, PENDING_URING, PENDING_POOL */
    int err;
    struct kd_io_counters c;
    unsigned nfree, inflight;  /* io_uring */
    size_t next;
    struct kd_batch b;         /* thread pool */
};

enum { PENDING_DONE, PENDING_URING, PENDING_POOL };

static uint64_t round_down(uint64_t x, uint64_t a) { return x / a * a; }
static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* strerror for messages, safe with many reading threads (GNU strerror_r). */
static const char *errstr(int err)
{
    static _Thread_local char buf[128];
    return strerror_r(err, buf, sizeof buf);
}

/* ------------------------------------------------------------------ */
/* Alignment probing                                                   */

/* The kernel ABI layout of struct statx up to the direct-I/O fields; ours so
 * that the probe works whatever the installed headers know about. */
struct kd_statx {
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, pad1;
    uint64_t ino, size, blocks, attributes_mask;
    struct { int64_t sec; uint32_t nsec; int32_t pad; } atime, btime, ctime, mtime;
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t mnt_id;
    uint32_t dio_mem_align, dio_offset_align;
    uint64_t spare[12];
};
_Static_assert(sizeof(struct kd_statx) == 256, "statx layout");
_Static_assert(offsetof(struct kd_statx, dio_mem_align) == 0x98, "statx layout");

static uint32_t sysfs_block_size(unsigned maj, unsigned min)
{
    static const char *fmts[] = {
        "/sys/dev/block/%u:%u/queue/logical_block_size",
        "/sys/dev/block/%u:%u/../queue/logical_block_size",  /* partition */
    };
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        char p[128];
        snprintf(p, sizeof p, fmts[i], maj, min);
        FILE *f = fopen(p, "re");
        if (!f)
            continue;
        unsigned long bs = 0;
        int ok = fscanf(f, "%lu", &bs) == 1;
        fclose(f);
        if (ok && is_pow2(bs) && bs <= (1u << 20))
            return (uint32_t)bs;
    }
    return 0;
}

/* Logical block size of the device holding the file, or 0 if unreachable. */
static uint32_t device_block_size(int fd, int is_blk, unsigned maj, unsigned min)
{
    int bs = 0;
    if (is_blk && ioctl(fd, BLKSSZGET, &bs) == 0 && bs > 0)
        return (uint32_t)bs;
    char p[64];
    snprintf(p, sizeof p, "/dev/block/%u:%u", maj, min);
    int dfd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (dfd >= 0) {
        int ok = ioctl(dfd, BLKSSZGET, &bs) == 0 && bs > 0;
        close(dfd);
        if (ok)
            return (uint32_t)bs;
    }
    return sysfs_block_size(maj, min);
}

/* Fill v->file_size and v->alignment from the open descriptor. */
static int probe_file(struct kd_vecio *v)
{
    struct stat st;
    if (fstat(v->fd, &st) != 0) {
        int e = errno;
        return kd_fail(-e, "cannot stat %s: %s", v->path, errstr(e));
    }
    if (S_ISDIR(st.st_mode))
        return kd_fail(-EISDIR, "%s is a directory, not a vector file", v->path);
    int is_blk = S_ISBLK(st.st_mode);
    v->file_size = (uint64_t)st.st_size;
    if (is_blk) {
        uint64_t sz = 0;
        if (ioctl(v->fd, BLKGETSIZE64, &sz) != 0) {
            int e = errno;
            return kd_fail(-e, "cannot get the size of block device %s: %s", v->path,
                           errstr(e));
        }
        v->file_size = sz;
    }
    unsigned maj = major(st.st_dev), min = minor(st.st_dev);
    if (is_blk) {
        maj = major(st.st_rdev);
        min = minor(st.st_rdev);
    }

    uint32_t align = 0;
#ifdef SYS_statx
    struct kd_statx sx;
    memset(&sx, 0, sizeof sx);
    if (syscall(SYS_statx, v->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.mask & STATX_DIOALIGN)) {
        uint32_t a = sx.dio_mem_align > sx.dio_offset_align ? sx.dio_mem_align
                                                            : sx.dio_offset_align;
        if (is_pow2(a))
            align = a;
    }
#endif
    if (!align)
        align = device_block_size(v->fd, is_blk, maj, min);
    if (!is_pow2(align))
        align = 4096;
    /* Test-only: behave as on a device with a coarser alignment (a multiple
     * of the real one keeps every read valid). */
    const char *force = getenv("KNNDIRECT_DIO_ALIGN");
    if (force && *force) {
        unsigned long f = strtoul(force, NULL, 10);
        if (is_pow2(f) && f >= align && f <= 65536)
            align = (uint32_t)f;
    }
    v->alignment = align;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */

/* Set up the read of record `row` whose slot in the destination is `slot`.
 * zc: read straight into the slot; else direct mode reads the aligned span
 * into `bounce`, buffered mode reads the record into the slot. */
static void req_init(const struct kd_vecio *v, struct kd_req *r, uint64_t row,
                     char *slot, size_t dst_stride, int zc, char *bounce)
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
        r->len = dst_stride >= v->stride
                     ? v->stride
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

static int req_eof(const struct kd_vecio *v, const struct kd_req *r)
{
    return kd_fail(-EIO, "unexpected end of file reading record %llu at offset %llu of %s "
                   "(got %u of %u bytes; did the file shrink?)",
                   (unsigned long long)r->row, (unsigned long long)r->off, v->path,
                   r->done, r->need);
}

/* Account for `res` more bytes read. 1: complete, 0: read the rest, <0: error. */
static int req_advance(const struct kd_vecio *v, struct kd_req *r, uint32_t res)
{
    uint32_t before = r->done;
    r->done += res;
    if (r->done >= r->len)
        return 1;
    if (res == 0 || r->off + r->done >= v->file_size)
        return r->done >= r->need ? 1 : req_eof(v, r);
    /* A retry under O_DIRECT must start aligned: re-read the partial block.
     * A short unaligned read means the file ended before the size seen at
     * open, so no progress is EOF. */
    r->done = (uint32_t)round_down(r->done, v->read_align);
    if (r->done <= before) {
        r->done = before + res;
        return r->done >= r->need ? 1 : req_eof(v, r);
    }
    return 0;
}

static void req_finish(const struct kd_vecio *v, const struct kd_req *r)
{
    if (r->copy_to)
        memcpy(r->copy_to, r->buf + r->skip, v->record_bytes);
}

static int req_error(const struct kd_vecio *v, const struct kd_req *r, int err)
{
    return kd_fail(err, "read of record %llu (file offset %llu, %u bytes) from %s failed: %s",
                   (unsigned long long)r->row, (unsigned long long)(r->off + r->done),
                   r->len - r->done, v->path, errstr(-err));
}

/* Synchronous read of one request, retrying short reads. */
static int req_pread(const struct kd_vecio *v, struct kd_req *r, struct kd_io_counters *c)
{
    for (;;) {
        uint32_t want = r->len - r->done;
        ssize_t got = pread(v->fd, r->buf + r->done, want, (off_t)(r->off + r->done));
        c->read_ops++;
        c->read_bytes += want;
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return req_error(v, r, -errno);
        }
        if ((got = (ssize_t)kd_fault(0, got)) < 0)   /* tests only */
            return req_error(v, r, (int)got);
        int rc = req_advance(v, r, (uint32_t)got);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
    }
    req_finish(v, r);
    return 0;
}

/* pread of rows[0..n) into dst, one record at a time. */
static int read_rows_sync(const struct kd_vecio *v, const uint64_t *rows, size_t n,
                          char *dst, size_t dst_stride, int zc, char *bounce,
                          struct kd_io_counters *c)
{
    for (size_t i = 0; i < n; i++) {
        struct kd_req r;
        req_init(v, &r, rows[i], dst + i * dst_stride, dst_stride, zc, bounce);
        int rc = req_pread(v, &r, c);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Per-thread contexts                                                 */

static void ctx_destroy(struct kd_ctx *x)
{
    if (!x)
        return;
#ifdef KD_HAVE_LIBURING
    if (x->ring_ok)
        io_uring_queue_exit(&x->ring);
    free(x->slots);
    free(x->free_slots);
#endif
    kd_free_aligned(x->bounce);
    free(x);
}

/* Environment switches for tests: pretend a kernel feature is unavailable. */
static int disabled_by_env(const char *name)
{
    const char *e = getenv(name);
    return e && e[0] && strcmp(e, "0") != 0;
}

static int ctx_new(struct kd_vecio *v, struct kd_ctx **out)
{
    struct kd_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return kd_fail(-ENOMEM, "out of memory for an I/O context on %s", v->path);
#ifdef KD_HAVE_LIBURING
    if (v->backend == KD_IO_URING) {
        int rc = io_uring_queue_init(v->ring_entries, &x->ring, 0);
        if (rc < 0) {
            free(x);
            return kd_fail(rc, "cannot set up an io_uring of %u entries for %s: %s",
                           v->ring_entries, v->path, errstr(-rc));
        }
        x->ring_ok = 1;
        x->slots = calloc(v->inflight, sizeof *x->slots);
        x->free_slots = calloc(v->inflight, sizeof *x->free_slots);
        if (!x->slots || !x->free_slots) {
            ctx_destroy(x);
            return kd_fail(-ENOMEM, "out of memory for io_uring slots on %s", v->path);
        }
    }
#endif
    *out = x;
    return 0;
}

static int ctx_get(struct kd_vecio *v, struct kd_ctx **out)
{
    pthread_mutex_lock(&v->ctx_mu);
    struct kd_ctx *x = v->free_ctx;
    if (x)
        v->free_ctx = x->next;
    pthread_mutex_unlock(&v->ctx_mu);
    if (x) {
        *out = x;
        return 0;
    }
    return ctx_new(v, out);
}

static void ctx_put(struct kd_vecio *v, struct kd_ctx *x)
{
    pthread_mutex_lock(&v->ctx_mu);
    x->next = v->free_ctx;
    v->free_ctx = x;
    pthread_mutex_unlock(&v->ctx_mu);
}

static int ctx_bounce(const struct kd_vecio *v, struct kd_ctx *x, size_t size)
{
    if (x->bounce_size >= size)
        return 0;
    kd_free_aligned(x->bounce);
    x->bounce_size = 0;
    x->bounce = kd_alloc_aligned(v->buf_align, size);
    if (!x->bounce)
        return kd_fail(-ENOMEM, "out of memory for a %zu-byte bounce buffer reading %s",
                       size, v->path);
    x->bounce_size = size;
    return 0;
}

/* ------------------------------------------------------------------ */
/* io_uring backend                                                    */

#ifdef KD_HAVE_LIBURING
static void uring_prep(struct io_uring *ring, const struct kd_vecio *v,
                       struct kd_req *r, unsigned slot)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) {
        /* Cannot happen while in-flight <= ring size; flush and retry anyway. */
        io_uring_submit(ring);
        sqe = io_uring_get_sqe(ring);
    }
    io_uring_prep_read(sqe, v->fd, r->buf + r->done, r->len - r->done, r->off + r->done);
    io_uring_sqe_set_data(sqe, (void *)(uintptr_t)slot);   /* *_data64 needs liburing 2.2 */
}

/* Reads go to the kernel in chunks of this many, so that the device starts on
 * the first ones while the kernel is still issuing the rest (an O_DIRECT read
 * costs ~1 us to issue; single-query p50 at 80 reads: 0.71 -> 0.67 ms). */
#define KD_SUBMIT_CHUNK 8

/* Queue reads until `inflight` reaches the depth or the batch is queued. */
static void uring_fill(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct kd_ctx *x = p->x;
    unsigned queued = 0;
    while (!p->err && p->next < p->n && p->nfree > 0) {
        unsigned s = x->free_slots[--p->nfree];
        struct kd_req *r = &x->slots[s];
        char *bounce = x->bounce ? x->bounce + (size_t)s * v->slot_bytes : NULL;
        req_init(v, r, p->rows[p->next], p->dst + p->next * p->dst_stride, p->dst_stride, p->zc,
                 bounce);
        uring_prep(&x->ring, v, r, s);
        p->c.read_ops++;
        p->c.read_bytes += r->len;
        p->inflight++;
        p->next++;
        if (++queued % KD_SUBMIT_CHUNK == 0)
            io_uring_submit(&x->ring);   /* errors resurface in uring_finish */
    }
}

/* Put the first reads in flight without waiting for any. */
static void uring_start(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    unsigned depth = v->inflight;
    for (unsigned s = 0; s < depth; s++)
        p->x->free_slots[s] = depth - 1 - s;
    p->nfree = depth;
    uring_fill(v, p);
    io_uring_submit(&p->x->ring);   /* errors resurface in uring_finish */
}

/* Returns 0, or <0 with *broken set when the ring can no longer be trusted. */
static int uring_finish(struct kd_vecio *v, struct kd_vecio_pending *p, int *broken)
{
    struct kd_ctx *x = p->x;
    struct io_uring *ring = &x->ring;
    struct kd_io_counters *c = &p->c;

    for (;;) {
        uring_fill(v, p);
        if (p->inflight == 0)
            break;

        int rc = io_uring_submit_and_wait(ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            p->err = kd_fail(rc, "io_uring submit failed reading %s: %s", v->path,
                             errstr(-rc));
            /* Wait out what the kernel took; the unsubmitted SQEs die with the ring. */
            unsigned taken = p->inflight - io_uring_sq_ready(ring);
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
            *broken = 1;
            return p->err;
        }

        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(ring, head, cqe) {
            unsigned s = (unsigned)(uintptr_t)io_uring_cqe_get_data(cqe);
            struct kd_req *r = &x->slots[s];
            int res = (int)kd_fault(0, cqe->res), st;
            seen++;
            if (p->err) {   /* draining after a failure: keep the first message */
                x->free_slots[p->nfree++] = s;
                p->inflight--;
                continue;
            }
            if (res == -EINTR || res == -EAGAIN)
                st = 0;
            else if (res < 0)
                st = req_error(v, r, res);
            else
                st = req_advance(v, r, (uint32_t)res);
            if (st == 0) {
                uring_prep(ring, v, r, s);   /* the rest of a short read */
                c->read_ops++;
                c->read_bytes += r->len - r->done;
                continue;
            }
            if (st == 1)
                req_finish(v, r);
            else
                p->err = st;
            x->free_slots[p->nfree++] = s;
            p->inflight--;
        }
        io_uring_cq_advance(ring, seen);

        if (seen == 0 && (rc == -EAGAIN || rc == -EBUSY)) {
            /* Kernel short of resources: wait for a completion if any read is
             * in the kernel, else back off briefly before resubmitting. */
            if (p->inflight > io_uring_sq_ready(ring)) {
                struct io_uring_cqe *w;
                io_uring_wait_cqe(ring, &w);
            } else {
                struct timespec ts = { 0, 50000 };
                nanosleep(&ts, NULL);
            }
        }
    }
    return p->err;
}
#endif

/* ------------------------------------------------------------------ */
/* Thread pool backend                                                 */

static void batch_unlink(struct kd_pool *p, struct kd_batch *b)
{
    for (struct kd_batch **pp = &p->head; *pp; pp = &(*pp)->qnext) {
        if (*pp == b) {
            *pp = b->qnext;
            return;
        }
    }
}

/* Claim the next chunk of b; pool lock held. Returns 0 if none is left. */
static int batch_claim(struct kd_pool *p, struct kd_batch *b, size_t *chunk, int *skip)
{
    if (b->next >= b->nchunks)
        return 0;
    *chunk = b->next++;
    *skip = b->err != 0;   /* after a failure, finish the remaining chunks unread */
    if (b->next == b->nchunks)
        batch_unlink(p, b);
    return 1;
}

static void batch_run_chunk(struct kd_vecio *v, struct kd_batch *b, size_t k, int skip,
                            char **bounce)
{
    struct kd_io_counters c = { 0, 0, 0 };
    int rc = 0;
    if (!skip) {
        if (!b->zc && v->direct && !*bounce) {
            *bounce = kd_alloc_aligned(v->buf_align, v->max_span);
            if (!*bounce)
                rc = kd_fail(-ENOMEM, "out of memory for a bounce buffer reading %s", v->path);
        }
        if (rc == 0) {
            size_t i0 = k * b->chunk;
            size_t i1 = i0 + b->chunk < b->n ? i0 + b->chunk : b->n;
            rc = read_rows_sync(v, b->rows + i0, i1 - i0, b->dst + i0 * b->dst_stride,
                                b->dst_stride, b->zc, *bounce, &c);
        }
    }
    struct kd_pool *p = &v->pool;
    pthread_mutex_lock(&p->mu);
    b->ops += c.read_ops;
    b->bytes += c.read_bytes;
    if (rc < 0 && !b->err) {
        b->err = rc;
        snprintf(b->errmsg, sizeof b->errmsg, "%s", kd_last_error());
    }
    if (++b->done == b->nchunks)
        pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *pool_worker(void *arg)
{
    struct kd_vecio *v = arg;
    struct kd_pool *p = &v->pool;
    char *bounce = NULL;   /* per worker: one synchronous read at a time */

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->head)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop)
            break;
        struct kd_batch *b = p->head;
        size_t k;
        int skip;
        if (!batch_claim(p, b, &k, &skip))
            continue;
        pthread_mutex_unlock(&p->mu);
        batch_run_chunk(v, b, k, skip, &bounce);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    kd_free_aligned(bounce);
    return NULL;
}

static int pool_start(struct kd_vecio *v, unsigned nthreads)
{
    struct kd_pool *p = &v->pool;
    int rc = pthread_mutex_init(&p->mu, NULL);
    if (rc)
        return kd_fail(-rc, "cannot create the I/O thread pool mutex for %s", v->path);
    rc = pthread_cond_init(&p->work_cv, NULL);
    if (rc) {
        pthread_mutex_destroy(&p->mu);
        return kd_fail(-rc, "cannot create the I/O thread pool condition for %s", v->path);
    }
    v->pool_ok = 1;   /* from here pool_stop() cleans up */
    p->threads = calloc(nthreads, sizeof *p->threads);
    if (!p->threads)
        return kd_fail(-ENOMEM, "out of memory for the I/O thread pool of %s", v->path);
    /* Workers block all signals so that they go to the application's threads
     * (the Python interpreter handles them on its main thread). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (unsigned i = 0; i < nthreads; i++) {
        rc = pthread_create(&p->threads[i], NULL, pool_worker, v);
        if (rc) {
            rc = kd_fail(-rc, "cannot start I/O thread %u of %u for %s: %s", i, nthreads,
                         v->path, errstr(rc));
            break;
        }
        p->nthreads = i + 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static void pool_stop(struct kd_vecio *v)
{
    struct kd_pool *p = &v->pool;
    if (!v->pool_ok)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    v->pool_ok = 0;
}

/* Hand a batch to the pool's workers; the caller joins in at pool_finish. */
static int pool_submit(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct kd_pool *pool = &v->pool;
    struct kd_batch *b = &p->b;
    if (!p->zc && v->direct) {
        int rc = ctx_bounce(v, p->x, v->max_span);
        if (rc < 0)
            return rc;
    }
    /* Chunks smaller than an even split so that fast threads take more. */
    size_t parts = 2 * ((size_t)pool->nthreads + 1);
    if (parts > p->n)
        parts = p->n;
    memset(b, 0, sizeof *b);
    b->rows = p->rows;
    b->n = p->n;
    b->dst = p->dst;
    b->dst_stride = p->dst_stride;
    b->zc = p->zc;
    b->chunk = (p->n + parts - 1) / parts;
    b->nchunks = (p->n + b->chunk - 1) / b->chunk;
    int rc = pthread_cond_init(&b->cv, NULL);
    if (rc)
        return kd_fail(-rc, "cannot create a condition variable reading %s", v->path);
    pthread_mutex_lock(&pool->mu);
    struct kd_batch **pp = &pool->head;   /* FIFO: older batches first */
    while (*pp)
        pp = &(*pp)->qnext;
    *pp = b;
    for (size_t w = 0; w < b->nchunks && w < pool->nthreads; w++)
        pthread_cond_signal(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
    return 0;
}

static int pool_finish(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct kd_pool *pool = &v->pool;
    struct kd_batch *b = &p->b;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        size_t k;
        int skip;
        if (!batch_claim(pool, b, &k, &skip))
            break;
        pthread_mutex_unlock(&pool->mu);
        batch_run_chunk(v, b, k, skip, &p->x->bounce);
        pthread_mutex_lock(&pool->mu);
    }
    while (b->done < b->nchunks)
        pthread_cond_wait(&b->cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_cond_destroy(&b->cv);
    p->c.read_ops += b->ops;
    p->c.read_bytes += b->bytes;
    if (b->err) {
        kd_set_error_text(b->errmsg);
        return b->err;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Open / close                                                        */

#ifdef KD_HAVE_LIBURING
static unsigned ring_size_for(unsigned depth)
{
    unsigned e = 1;
    while (e < depth && e < KD_MAX_RING)
        e <<= 1;
    return e;
}
#endif

static int validate_config(const struct kd_vecio_config *cfg)
{
    const char *path = cfg->path ? cfg->path : "(null)";
    if (!cfg->path || !cfg->path[0])
        return kd_fail(-EINVAL, "vector file path is empty");
    if (cfg->record_bytes == 0)
        return kd_fail(-EINVAL, "record_bytes must be > 0 for %s", path);
    if (cfg->stride < cfg->record_bytes)
        return kd_fail(-EINVAL, "stride %u is smaller than record_bytes %u for %s",
                       cfg->stride, cfg->record_bytes, path);
    if (cfg->offset % 4096)
        return kd_fail(-EINVAL, "section offset %llu of %s is not a multiple of 4096",
                       (unsigned long long)cfg->offset, path);
    if (cfg->io_depth < 1)
        return kd_fail(-EINVAL, "io_depth must be >= 1 for %s", path);
    if (cfg->backend < KD_IO_AUTO || cfg->backend > KD_IO_MMAP)
        return kd_fail(-EINVAL, "unknown I/O backend %d for %s", cfg->backend, path);
    if (cfg->offset > UINT64_MAX - cfg->record_bytes ||
        (cfg->count > 0 &&
         cfg->count - 1 > (UINT64_MAX - cfg->offset - cfg->record_bytes) / cfg->stride))
        return kd_fail(-EINVAL, "section of %llu records of stride %u overflows for %s",
                       (unsigned long long)cfg->count, cfg->stride, path);
    return 0;
}

/* tmpfs holds files in the page cache itself: O_DIRECT there (accepted since
 * Linux 6.6) only adds alignment padding to each read. */
static int memory_backed(const char *path)
{
    struct statfs sf;
    return statfs(path, &sf) == 0 && sf.f_type == 0x01021994; /* TMPFS_MAGIC */
}

/* Open v->path; on O_DIRECT refusal (tmpfs, some overlayfs) fall back to
 * buffered reads with read-ahead off. */
static int open_file(struct kd_vecio *v, int want_direct)
{
    v->direct = 0;
    if (want_direct && !disabled_by_env("KNNDIRECT_DISABLE_DIRECT_IO") && !memory_backed(v->path)) {
        v->fd = open(v->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (v->fd >= 0) {
            v->direct = 1;
            return 0;
        }
        int e = errno;
        if (e != EINVAL)
            return kd_fail(-e, "cannot open %s with O_DIRECT: %s", v->path, errstr(e));
    }
    v->fd = open(v->path, O_RDONLY | O_CLOEXEC);
    if (v->fd < 0) {
        int e = errno;
        return kd_fail(-e, "cannot open %s: %s", v->path, errstr(e));
    }
    if (want_direct) {
        v->fallbacks |= KD_FALLBACK_NO_DIRECT;
        posix_fadvise(v->fd, 0, 0, POSIX_FADV_RANDOM);   /* best effort */
    }
    return 0;
}

/* Some filesystems accept O_DIRECT at open and refuse it at read time; one
 * aligned read of the section's first block finds out while we can still
 * fall back. Returns 1 when direct reads work, 0 when they do not, <0 error. */
static int probe_direct_read(struct kd_vecio *v)
{
    void *buf = kd_alloc_aligned(v->buf_align, v->alignment);
    if (!buf)
        return kd_fail(-ENOMEM, "out of memory probing O_DIRECT on %s", v->path);
    ssize_t got;
    do
        got = pread(v->fd, buf, v->alignment, (off_t)round_down(v->offset, v->alignment));
    while (got < 0 && errno == EINTR);
    int e = errno;
    kd_free_aligned(buf);
    if (got >= 0)
        return 1;
    if (e == EINVAL)
        return 0;
    return kd_fail(-e, "probe read of %s with O_DIRECT failed: %s", v->path, errstr(e));
}

static int map_section(struct kd_vecio *v)
{
    if (v->count == 0)
        return 0;
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t page = pg > 0 ? (uint64_t)pg : 4096;
    v->map_off = round_down(v->offset, page);
    uint64_t end = v->offset + (v->count - 1) * v->stride + v->record_bytes;
    if (end - v->map_off > SIZE_MAX)
        return kd_fail(-EFBIG, "section of %s is too large to map", v->path);
    v->map_len = (size_t)(end - v->map_off);
    void *m = mmap(NULL, v->map_len, PROT_READ, MAP_SHARED, v->fd, (off_t)v->map_off);
    if (m == MAP_FAILED) {
        int e = errno;
        v->map_len = 0;
        return kd_fail(-e, "cannot mmap %zu bytes of %s: %s", (size_t)(end - v->map_off),
                       v->path, errstr(e));
    }
    v->map = m;
    madvise(v->map, v->map_len, MADV_RANDOM);   /* best effort: no read-around */
    return 0;
}

/* Decide between io_uring and threads; creates the first ring when io_uring
 * works (the probe is a real ring of the size reads will use). */
static int select_backend(struct kd_vecio *v, int asked)
{
    if (asked != KD_IO_AUTO && asked != KD_IO_URING) {
        v->backend = asked;
        return 0;
    }
    int err;
    char why[KD_ERRMSG_LEN];
#ifdef KD_HAVE_LIBURING
    if (disabled_by_env("KNNDIRECT_DISABLE_IO_URING")) {
        err = -ENOSYS;
        snprintf(why, sizeof why, "disabled by KNNDIRECT_DISABLE_IO_URING");
    } else {
        v->backend = KD_IO_URING;
        struct kd_ctx *x = NULL;
        err = ctx_new(v, &x);
        if (err == 0) {
            ctx_put(v, x);
            return 0;
        }
        snprintf(why, sizeof why,
                 "io_uring_queue_init(%u entries) failed: %s (io_uring_disabled sysctl, "
                 "seccomp filter, or a kernel without io_uring)",
                 v->ring_entries, errstr(-err));
    }
#else
    err = -ENOSYS;
    snprintf(why, sizeof why, "this build has no io_uring support (liburing not found)");
#endif
    if (asked == KD_IO_URING)
        return kd_fail(err, "io_uring backend requested for %s but io_uring is unavailable: %s",
                       v->path, why);
    v->backend = KD_IO_THREADS;
    v->fallbacks |= KD_FALLBACK_NO_URING;
    return 0;
}

int kd_vecio_open(struct kd_vecio **out, const struct kd_vecio_config *cfg)
{
    if (!out || !cfg)
        return kd_fail(-EINVAL, "kd_vecio_open: NULL argument");
    *out = NULL;
    int rc = validate_config(cfg);
    if (rc < 0)
        return rc;

    struct kd_vecio *v = calloc(1, sizeof *v);
    if (!v)
        return kd_fail(-ENOMEM, "out of memory opening %s", cfg->path);
    v->fd = -1;
    v->offset = cfg->offset;
    v->count = cfg->count;
    v->stride = cfg->stride;
    v->record_bytes = cfg->record_bytes;
    v->io_depth = cfg->io_depth;
    v->path = strdup(cfg->path);
    if (!v->path) {
        rc = kd_fail(-ENOMEM, "out of memory opening %s", cfg->path);
        goto fail;
    }
    if ((rc = pthread_mutex_init(&v->ctx_mu, NULL)) != 0) {
        rc = kd_fail(-rc, "cannot create a mutex for %s", cfg->path);
        goto fail;
    }
    v->ctx_mu_ok = 1;

    /* The mmap backend reads the page cache by definition: no O_DIRECT. */
    int want_direct = cfg->direct_io && cfg->backend != KD_IO_MMAP;
    if ((rc = open_file(v, want_direct)) < 0)
        goto fail;
    if ((rc = probe_file(v)) < 0)
        goto fail;
    v->buf_align = KD_MIN_BUF_ALIGN;
    if (v->direct)
        v->buf_align = v->alignment > KD_PAGE_ALIGN ? v->alignment : KD_PAGE_ALIGN;
    if (v->direct && v->count > 0) {
        rc = probe_direct_read(v);
        if (rc < 0)
            goto fail;
        if (rc == 0) {
            close(v->fd);
            v->fd = -1;
            if ((rc = open_file(v, 0)) < 0)
                goto fail;
            v->fallbacks |= KD_FALLBACK_NO_DIRECT;
            posix_fadvise(v->fd, 0, 0, POSIX_FADV_RANDOM);
            v->buf_align = KD_MIN_BUF_ALIGN;
        }
    }
    v->read_align = v->direct ? v->alignment : 1;

    uint64_t need = v->offset;
    if (v->count > 0)
        need += (v->count - 1) * v->stride + v->record_bytes;
    if (v->file_size < need) {
        rc = kd_fail(-EINVAL, "%s holds %llu bytes but the section needs %llu "
                     "(offset %llu + %llu records of stride %u)", v->path,
                     (unsigned long long)v->file_size, (unsigned long long)need,
                     (unsigned long long)v->offset, (unsigned long long)v->count, v->stride);
        goto fail;
    }

    v->max_span = v->direct ? kd_round_up(v->record_bytes, v->read_align) + v->read_align
                            : v->record_bytes;
    v->slot_bytes = kd_round_up(v->max_span, v->buf_align);
    v->inflight = cfg->io_depth < KD_MAX_RING ? cfg->io_depth : KD_MAX_RING;
#ifdef KD_HAVE_LIBURING
    v->ring_entries = ring_size_for(v->inflight);
#endif

    if ((rc = select_backend(v, cfg->backend)) < 0)
        goto fail;
    if (v->backend == KD_IO_MMAP && (rc = map_section(v)) < 0)
        goto fail;
    if (v->backend == KD_IO_THREADS) {
        unsigned nt = cfg->io_depth < KD_MAX_THREADS ? cfg->io_depth : KD_MAX_THREADS;
        if ((rc = pool_start(v, nt)) < 0)
            goto fail;
    }
    *out = v;
    return 0;

fail:
    {
        /* close may not clobber the message of the failure being reported */
        char msg[KD_ERRMSG_LEN];
        snprintf(msg, sizeof msg, "%s", kd_last_error());
        kd_vecio_close(v);
        kd_set_error_text(msg);
    }
    return rc;
}

void kd_vecio_close(struct kd_vecio *v)
{
    if (!v)
        return;
    pool_stop(v);
    while (v->free_ctx) {
        struct kd_ctx *x = v->free_ctx;
        v->free_ctx = x->next;
        ctx_destroy(x);
    }
    if (v->ctx_mu_ok)
        pthread_mutex_destroy(&v->ctx_mu);
    if (v->map)
        munmap(v->map, v->map_len);
    if (v->fd >= 0)
        close(v->fd);
    free(v->path);
    free(v);
}

void kd_vecio_get_info(const struct kd_vecio *v, struct kd_vecio_info *info)
{
    info->backend = v->backend;
    info->direct_io = v->direct;
    info->alignment = v->alignment;
    info->fallbacks = v->fallbacks;
}

uint32_t kd_vecio_buffer_alignment(const struct kd_vecio *v)
{
    return v->buf_align;
}

const char *kd_io_backend_name(int backend)
{
    switch (backend) {
    case KD_IO_AUTO: return "auto";
    case KD_IO_URING: return "io_uring";
    case KD_IO_THREADS: return "threads";
    case KD_IO_PREAD: return "pread";
    case KD_IO_MMAP: return "mmap";
    default: return "unknown";
    }
}

int kd_vecio_have_uring(void)
{
#ifdef KD_HAVE_LIBURING
    return 1;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------ */
/* Reads                                                               */

/* Whether records can be read straight into dst under O_DIRECT: aligned, and
 * no record's slot crossing a page (see KD_PAGE_ALIGN). */
static int zero_copy_ok(const struct kd_vecio *v, const void *dst, size_t dst_stride)
{
    uint32_t a = v->read_align;
    int whole_pages = dst_stride % KD_PAGE_ALIGN == 0 || KD_PAGE_ALIGN % dst_stride == 0;
    return (uintptr_t)dst % v->buf_align == 0 && dst_stride % a == 0 && whole_pages &&
           v->stride % a == 0 && v->offset % a == 0;
}

int kd_vecio_submit(struct kd_vecio *v, const uint64_t *rows, size_t n, void *dst,
                    size_t dst_stride, struct kd_vecio_pending **out)
{
    *out = NULL;
    if (!v || (n && (!rows || !dst)))
        return kd_fail(-EINVAL, "kd_vecio_submit: NULL argument");
    if (dst_stride < v->record_bytes)
        return kd_fail(-EINVAL, "destination stride %zu is smaller than the record size %u of %s",
                       dst_stride, v->record_bytes, v->path);
    for (size_t i = 0; i < n; i++)
        if (rows[i] >= v->count)
            return kd_fail(-EINVAL,
                           "row %llu (batch position %zu) is out of range: %s holds %llu records",
                           (unsigned long long)rows[i], i, v->path,
                           (unsigned long long)v->count);
    struct kd_vecio_pending *p = calloc(1, sizeof *p);
    if (!p)
        return kd_fail(-ENOMEM, "out of memory for a read batch on %s", v->path);
    p->v = v;
    p->rows = rows;
    p->n = n;
    p->dst = dst;
    p->dst_stride = dst_stride;
    p->how = PENDING_DONE;
    *out = p;
    if (n == 0)
        return 0;
    uint64_t t0 = kd_now_ns();   /* synchronous backends wait here, not in complete */
    if (v->backend == KD_IO_MMAP) {
        for (size_t i = 0; i < n; i++)
            memcpy((char *)dst + i * dst_stride,
                   v->map + (v->offset - v->map_off) + rows[i] * v->stride, v->record_bytes);
        p->c.read_ops = n;
        p->c.read_bytes = (uint64_t)n * v->record_bytes;
        p->c.wait_ns = kd_now_ns() - t0;
        return 0;
    }
    p->zc = v->direct && zero_copy_ok(v, dst, dst_stride);
    int rc = ctx_get(v, &p->x);
    if (rc < 0)
        goto fail;
    if (v->backend == KD_IO_THREADS) {
        if ((rc = pool_submit(v, p)) < 0)
            goto fail;
        p->how = PENDING_POOL;
        return 0;
    }
#ifdef KD_HAVE_LIBURING
    if (v->backend == KD_IO_URING) {
        if (!p->zc && v->direct &&
            (rc = ctx_bounce(v, p->x, (size_t)v->inflight * v->slot_bytes)) < 0)
            goto fail;
        uring_start(v, p);
        p->how = PENDING_URING;
        return 0;
    }
#endif
    /* pread: the baseline reads synchronously, one record at a time. */
    if (!p->zc && v->direct && (rc = ctx_bounce(v, p->x, v->max_span)) < 0)
        goto fail;
    p->err = read_rows_sync(v, rows, n, dst, dst_stride, p->zc, p->x->bounce, &p->c);
    p->c.wait_ns = kd_now_ns() - t0;
    return 0;
fail:
    if (p->x)
        ctx_put(v, p->x);
    free(p);
    *out = NULL;
    return rc;
}

int kd_vecio_complete(struct kd_vecio_pending *p, struct kd_io_counters *c)
{
    if (!p)
        return 0;
    struct kd_vecio *v = p->v;
    uint64_t t0 = kd_now_ns();
    int rc = p->err, broken = 0;
    if (p->how == PENDING_POOL)
        rc = pool_finish(v, p);
#ifdef KD_HAVE_LIBURING
    else if (p->how == PENDING_URING)
        rc = uring_finish(v, p, &broken);
#endif
    if (p->x) {
        if (broken)
            ctx_destroy(p->x);
        else
            ctx_put(v, p->x);
    }
    if (c) {
        c->read_ops += p->c.read_ops;
        c->read_bytes += p->c.read_bytes;
        c->wait_ns += p->c.wait_ns + (kd_now_ns() - t0);
    }
    free(p);
    return rc;
}

int kd_vecio_read(struct kd_vecio *v, const uint64_t *rows, size_t n,
                  void *dst, size_t dst_stride, struct kd_io_counters *c)
{
    uint64_t t0 = kd_now_ns();
    struct kd_io_counters local = { 0, 0, 0 };
    struct kd_vecio_pending *p;
    int rc = kd_vecio_submit(v, rows, n, dst, dst_stride, &p);
    if (rc == 0)
        rc = kd_vecio_complete(p, &local);
    local.wait_ns = kd_now_ns() - t0;
    if (c)
        *c = local;
    return rc;
}

int kd_vecio_read_range(struct kd_vecio *v, uint64_t first, uint64_t n,
                        void *dst, struct kd_io_counters *c)
{
    struct kd_io_counters local = { 0, 0, 0 };
    uint64_t t0 = kd_now_ns();
    char *bounce = NULL;
    int rc = 0;

    if (n == 0)
        goto out;
    if (!v || !dst) {
        rc = kd_fail(-EINVAL, "kd_vecio_read_range: NULL argument");
        goto out;
    }
    if (first >= v->count || n > v->count - first) {
        rc = kd_fail(-EINVAL, "records [%llu, %llu) are out of range: %s holds %llu records",
                     (unsigned long long)first, (unsigned long long)(first + n), v->path,
                     (unsigned long long)v->count);
        goto out;
    }

    char *out = dst;
    uint64_t abs = v->offset + first * v->stride;
    /* The last record may end the file, so only its payload must arrive. */
    uint64_t need_total = (n - 1) * v->stride + v->record_bytes;

    if (v->backend == KD_IO_MMAP) {
        memcpy(out, v->map + (abs - v->map_off), need_total);
        local.read_ops = n;
        local.read_bytes = need_total;
        goto out;
    }

    uint64_t a = v->read_align;
    uint64_t chunk = KD_RANGE_CHUNK >= a ? round_down(KD_RANGE_CHUNK, a) : a;
    uint64_t pos = 0;
    if (a == 1 || ((uintptr_t)out % v->buf_align == 0 && abs % a == 0)) {
        /* Straight into dst, never writing past its n*stride bytes. */
        uint64_t direct_len = a == 1 ? need_total
                                     : min_u64(round_down(n * v->stride, a),
                                               kd_round_up(need_total, a));
        while (pos < direct_len) {
            struct kd_req r = {
                .row = first + pos / v->stride, .buf = out + pos, .off = abs + pos,
                .len = (uint32_t)min_u64(chunk, direct_len - pos),
            };
            r.need = (uint32_t)min_u64(r.len, need_total - pos);
            if ((rc = req_pread(v, &r, &local)) < 0)
                goto out;
            pos += r.len;
        }
    }
    if (pos < need_total) {
        /* Unaligned dst or offset, or the tail of an aligned range. */
        uint64_t piece = min_u64(chunk, need_total - pos);
        size_t bsize = (size_t)kd_round_up(piece, a) + 2 * a;
        bounce = kd_alloc_aligned(v->buf_align, bsize);
        if (!bounce) {
            rc = kd_fail(-ENOMEM, "out of memory for a %zu-byte bounce buffer reading %s",
                         bsize, v->path);
            goto out;
        }
        while (pos < need_total) {
            uint64_t p = abs + pos, len = min_u64(piece, need_total - pos);
            uint64_t start = round_down(p, a), end = kd_round_up(p + len, a);
            struct kd_req r = {
                .row = first + pos / v->stride, .buf = bounce, .off = start,
                .len = (uint32_t)(end - start), .need = (uint32_t)(p - start + len),
            };
            if ((rc = req_pread(v, &r, &local)) < 0)
                goto out;
            memcpy(out + pos, bounce + (p - start), len);
            pos += len;
        }
    }

out:
    kd_free_aligned(bounce);
    local.wait_ns = kd_now_ns() - t0;
    if (c)
        *c = local;
    return rc;
}

/* ------------------------------------------------------------------ */
/* Streaming                                                           */

#define KD_STREAM_BUFS 3
#define KD_STREAM_PIECE (1u << 20)   /* io_uring splits a chunk into reads of this */

struct kd_stream_buf {
    char *data;
    uint64_t first, rows;    /* the chunk it holds; rows == 0: none */
    unsigned pending;        /* io_uring pieces still in flight */
    int ready, err;          /* reader thread: chunk complete / its error */
};

struct kd_vecio_stream {
    struct kd_vecio *v;
    uint64_t end, next_issue;   /* records [next_issue, end) are not yet requested */
    uint64_t chunk_rows;
    unsigned head;              /* buffer holding the next chunk, in order */
    int handed;                 /* the buffer before head is with the consumer */
    struct kd_stream_buf buf[KD_STREAM_BUFS];
    uint64_t ops, bytes;        /* counted as reads complete or are issued */
    uint64_t told_ops, told_bytes; /* already added to a caller's counters */
    char errmsg[KD_ERRMSG_LEN];
#ifdef KD_HAVE_LIBURING
    int use_ring;
    struct io_uring ring;
#endif
    int use_thread;             /* otherwise: a reader thread and a lock */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, reader_done;
};

/* Bytes of a chunk that must arrive: the last record of the section may end
 * the file, so only its payload counts. */
static inline uint64_t chunk_need(const struct kd_vecio *v, uint64_t rows)
{
    return (rows - 1) * v->stride + v->record_bytes;
}

static void stream_assign(struct kd_vecio_stream *s, struct kd_stream_buf *b)
{
    b->first = s->next_issue;
    b->rows = min_u64(s->chunk_rows, s->end - s->next_issue);
    b->ready = b->err = 0;
    s->next_issue += b->rows;
}

#ifdef KD_HAVE_LIBURING
/* User data of a piece: buffer index and piece number. */
#define PIECE_DATA(bi, k) ((void *)(uintptr_t)(((uint64_t)(k) << 8) | (bi)))

static int stream_ring_issue(struct kd_vecio_stream *s, unsigned bi)
{
    struct kd_vecio *v = s->v;
    struct kd_stream_buf *b = &s->buf[bi];
    stream_assign(s, b);
    uint64_t off = v->offset + b->first * v->stride;
    uint64_t total = kd_round_up(chunk_need(v, b->rows), v->read_align);
    for (uint64_t pos = 0, k = 0; pos < total; pos += KD_STREAM_PIECE, k++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
        if (!sqe) {
            io_uring_submit(&s->ring);
            if (!(sqe = io_uring_get_sqe(&s->ring)))
                return kd_fail(-EBUSY, "io_uring queue full streaming %s", v->path);
        }
        unsigned len = (unsigned)min_u64(KD_STREAM_PIECE, total - pos);
        io_uring_prep_read(sqe, v->fd, b->data + pos, len, off + pos);
        io_uring_sqe_set_data(sqe, PIECE_DATA(bi, k));
        b->pending++;
        s->ops++;
        s->bytes += len;
    }
    int rc = io_uring_submit(&s->ring);
    return rc < 0 ? kd_fail(rc, "io_uring submit failed streaming %s", v->path) : 0;
}

/* Reap completions (of any buffer) until buffer bi is complete. */
static int stream_ring_wait(struct kd_vecio_stream *s, unsigned bi)
{
    struct kd_vecio *v = s->v;
    while (s->buf[bi].pending) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&s->ring, &cqe);
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
            b->err = -EIO;   /* short read before the records' end */
        b->pending--;
        io_uring_cqe_seen(&s->ring, cqe);
    }
    struct kd_stream_buf *b = &s->buf[bi];
    if (b->err)
        return kd_fail(b->err, "reading records %llu.. of %s: %s",
                       (unsigned long long)b->first, v->path, errstr(-b->err));
    return 0;
}
#endif

static void *stream_reader(void *arg)
{
    struct kd_vecio_stream *s = arg;
    for (unsigned i = 0;; i = (i + 1) % KD_STREAM_BUFS) {
        struct kd_stream_buf *b = &s->buf[i];
        pthread_mutex_lock(&s->mu);
        while (!s->stop && b->ready)     /* still with the consumer or unread */
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop || s->next_issue >= s->end) {
            s->reader_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        stream_assign(s, b);
        pthread_mutex_unlock(&s->mu);
        struct kd_io_counters c = { 0, 0, 0 };
        int err = kd_vecio_read_range(s->v, b->first, b->rows, b->data, &c);
        pthread_mutex_lock(&s->mu);
        s->ops += c.read_ops;
        s->bytes += c.read_bytes;
        b->err = err;
        b->ready = 1;
        if (err) {
            snprintf(s->errmsg, sizeof s->errmsg, "%s", kd_last_error());
            s->reader_done = 1;
        }
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (err)
            return NULL;
    }
}

int kd_vecio_stream_open(struct kd_vecio *v, uint64_t first, uint64_t n,
                         struct kd_vecio_stream **out)
{
    if (first > v->count || n > v->count - first)
        return kd_fail(-EINVAL, "records [%llu, %llu) are out of range: %s holds %llu records",
                       (unsigned long long)first, (unsigned long long)(first + n), v->path,
                       (unsigned long long)v->count);
    struct kd_vecio_stream *s = calloc(1, sizeof *s);
    if (!s)
        return kd_fail(-ENOMEM, "out of memory for a stream of %s", v->path);
    s->v = v;
    s->next_issue = first;
    s->end = first + n;
    s->chunk_rows = KD_RANGE_CHUNK / v->stride ? KD_RANGE_CHUNK / v->stride : 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    size_t size = (size_t)kd_round_up(s->chunk_rows * v->stride, 4096) + 4096;
    size_t align = v->buf_align > 4096 ? v->buf_align : 4096;
    int err = 0;
    for (int i = 0; i < KD_STREAM_BUFS && !err; i++)
        if (!(s->buf[i].data = kd_alloc_aligned(align, size)))
            err = kd_fail(-ENOMEM, "out of memory for stream buffers of %s", v->path);
    if (err || n == 0)
        goto done;
#ifdef KD_HAVE_LIBURING
    /* Offsets and buffers are aligned, so pieces go straight in. */
    if (v->backend == KD_IO_URING && (v->offset + first * v->stride) % v->read_align == 0 &&
        (s->chunk_rows * v->stride) % v->read_align == 0 &&
        io_uring_queue_init(KD_STREAM_BUFS * (KD_RANGE_CHUNK / KD_STREAM_PIECE + 2), &s->ring,
                            0) == 0) {
        s->use_ring = 1;
        for (unsigned i = 0; i < KD_STREAM_BUFS && s->next_issue < s->end && !err; i++)
            err = stream_ring_issue(s, i);
        goto done;
    }
#endif
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, stream_reader, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc)
        err = kd_fail(-rc, "cannot start a reader thread for %s", v->path);
    else
        s->use_thread = 1;
done:
    if (err) {
        kd_vecio_stream_close(s);
        return err;
    }
    *out = s;
    return 0;
}

int64_t kd_vecio_stream_next(struct kd_vecio_stream *s, const void **buf, uint64_t *first_row,
                             struct kd_io_counters *c)
{
    uint64_t t0 = kd_now_ns();
    int64_t rc = 0;
    unsigned i = s->head, prev = (i + KD_STREAM_BUFS - 1) % KD_STREAM_BUFS;
    struct kd_stream_buf *b = &s->buf[i];
#ifdef KD_HAVE_LIBURING
    if (s->use_ring) {
        if (s->handed && s->next_issue < s->end && (rc = stream_ring_issue(s, prev)) < 0)
            goto out;
        s->handed = 0;
        if (b->rows == 0 || (rc = stream_ring_wait(s, i)) < 0)
            goto out;
        goto hand;
    }
#endif
    if (!s->use_thread)
        goto out;
    pthread_mutex_lock(&s->mu);
    if (s->handed) {
        s->buf[prev].ready = 0;   /* back to the reader */
        pthread_cond_broadcast(&s->cv);
    }
    s->handed = 0;
    while (!b->ready && !s->reader_done)
        pthread_cond_wait(&s->cv, &s->mu);
    int ready = b->ready, err = b->err;
    pthread_mutex_unlock(&s->mu);
    if (!ready)
        goto out;
    if (err) {
        kd_set_error_text(s->errmsg);
        rc = err;
        goto out;
    }
hand: __attribute__((unused));
    *buf = b->data;
    *first_row = b->first;
    rc = (int64_t)b->rows;
    b->rows = 0;
    s->head = (i + 1) % KD_STREAM_BUFS;
    s->handed = 1;
out:
    pthread_mutex_lock(&s->mu);
    if (c) {
        c->read_ops += s->ops - s->told_ops;
        c->read_bytes += s->bytes - s->told_bytes;
        c->wait_ns += kd_now_ns() - t0;
    }
    s->told_ops = s->ops;
    s->told_bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void kd_vecio_stream_close(struct kd_vecio_stream *s)
{
    if (!s)
        return;
    if (s->use_thread) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
#ifdef KD_HAVE_LIBURING
    if (s->use_ring) {
        /* Reads may still target our buffers: drain them before freeing. */
        for (unsigned i = 0; i < KD_STREAM_BUFS; i++)
            while (s->buf[i].pending) {
                struct io_uring_cqe *cqe;
                if (io_uring_wait_cqe(&s->ring, &cqe) < 0)
                    break;
                s->buf[(uintptr_t)io_uring_cqe_get_data(cqe) & 0xff].pending--;
                io_uring_cqe_seen(&s->ring, cqe);
            }
        io_uring_queue_exit(&s->ring);
    }
#endif
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    for (int i = 0; i < KD_STREAM_BUFS; i++)
        kd_free_aligned(s->buf[i].data);
    free(s);
}

/* vecio.c — batch reads of fixed-stride vector records (see vecio.h).
 *
 * Every record read is described by a struct kd_req: a file range to read
 * into a buffer, the number of leading bytes that must arrive (`need`; the
 * rest may lie past EOF), and where to copy the record when the range was read
 * into a bounce buffer. The backends differ only in how they issue requests
 * (vecio_backend.h: struct kd_vecio_ops). This file opens the handle, probes
 * the alignment, decides the fallbacks and the backend, lays out the bounce
 * slots, keeps the callers' contexts and the counters, and dispatches each
 * batch to the backend's table. */
#include "vecio_backend.h"

#include <sys/vfs.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

/* The backends, by enum kd_io_backend; NULL: not in this build. */
static const struct kd_vecio_ops *const backends[] = {
#ifdef KD_HAVE_LIBURING
    [KD_IO_URING] = &kd_uring_ops,
#endif
    [KD_IO_THREADS] = &kd_threads_ops,
    [KD_IO_PREAD] = &kd_pread_ops,
    [KD_IO_MMAP] = &kd_mmap_ops,
};

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* strerror for messages, safe with many reading threads (GNU strerror_r). */
const char *kd_errstr(int err)
{
    static _Thread_local char buf[128];
    return strerror_r(err, buf, sizeof buf);
}

/* Environment switches for tests: pretend a kernel feature is unavailable. */
int kd_env_disabled(const char *name)
{
    const char *e = getenv(name);
    return e && e[0] && strcmp(e, "0") != 0;
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
    struct {
        int64_t sec;
        uint32_t nsec;
        int32_t pad;
    } atime, btime, ctime, mtime;
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
        "/sys/dev/block/%u:%u/../queue/logical_block_size", /* partition */
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
        return kd_fail(-e, "cannot stat %s: %s", v->path, kd_errstr(e));
    }
    if (S_ISDIR(st.st_mode))
        return kd_fail(-EISDIR, "%s is a directory, not a vector file", v->path);
    int is_blk = S_ISBLK(st.st_mode);
    v->file_size = (uint64_t)st.st_size;
    if (is_blk) {
        uint64_t sz = 0;
        if (ioctl(v->fd, BLKGETSIZE64, &sz) != 0) {
            int e = errno;
            return kd_fail(-e, "cannot get the size of block device %s: %s", v->path, kd_errstr(e));
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

int kd_req_eof(const struct kd_vecio *v, const struct kd_req *r)
{
    return kd_fail(-EIO,
                   "unexpected end of file reading record %llu at offset %llu of %s "
                   "(got %u of %u bytes; did the file shrink?)",
                   (unsigned long long)r->row, (unsigned long long)r->off, v->path, r->done,
                   r->need);
}

int kd_req_error(const struct kd_vecio *v, const struct kd_req *r, int err)
{
    return kd_fail(err, "read of record %llu (file offset %llu, %u bytes) from %s failed: %s",
                   (unsigned long long)r->row, (unsigned long long)(r->off + r->done),
                   r->len - r->done, v->path, kd_errstr(-err));
}

/* Synchronous read of one request, retrying short reads. */
int kd_req_pread(const struct kd_vecio *v, struct kd_req *r, struct kd_io_counters *c)
{
    for (;;) {
        uint32_t want = req_issue(r, c);
        ssize_t got = pread(v->fd, r->buf + r->done, want, (off_t)(r->off + r->done));
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return kd_req_error(v, r, -errno);
        }
        if ((got = (ssize_t)kd_fault(0, got)) < 0) /* tests only */
            return kd_req_error(v, r, (int)got);
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
int kd_read_rows_sync(const struct kd_vecio *v, const uint64_t *rows, size_t n, char *dst,
                      size_t dst_stride, int zc, char *bounce, struct kd_io_counters *c)
{
    for (size_t i = 0; i < n; i++) {
        struct kd_req r;
        req_init(v, &r, rows[i], dst + i * dst_stride, dst_stride, zc, bounce);
        int rc = kd_req_pread(v, &r, c);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Records [first, first+n) into dst in large preads (every backend but mmap). */
int kd_read_range_pread(struct kd_vecio *v, uint64_t first, uint64_t n, char *dst,
                        struct kd_io_counters *c)
{
    uint64_t abs = v->offset + first * v->stride;
    uint64_t need_total = chunk_need(v, n);
    uint64_t a = v->read_align;
    uint64_t chunk = KD_RANGE_CHUNK >= a ? round_down(KD_RANGE_CHUNK, a) : a;
    uint64_t pos = 0;
    char *bounce = NULL;
    int rc = 0;

    if (a == 1 || ((uintptr_t)dst % v->buf_align == 0 && abs % a == 0)) {
        /* Straight into dst, never writing past its n*stride bytes. */
        uint64_t direct_len = a == 1 ? need_total
                                     : min_u64(round_down(n * v->stride, a),
                                               kd_round_up(need_total, a));
        while (pos < direct_len) {
            struct kd_req r = {
                .row = first + pos / v->stride,
                .buf = dst + pos,
                .off = abs + pos,
                .len = (uint32_t)min_u64(chunk, direct_len - pos),
            };
            r.need = (uint32_t)min_u64(r.len, need_total - pos);
            if ((rc = kd_req_pread(v, &r, c)) < 0)
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
            rc = kd_fail(-ENOMEM, "out of memory for a %zu-byte bounce buffer reading %s", bsize,
                         v->path);
            goto out;
        }
        while (pos < need_total) {
            uint64_t p = abs + pos, len = min_u64(piece, need_total - pos);
            uint64_t start = round_down(p, a), end = kd_round_up(p + len, a);
            struct kd_req r = {
                .row = first + pos / v->stride,
                .buf = bounce,
                .off = start,
                .len = (uint32_t)(end - start),
                .need = (uint32_t)(p - start + len),
            };
            if ((rc = kd_req_pread(v, &r, c)) < 0)
                goto out;
            memcpy(dst + pos, bounce + (p - start), len);
            pos += len;
        }
    }
out:
    kd_free_aligned(bounce);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Caller contexts                                                     */

void kd_caller_destroy(struct kd_vecio *v, struct kd_caller_ctx *x)
{
    if (!x)
        return;
    if (v->ops->ctx_fini)
        v->ops->ctx_fini(v, x);
    kd_free_aligned(x->bounce);
    free(x);
}

int kd_caller_new(struct kd_vecio *v, struct kd_caller_ctx **out)
{
    struct kd_caller_ctx *x = calloc(1, sizeof *x + v->ops->ctx_size);
    if (!x)
        return kd_fail(-ENOMEM, "out of memory for an I/O context on %s", v->path);
    if (v->ops->ctx_init) {
        int rc = v->ops->ctx_init(v, x);
        if (rc < 0) {
            free(x); /* ctx_init cleans up after itself */
            return rc;
        }
    }
    *out = x;
    return 0;
}

static int caller_get(struct kd_vecio *v, struct kd_caller_ctx **out)
{
    pthread_mutex_lock(&v->ctx_mu);
    struct kd_caller_ctx *x = v->free_ctx;
    if (x)
        v->free_ctx = x->next;
    pthread_mutex_unlock(&v->ctx_mu);
    if (x) {
        *out = x;
        return 0;
    }
    return kd_caller_new(v, out);
}

void kd_caller_put(struct kd_vecio *v, struct kd_caller_ctx *x)
{
    pthread_mutex_lock(&v->ctx_mu);
    x->next = v->free_ctx;
    v->free_ctx = x;
    pthread_mutex_unlock(&v->ctx_mu);
}

static int caller_bounce(const struct kd_vecio *v, struct kd_caller_ctx *x, size_t size)
{
    if (x->bounce_size >= size)
        return 0;
    kd_free_aligned(x->bounce);
    x->bounce_size = 0;
    x->bounce = kd_alloc_aligned(v->buf_align, size);
    if (!x->bounce)
        return kd_fail(-ENOMEM, "out of memory for a %zu-byte bounce buffer reading %s", size,
                       v->path);
    x->bounce_size = size;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Open / close                                                        */

static int validate_config(const struct kd_vecio_config *cfg)
{
    const char *path = cfg->path ? cfg->path : "(null)";
    if (!cfg->path || !cfg->path[0])
        return kd_fail(-EINVAL, "vector file path is empty");
    if (cfg->record_bytes == 0)
        return kd_fail(-EINVAL, "record_bytes must be > 0 for %s", path);
    if (cfg->stride < cfg->record_bytes)
        return kd_fail(-EINVAL, "stride %u is smaller than record_bytes %u for %s", cfg->stride,
                       cfg->record_bytes, path);
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
    if (want_direct && !kd_env_disabled("KNNDIRECT_DISABLE_DIRECT_IO") && !memory_backed(v->path)) {
        v->fd = open(v->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (v->fd >= 0) {
            v->direct = 1;
            return 0;
        }
        int e = errno;
        if (e != EINVAL)
            return kd_fail(-e, "cannot open %s with O_DIRECT: %s", v->path, kd_errstr(e));
    }
    v->fd = open(v->path, O_RDONLY | O_CLOEXEC);
    if (v->fd < 0) {
        int e = errno;
        return kd_fail(-e, "cannot open %s: %s", v->path, kd_errstr(e));
    }
    if (want_direct) {
        v->fallbacks |= KD_FALLBACK_NO_DIRECT;
        posix_fadvise(v->fd, 0, 0, POSIX_FADV_RANDOM); /* best effort */
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
    return kd_fail(-e, "probe read of %s with O_DIRECT failed: %s", v->path, kd_errstr(e));
}

/* Decide the backend and open it: io_uring when asked or automatic (its open
 * creates the first ring, a real one of the size reads will use, so a ring
 * the kernel refuses means threads), else the one asked for. Sets v->ops. */
static int select_backend(struct kd_vecio *v, int asked)
{
    if (asked == KD_IO_AUTO || asked == KD_IO_URING) {
        int err;
        char why[KD_ERRMSG_LEN];
        if (!backends[KD_IO_URING]) {
            err = -ENOSYS;
            snprintf(why, sizeof why, "this build has no io_uring support (liburing not found)");
        } else if (kd_env_disabled("KNNDIRECT_DISABLE_IO_URING")) {
            err = -ENOSYS;
            snprintf(why, sizeof why, "disabled by KNNDIRECT_DISABLE_IO_URING");
        } else {
            v->backend = KD_IO_URING;
            v->ops = backends[KD_IO_URING];
            err = v->ops->open(v);
            if (err == 0)
                return 0;
            snprintf(why, sizeof why, "%s", kd_last_error());
            v->ops->close(v);
        }
        if (asked == KD_IO_URING)
            return kd_fail(err,
                           "io_uring backend requested for %s but io_uring is "
                           "unavailable: %s",
                           v->path, why);
        asked = KD_IO_THREADS;
        v->fallbacks |= KD_FALLBACK_NO_URING;
    }
    v->backend = asked;
    v->ops = backends[asked];
    return v->ops->open ? v->ops->open(v) : 0;
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
        rc = kd_fail(-EINVAL,
                     "%s holds %llu bytes but the section needs %llu "
                     "(offset %llu + %llu records of stride %u)",
                     v->path, (unsigned long long)v->file_size, (unsigned long long)need,
                     (unsigned long long)v->offset, (unsigned long long)v->count, v->stride);
        goto fail;
    }

    v->max_span = v->direct ? kd_round_up(v->record_bytes, v->read_align) + v->read_align
                            : v->record_bytes;
    v->slot_bytes = kd_round_up(v->max_span, v->buf_align);
    v->bounce_bytes = v->max_span;
    v->inflight = cfg->io_depth < KD_MAX_RING ? cfg->io_depth : KD_MAX_RING;

    if ((rc = select_backend(v, cfg->backend)) < 0)
        goto fail;
    *out = v;
    return 0;

fail : {
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
    if (v->ops && v->ops->close)
        v->ops->close(v);
    while (v->free_ctx) {
        struct kd_caller_ctx *x = v->free_ctx;
        v->free_ctx = x->next;
        kd_caller_destroy(v, x);
    }
    if (v->ctx_mu_ok)
        pthread_mutex_destroy(&v->ctx_mu);
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

uint32_t kd_vecio_buffer_alignment(const struct kd_vecio *v) { return v->buf_align; }

const char *kd_io_backend_name(int backend)
{
    switch (backend) {
    case KD_IO_AUTO:
        return "auto";
    case KD_IO_URING:
        return "io_uring";
    case KD_IO_THREADS:
        return "threads";
    case KD_IO_PREAD:
        return "pread";
    case KD_IO_MMAP:
        return "mmap";
    default:
        return "unknown";
    }
}

int kd_vecio_have_uring(void) { return backends[KD_IO_URING] != NULL; }

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
                           (unsigned long long)rows[i], i, v->path, (unsigned long long)v->count);
    const struct kd_vecio_ops *ops = v->ops;
    struct kd_vecio_pending *p = calloc(1, sizeof *p + ops->pending_size);
    if (!p)
        return kd_fail(-ENOMEM, "out of memory for a read batch on %s", v->path);
    p->v = v;
    p->rows = rows;
    p->n = n;
    p->dst = dst;
    p->dst_stride = dst_stride;
    *out = p;
    if (n == 0)
        return 0;
    uint64_t t0 = kd_now_ns(); /* synchronous backends wait here, not in complete */
    p->zc = v->direct && zero_copy_ok(v, dst, dst_stride);
    int rc = 0;
    if (ops->ctx_size || (!p->zc && v->direct)) {
        if ((rc = caller_get(v, &p->x)) < 0)
            goto fail;
        if (!p->zc && v->direct && (rc = caller_bounce(v, p->x, v->bounce_bytes)) < 0)
            goto fail;
    }
    if ((rc = ops->submit(v, p)) < 0)
        goto fail;
    if (!ops->complete)
        p->c.wait_ns = kd_now_ns() - t0;
    return 0;
fail:
    if (p->x)
        kd_caller_put(v, p->x);
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
    int rc = p->err;
    if (p->n && v->ops->complete)
        rc = v->ops->complete(v, p);
    if (p->x) {
        if (p->broken)
            kd_caller_destroy(v, p->x);
        else
            kd_caller_put(v, p->x);
    }
    if (c) {
        p->c.wait_ns += kd_now_ns() - t0;
        io_add(c, &p->c);
    }
    free(p);
    return rc;
}

int kd_vecio_read(struct kd_vecio *v, const uint64_t *rows, size_t n, void *dst, size_t dst_stride,
                  struct kd_io_counters *c)
{
    uint64_t t0 = kd_now_ns();
    struct kd_io_counters local = {0, 0, 0};
    struct kd_vecio_pending *p;
    int rc = kd_vecio_submit(v, rows, n, dst, dst_stride, &p);
    if (rc == 0)
        rc = kd_vecio_complete(p, &local);
    local.wait_ns = kd_now_ns() - t0;
    if (c)
        *c = local;
    return rc;
}

int kd_vecio_read_range(struct kd_vecio *v, uint64_t first, uint64_t n, void *dst,
                        struct kd_io_counters *c)
{
    struct kd_io_counters local = {0, 0, 0};
    uint64_t t0 = kd_now_ns();
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
    rc = v->ops->read_range(v, first, n, dst, &local);
out:
    local.wait_ns = kd_now_ns() - t0;
    if (c)
        *c = local;
    return rc;
}

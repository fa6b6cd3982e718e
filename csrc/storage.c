#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sync_file_range */
#endif
#include "storage.h"
#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define MAX_SYSCALL_BYTES (1u << 30)

/* ---- file descriptor writer */

static int fd_write(void *ctx, const void *buf, size_t n)
{
    struct kd_fd_writer *w = ctx;
    const char *p = buf;
    while (n > 0) {
        ssize_t r = write(w->fd, p, n > MAX_SYSCALL_BYTES ? MAX_SYSCALL_BYTES : n);
        if (r >= 0 && (r = (ssize_t)kd_fault(1, r)) < 0) { /* tests only */
            errno = (int)-r;
            r = -1;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            return kd_fail(-e, "writing %s: %s", w->path, strerror(e));
        }
        if (r == 0)
            return kd_fail(-EIO, "writing %s: the write made no progress", w->path);
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

void kd_fd_writer_init(struct kd_writer *w, struct kd_fd_writer *ctx, int fd, const char *path)
{
    ctx->fd = fd;
    ctx->path = path;
    w->write = fd_write;
    w->close = NULL;
    w->ctx = ctx;
}

/* ---- memory writer */

static int mem_write(void *ctx, const void *buf, size_t n)
{
    struct kd_mem_writer *m = ctx;
    if (n > SIZE_MAX - m->size)
        return kd_fail(-ENOMEM, "out of memory while serializing the index");
    if (m->size + n > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < m->size + n)
            cap = cap > SIZE_MAX / 2 ? m->size + n : cap * 2;
        uint8_t *d = realloc(m->data, cap);
        if (!d)
            return kd_fail(-ENOMEM, "out of memory while serializing the index");
        m->data = d;
        m->cap = cap;
    }
    memcpy(m->data + m->size, buf, n);
    m->size += n;
    return 0;
}

static int mem_close(void *ctx, int commit)
{
    struct kd_mem_writer *m = ctx;
    if (!commit) {
        free(m->data);
        memset(m, 0, sizeof *m);
    }
    return 0;
}

void kd_mem_writer_init(struct kd_writer *w, struct kd_mem_writer *ctx)
{
    memset(ctx, 0, sizeof *ctx);
    w->write = mem_write;
    w->close = mem_close;
    w->ctx = ctx;
}

/* ---- atomic path writer */

static void dir_of(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, len, ".");
    else if (slash == path)
        snprintf(dir, len, "/");
    else
        snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

static void path_writer_release(struct kd_path_writer *pw)
{
    free(pw->path);
    free(pw->tmp);
    pw->path = pw->tmp = NULL;
    pw->fd = -1;
}

static int path_close(void *ctx, int commit)
{
    struct kd_path_writer *pw = ctx;
    int err = 0;
    if (commit && fsync(pw->fd) != 0) {
        int e = errno;
        err = kd_fail(-e, "fsync of %s failed: %s", pw->path, strerror(e));
    }
    if (close(pw->fd) != 0 && commit && !err) {
        int e = errno;
        err = kd_fail(-e, "closing %s failed: %s", pw->path, strerror(e));
    }
    if (commit && !err && rename(pw->tmp, pw->path) != 0) {
        int e = errno;
        err = kd_fail(-e, "cannot rename the temporary file to %s: %s", pw->path, strerror(e));
    }
    if (!commit || err) {
        unlink(pw->tmp);
    } else {
        /* Make the rename itself durable. */
        size_t len = strlen(pw->path) + 2;
        char *dir = malloc(len);
        if (dir) {
            dir_of(pw->path, dir, len);
            int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                fsync(dfd);
                close(dfd);
            }
            free(dir);
        }
    }
    path_writer_release(pw);
    return err;
}

/* A save writes the whole file through the page cache; under a memory cap
 * (a cgroup counts dirty pages, and v1 does not throttle them) gigabytes of
 * dirty pages get the writer killed. So every few MiB the part written is
 * pushed to disk and dropped from the cache: the file costs no memory. */
#define KD_WRITEBACK_STEP (16u << 20)

static int path_write(void *ctx, const void *buf, size_t n)
{
    struct kd_path_writer *pw = ctx;
    int err = fd_write(&pw->fdw, buf, n);
    if (err)
        return err;
    pw->written += n;
    if (pw->written - pw->flushed >= KD_WRITEBACK_STEP) {
        off_t off = (off_t)pw->flushed, len = (off_t)(pw->written - pw->flushed);
        /* Advice only: a failure here is found again by the fsync at close. */
        if (sync_file_range(pw->fd, off, len,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) == 0)
            posix_fadvise(pw->fd, off, len, POSIX_FADV_DONTNEED);
        pw->flushed = pw->written;
    }
    return 0;
}

int kd_path_writer_open(struct kd_writer *w, struct kd_path_writer *pw, const char *path)
{
    memset(pw, 0, sizeof *pw);
    pw->fd = -1;
    struct stat st;
    int have_target = stat(path, &st) == 0;
    if (have_target && S_ISDIR(st.st_mode))
        return kd_fail(-EISDIR, "cannot save to %s: it is a directory", path);
    /* Renaming over a device, pipe or socket would replace it with a file. */
    if (have_target && !S_ISREG(st.st_mode))
        return kd_fail(-EINVAL,
                       "cannot save to %s: it is not a regular file (a device, pipe "
                       "or socket); write to it through a file object instead",
                       path);
    size_t len = strlen(path) + 64;
    pw->path = strdup(path);
    pw->tmp = malloc(len);
    if (!pw->path || !pw->tmp) {
        path_writer_release(pw);
        return kd_fail(-ENOMEM, "out of memory");
    }
    for (int attempt = 0; attempt < 100 && pw->fd < 0; attempt++) {
        snprintf(pw->tmp, len, "%s.tmp-%ld-%llx", path, (long)getpid(),
                 (unsigned long long)(kd_now_ns() + (uint64_t)attempt));
        pw->fd = open(pw->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (pw->fd < 0 && errno != EEXIST)
            break;
    }
    if (pw->fd < 0) {
        int e = errno;
        path_writer_release(pw);
        return kd_fail(-e, "cannot create a temporary file beside %s: %s", path, strerror(e));
    }
    /* Replacing a file keeps its permission bits. */
    if (have_target && S_ISREG(st.st_mode))
        fchmod(pw->fd, st.st_mode & 07777);
    kd_fd_writer_init(w, &pw->fdw, pw->fd, pw->path);
    w->write = path_write;
    w->close = path_close;
    w->ctx = pw;
    return 0;
}

int kd_save_atomic(const char *path, kd_emit_fn emit, void *arg)
{
    struct kd_writer w;
    struct kd_path_writer pw;
    int err = kd_path_writer_open(&w, &pw, path);
    if (err)
        return err;
    err = emit(arg, &w);
    char msg[KD_ERRMSG_LEN];
    if (err)
        snprintf(msg, sizeof msg, "%s", kd_last_error());
    int cerr = kd_writer_close(&w, !err);
    if (err) {
        kd_set_error_text(msg);
        return err;
    }
    return cerr;
}

/* ---- file reader */

static int64_t fd_read(void *ctx, void *buf, size_t n)
{
    struct kd_fd_reader *r = ctx;
    for (;;) {
        ssize_t got = read(r->fd, buf, n > MAX_SYSCALL_BYTES ? MAX_SYSCALL_BYTES : n);
        if (got >= 0)
            return got;
        if (errno == EINTR)
            continue;
        int e = errno;
        return kd_fail(-e, "reading %s: %s", r->path, strerror(e));
    }
}

static void fd_close(void *ctx)
{
    struct kd_fd_reader *r = ctx;
    if (r->owns && r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

void kd_fd_reader_init(struct kd_reader *r, struct kd_fd_reader *ctx, int fd, const char *path)
{
    ctx->fd = fd;
    ctx->owns = 0;
    ctx->path = path;
    r->read = fd_read;
    r->close = fd_close;
    r->ctx = ctx;
    r->size = KD_SIZE_UNKNOWN;
    r->whole = 0;
}

int kd_fd_reader_open(struct kd_reader *r, struct kd_fd_reader *ctx, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return kd_fail(-e, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kd_fail(-e, "cannot stat %s: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return kd_fail(-EISDIR, "%s is a directory, not an index file", path);
    }
    kd_fd_reader_init(r, ctx, fd, path);
    ctx->owns = 1;
    if (S_ISREG(st.st_mode)) {
        r->size = (uint64_t)st.st_size;
        r->whole = 1;
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    return 0;
}

/* ---- memory reader */

static int64_t mem_read(void *ctx, void *buf, size_t n)
{
    struct kd_mem_reader *m = ctx;
    size_t left = m->size - m->pos;
    if (n > left)
        n = left;
    memcpy(buf, m->data + m->pos, n);
    m->pos += n;
    return (int64_t)n;
}

void kd_mem_reader_init(struct kd_reader *r, struct kd_mem_reader *ctx, const void *data,
                        size_t size)
{
    ctx->data = data;
    ctx->size = size;
    ctx->pos = 0;
    r->read = mem_read;
    r->close = NULL;
    r->ctx = ctx;
    r->size = size;
    r->whole = 1;
}

/* ---- filesystem facts */

#define TMPFS_MAGIC_ 0x01021994
#define RAMFS_MAGIC_ 0x858458f6

int kd_path_in_memory(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) != 0)
        return 0;
    return (unsigned long)sf.f_type == TMPFS_MAGIC_ || (unsigned long)sf.f_type == RAMFS_MAGIC_;
}

#include "storage.h"
#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int fd_write(void *ctx, const void *buf, size_t n)
{
    struct kd_fd_writer *w = ctx;
    const char *p = buf;
    while (n > 0) {
        ssize_t r = write(w->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            return kd_fail(-e, "writing %s: %s", w->path, strerror(e));
        }
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
    w->ctx = ctx;
}

static int mem_write(void *ctx, const void *buf, size_t n)
{
    struct kd_mem_writer *m = ctx;
    if (m->size + n > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < m->size + n)
            cap *= 2;
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

void kd_mem_writer_init(struct kd_writer *w, struct kd_mem_writer *ctx)
{
    memset(ctx, 0, sizeof *ctx);
    w->write = mem_write;
    w->ctx = ctx;
}

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

int kd_save_atomic(const char *path, kd_emit_fn emit, void *arg)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return kd_fail(-EISDIR, "cannot save to %s: it is a directory", path);

    size_t len = strlen(path) + 64;
    char *tmp = malloc(len), *dir = malloc(len);
    int fd = -1, err = 0;
    if (!tmp || !dir) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto out;
    }
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, len, "%s.tmp-%ld-%llx", path, (long)getpid(),
                 (unsigned long long)(kd_now_ns() + (uint64_t)attempt));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        int e = errno;
        err = kd_fail(-e, "cannot create a temporary file beside %s: %s", path, strerror(e));
        goto out;
    }
    struct kd_writer w;
    struct kd_fd_writer fw;
    kd_fd_writer_init(&w, &fw, fd, path);
    err = emit(arg, &w);
    if (!err && fsync(fd) != 0) {
        int e = errno;
        err = kd_fail(-e, "fsync of %s failed: %s", path, strerror(e));
    }
    if (close(fd) != 0 && !err) {
        int e = errno;
        err = kd_fail(-e, "closing %s failed: %s", path, strerror(e));
    }
    fd = -1;
    if (!err && rename(tmp, path) != 0) {
        int e = errno;
        err = kd_fail(-e, "cannot rename the temporary file to %s: %s", path, strerror(e));
    }
    if (err) {
        unlink(tmp);
        goto out;
    }
    /* Make the rename itself durable. */
    dir_of(path, dir, len);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
out:
    free(tmp);
    free(dir);
    return err;
}

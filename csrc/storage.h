/* storage.h — where an index goes to and comes from: a small writer and
 * reader interface (a vtable of write / read / close over a context), so the
 * container never knows whether bytes go to a file, a memory buffer or (in the
 * binding) a Python file-like object.
 *
 * Writing is strictly sequential (a pipe or a socket works as a target);
 * reading is strictly sequential too (a pipe works as a source). */
#ifndef KD_STORAGE_H
#define KD_STORAGE_H

#include <stddef.h>
#include <stdint.h>

/* ---- writers */

struct kd_writer {
    /* Write all n bytes, or return a negative errno. */
    int (*write)(void *ctx, const void *buf, size_t n);
    /* Finish: commit != 0 makes the result final (a path writer renames its
     * temporary file over the target), commit == 0 discards what was written
     * where that is possible. NULL when there is nothing to do. Returns 0 or
     * a negative errno. */
    int (*close)(void *ctx, int commit);
    void *ctx;
};

static inline int kd_writer_close(struct kd_writer *w, int commit)
{
    return w->close ? w->close(w->ctx, commit) : 0;
}

/* Writer over an open file descriptor (not closed by the writer). */
struct kd_fd_writer {
    int fd;
    const char *path; /* for error messages */
};
void kd_fd_writer_init(struct kd_writer *w, struct kd_fd_writer *ctx, int fd, const char *path);

/* Writer into a growing heap buffer; free `data` with free() (close with
 * commit == 0 frees it). */
struct kd_mem_writer {
    uint8_t *data;
    size_t size, cap;
};
void kd_mem_writer_init(struct kd_writer *w, struct kd_mem_writer *ctx);

/* Atomic writer to a path: bytes go to a temporary file `path.tmp-PID-N` in
 * the same directory; close(commit) fsyncs it, renames it over path and fsyncs
 * the directory; close(discard), or any failure, removes it and leaves the
 * target as it was. A process killed mid-write leaves the temporary file
 * behind (nothing can remove it), never a torn target. */
struct kd_path_writer {
    int fd;
    char *path, *tmp;
    struct kd_fd_writer fdw;
    uint64_t written, flushed; /* bytes; [0, flushed) written back and dropped */
};
int kd_path_writer_open(struct kd_writer *w, struct kd_path_writer *ctx, const char *path);

/* Atomic save to a path: emit() writes the content through the path writer. */
typedef int (*kd_emit_fn)(void *arg, struct kd_writer *w);
int kd_save_atomic(const char *path, kd_emit_fn emit, void *arg);

/* ---- readers */

#define KD_SIZE_UNKNOWN UINT64_MAX

struct kd_reader {
    /* Read up to n (> 0) bytes into buf: the count read (> 0), 0 at the end
     * of the stream, or a negative errno. */
    int64_t (*read)(void *ctx, void *buf, size_t n);
    void (*close)(void *ctx); /* may be NULL */
    void *ctx;
    uint64_t size; /* bytes left in the source when known, else KD_SIZE_UNKNOWN */
    int whole;     /* the source ends where the index ends (no trailing data) */
};

static inline void kd_reader_close(struct kd_reader *r)
{
    if (r->close)
        r->close(r->ctx);
}

/* Reader over a file: kd_fd_reader_open opens path (and closes it on
 * kd_reader_close), knows its size and reads it front to back. */
struct kd_fd_reader {
    int fd;
    int owns;
    const char *path;
};
int kd_fd_reader_open(struct kd_reader *r, struct kd_fd_reader *ctx, const char *path);
/* Over a descriptor the caller keeps open; size unknown, not whole. */
void kd_fd_reader_init(struct kd_reader *r, struct kd_fd_reader *ctx, int fd, const char *path);

/* Reader over a memory buffer the caller keeps alive. */
struct kd_mem_reader {
    const uint8_t *data;
    size_t size, pos;
};
void kd_mem_reader_init(struct kd_reader *r, struct kd_mem_reader *ctx, const void *data,
                        size_t size);

/* 1 when path lies on a filesystem held in memory (tmpfs, ramfs), where
 * O_DIRECT buys nothing. */
int kd_path_in_memory(const char *path);

#endif

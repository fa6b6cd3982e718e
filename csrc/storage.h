/* storage.h — where an index is written: a small writer interface, so the
 * container never knows whether bytes go to a file, a memory buffer or (in
 * the binding) a Python file-like object. Writing is strictly sequential. */
#ifndef KD_STORAGE_H
#define KD_STORAGE_H

#include <stddef.h>
#include <stdint.h>

struct kd_writer {
    /* Write all n bytes or return a negative errno. */
    int (*write)(void *ctx, const void *buf, size_t n);
    void *ctx;
};

/* Writer over an open file descriptor. */
struct kd_fd_writer {
    int fd;
    const char *path;   /* for error messages */
};
void kd_fd_writer_init(struct kd_writer *w, struct kd_fd_writer *ctx, int fd, const char *path);

/* Writer into a growing heap buffer (free `data` with free()). */
struct kd_mem_writer {
    uint8_t *data;
    size_t size, cap;
};
void kd_mem_writer_init(struct kd_writer *w, struct kd_mem_writer *ctx);

/* Atomic save to a path: a temporary file in the same directory is written by
 * emit(), fsynced and renamed over path; on any failure it is removed and the
 * target is left as it was. */
typedef int (*kd_emit_fn)(void *arg, struct kd_writer *w);
int kd_save_atomic(const char *path, kd_emit_fn emit, void *arg);

#endif

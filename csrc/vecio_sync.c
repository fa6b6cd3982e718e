/* vecio_sync.c — the synchronous backends, whose submit does the reads:
 * pread (the baseline: one pread per record) and mmap (copies from a
 * MADV_RANDOM mapping of the section, through the page cache). */
#include "vecio_backend.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* pread                                                               */

static int pread_submit(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    p->err = kd_read_rows_sync(v, p->rows, p->n, p->dst, p->dst_stride, p->zc,
                               p->x ? p->x->bounce : NULL, &p->c);
    return 0;
}

const struct kd_vecio_ops kd_pread_ops = {
    .submit = pread_submit,
    .read_range = kd_read_range_pread,
};

/* ------------------------------------------------------------------ */
/* mmap                                                                */

struct kd_map {
    char *base;
    size_t len;
    uint64_t off; /* file offset of base[0] */
};

/* The record at file offset abs. */
static inline const char *map_at(const struct kd_vecio *v, uint64_t abs)
{
    const struct kd_map *m = v->be;
    return m->base + (abs - m->off);
}

static int map_open(struct kd_vecio *v)
{
    if (v->count == 0)
        return 0;
    struct kd_map *m = calloc(1, sizeof *m);
    if (!m)
        return kd_fail(-ENOMEM, "out of memory opening %s", v->path);
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t page = pg > 0 ? (uint64_t)pg : 4096;
    m->off = round_down(v->offset, page);
    uint64_t len = v->offset + chunk_need(v, v->count) - m->off;
    if (len > SIZE_MAX) {
        free(m);
        return kd_fail(-EFBIG, "section of %s is too large to map", v->path);
    }
    void *base = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, v->fd, (off_t)m->off);
    if (base == MAP_FAILED) {
        int e = errno;
        free(m);
        return kd_fail(-e, "cannot mmap %zu bytes of %s: %s", (size_t)len, v->path, kd_errstr(e));
    }
    m->base = base;
    m->len = (size_t)len;
    madvise(m->base, m->len, MADV_RANDOM); /* best effort: no read-around */
    v->be = m;
    return 0;
}

static void map_close(struct kd_vecio *v)
{
    struct kd_map *m = v->be;
    if (!m)
        return;
    munmap(m->base, m->len);
    free(m);
    v->be = NULL;
}

/* One copy counts as one read of the record's payload. */
static int map_submit(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    const uint64_t *rows = p->rows;
    for (size_t i = 0; i < p->n; i++)
        memcpy(p->dst + i * p->dst_stride, map_at(v, v->offset + rows[i] * v->stride),
               v->record_bytes);
    p->c.read_ops += p->n;
    p->c.read_bytes += (uint64_t)p->n * v->record_bytes;
    return 0;
}

/* The range counts as one read per record, of the bytes copied. */
static int map_read_range(struct kd_vecio *v, uint64_t first, uint64_t n, char *dst,
                          struct kd_io_counters *c)
{
    uint64_t need_total = chunk_need(v, n);
    memcpy(dst, map_at(v, v->offset + first * v->stride), need_total);
    c->read_ops += n;
    c->read_bytes += need_total;
    return 0;
}

const struct kd_vecio_ops kd_mmap_ops = {
    .open = map_open,
    .close = map_close,
    .submit = map_submit,
    .read_range = map_read_range,
};

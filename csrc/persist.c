/* persist.c — an index and its file: save (a container of sections, see
 * format.h), load (a stream into memory), open (a mapped file, vectors left
 * on disk) and verify. Everything read is checked before it is used: a
 * damaged, truncated or foreign file gives -KD_ECORRUPT. */
#include "persist.h"
#include "common.h"
#include "search.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- saving */

#define SAVE_PIECE (4u << 20)

/* Records m at a time through an aligned buffer, each filled by fill(). */
static int write_records(struct kd_index *ix, struct kd_container_writer *cw,
                         int (*fill)(struct kd_index *, uint64_t, uint64_t, uint8_t *))
{
    size_t chunk = SAVE_PIECE / ix->record_stride;
    chunk = chunk ? chunk : 1;
    size_t align = ix->vio ? kd_vecio_buffer_alignment(ix->vio) : 64;
    uint8_t *buf = kd_alloc_aligned(align, chunk * ix->record_stride);
    if (!buf)
        return kd_fail(-ENOMEM, "out of memory while saving");
    int err = 0;
    for (uint64_t at = 0; !err && at < ix->count; at += chunk) {
        uint64_t m = ix->count - at < chunk ? ix->count - at : chunk;
        memset(buf, 0, m * ix->record_stride);
        err = fill(ix, at, m, buf);
        if (!err)
            err = kd_cw_write(cw, buf, m * ix->record_stride);
    }
    kd_free_aligned(buf);
    return err;
}

static int fill_from_memory(struct kd_index *ix, uint64_t at, uint64_t m, uint8_t *buf)
{
    for (uint64_t i = 0; i < m; i++)
        memcpy(buf + i * ix->record_stride, ix->vectors + (at + i) * ix->p.dim, ix->record_bytes);
    return 0;
}

/* A range read leaves the padding of its last record unset (zeroed above). */
static int fill_from_file(struct kd_index *ix, uint64_t at, uint64_t m, uint8_t *buf)
{
    struct kd_io_counters io = {0};
    return kd_vecio_read_range(ix->vio, at, m, buf, &io);
}

int kd_save_vectors_memory(struct kd_index *ix, struct kd_container_writer *cw)
{
    if (ix->record_stride != ix->record_bytes)
        return write_records(ix, cw, fill_from_memory);
    /* Packed in memory exactly as in the file: written from the array. */
    const uint8_t *p = (const uint8_t *)ix->vectors;
    uint64_t total = ix->count * ix->record_bytes;
    int err = 0;
    for (uint64_t at = 0; !err && at < total; at += SAVE_PIECE)
        err = kd_cw_write(cw, p + at, total - at < SAVE_PIECE ? (size_t)(total - at) : SAVE_PIECE);
    return err;
}

int kd_save_vectors_file(struct kd_index *ix, struct kd_container_writer *cw)
{
    return write_records(ix, cw, fill_from_file);
}

static int write_section(struct kd_container_writer *cw, uint32_t id, const void *p, size_t n)
{
    int err = kd_cw_section_begin(cw, id);
    if (!err && n)
        err = kd_cw_write(cw, p, n);
    return err ? err : kd_cw_section_end(cw);
}

/* Sections are written in the order kd_index_load reads them back. */
int kd_index_save(struct kd_index *ix, struct kd_writer *w)
{
    pthread_rwlock_rdlock(&ix->lock);
    struct kd_container_writer cw;
    struct kd_meta meta = {
        ix->p.dim,
        (uint32_t)ix->p.metric,
        (uint32_t)ix->p.quantization,
        ix->p.m,
        ix->graph.m0,
        ix->p.ef_construction,
        ix->quant.pdim,
        ix->quant.code_size,
        ix->record_stride,
        ix->record_bytes,
        ix->graph.entry,
        ix->graph.max_level,
        ix->count,
        ix->live,
        ix->p.seed,
        ix->quant.ncentres,
        ix->calib_bytes,
    };
    uint64_t n = ix->count;
    /* 1-bit codes (refined ones too) have the tail of format 4, and those
     * padded to KD_CODE_BITS_WIDE the width of format 5; scalar codes have
     * neither and read as version 2 always did. */
    uint32_t version = ix->quant.bits == 1 ? kd_quant_code_format(&ix->quant) : KD_FORMAT_PLAIN;
    int err = kd_cw_begin(&cw, w, version);
    if (!err)
        err = kd_cw_section_begin(&cw, KD_SEC_META);
    if (!err)
        err = kd_cw_write(&cw, &meta, sizeof meta);
    if (!err)
        err = kd_cw_write(&cw, ix->quant.centres,
                          (size_t)ix->quant.ncentres * ix->p.dim * sizeof(float));
    if (!err)
        err = kd_cw_write(&cw, ix->quant.signs, kd_quant_signs_bytes(&ix->quant));
    if (!err)
        err = kd_cw_write(&cw, ix->quant.sq_lo, ix->p.dim * sizeof(float));
    if (!err)
        err = kd_cw_write(&cw, ix->quant.sq_step, ix->p.dim * sizeof(float));
    if (!err)
        err = kd_cw_section_end(&cw);
    if (!err)
        err = write_section(&cw, KD_SEC_IDS, ix->ids, n * sizeof(int64_t));
    if (!err)
        err = write_section(&cw, KD_SEC_DELETED, ix->deleted, n);
    if (!err)
        err = write_section(&cw, KD_SEC_CODES, ix->codes, n * ix->quant.code_size);
    if (!err)
        err = write_section(&cw, KD_SEC_LEVELS, ix->graph.levels, n);
    if (!err)
        err = write_section(&cw, KD_SEC_LEVEL0, ix->graph.level0,
                            n * (1 + ix->graph.m0) * sizeof(uint32_t));
    if (!err)
        err = kd_cw_section_begin(&cw, KD_SEC_UPPER);
    for (uint64_t i = 0; !err && i < n; i++)
        if (ix->graph.levels[i])
            err = kd_cw_write(&cw, ix->graph.upper[i],
                              ix->graph.levels[i] * (1 + ix->graph.m) * sizeof(uint32_t));
    if (!err)
        err = kd_cw_section_end(&cw);
    if (!err)
        err = kd_cw_section_begin(&cw, KD_SEC_VECTORS);
    if (!err)
        err = ix->src->save(ix, &cw);
    if (!err)
        err = kd_cw_section_end(&cw);
    if (!err && ix->quant.refine_size)
        err = write_section(&cw, KD_SEC_REFINE, ix->refined, n * ix->quant.refine_size);
    if (!err && ix->calib_bytes)
        err = write_section(&cw, KD_SEC_CALIBRATION, ix->calib, ix->calib_bytes);
    if (!err)
        err = kd_cw_finish(&cw);
    else
        kd_cw_discard(&cw);
    pthread_rwlock_unlock(&ix->lock);
    return err;
}

static int emit_index(void *arg, struct kd_writer *w) { return kd_index_save(arg, w); }

int kd_index_save_path(struct kd_index *ix, const char *path)
{
    return kd_save_atomic(path, emit_index, ix);
}

/* ---- reading
 *
 * kd_index_load reads a stream (a kd_reader: a file, a memory buffer, a Python
 * file object; a pipe works) section by section, in the order kd_index_save
 * wrote them, straight into the arrays of a new in-memory index. Every
 * checksum is computed on the way (vectors included) and compared with the
 * section table at the end; the graph is range-checked as it arrives. Peak
 * memory: the index itself plus a 1 MiB read-ahead buffer; no second copy of
 * the file is ever held.
 *
 * kd_index_open maps a file and leaves its vectors on disk. The metadata
 * sections are checked at open (checksums, graph ranges, ids): those named in
 * `preload` through the mapping, which leaves them in the page cache, the
 * others with O_DIRECT reads, which do not. The whole mapping is MADV_RANDOM,
 * so a page that is not resident costs one 4 KiB read, not a read-around. */

static void prefix_path(const char *path)
{
    char msg[KD_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s: %s", path, kd_last_error());
    kd_set_error_text(msg);
}

static size_t meta_extra_bytes(const struct kd_meta *m)
{
    struct kd_quant probe = {0};
    probe.pdim = m->pdim;
    return ((size_t)m->ncentres + 2) * m->dim * sizeof(float) + kd_quant_signs_bytes(&probe);
}

/* The metadata every later size and offset is computed from. */
static int check_meta(const struct kd_meta *m, uint32_t version)
{
    if (m->dim == 0 || m->dim > (1u << 20) || !kd_metric((int)m->metric) ||
        !kd_valid_quantization(m->quantization) || m->m < 2 || m->m > 256 || m->m0 != 2 * m->m ||
        m->pdim != kd_quant_padded_dim(kd_q_bits((int)m->quantization),
                                       kd_q_refine((int)m->quantization), m->dim, version) ||
        m->code_size != kd_quant_file_code_size(kd_q_bits((int)m->quantization),
                                                kd_q_refine((int)m->quantization), m->dim,
                                                version) ||
        m->record_bytes != m->dim * 4 || m->record_stride < m->record_bytes ||
        m->record_stride > m->record_bytes + (1u << 24) || m->count >= UINT32_MAX ||
        m->live > m->count || m->max_level < -1 || m->max_level > KD_MAX_LEVEL ||
        (m->count && m->entry >= m->count) || (!m->count && m->max_level != -1) ||
        m->ncentres < 1 || m->ncentres > KD_MAX_CENTRES || m->calib_bytes > KD_MAX_CALIBRATION)
        return kd_fail(-KD_ECORRUPT, "index metadata is inconsistent");
    return 0;
}

/* Levels: each within max_level; their sum goes to *upper. */
static int check_levels(const uint8_t *lv, uint64_t n, int32_t max_level, uint64_t *upper)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        if ((int32_t)lv[i] > max_level)
            return kd_fail(-KD_ECORRUPT, "index graph is corrupted (bad level)");
        sum += lv[i];
    }
    *upper += sum;
    return 0;
}

/* nlists neighbour lists of [length, cap neighbours]: length <= cap, every
 * neighbour < count. */
static int check_lists(const uint32_t *l, uint64_t nlists, uint32_t cap, uint64_t count)
{
    for (uint64_t i = 0; i < nlists; i++, l += 1 + cap) {
        if (l[0] > cap)
            return kd_fail(-KD_ECORRUPT, "index graph is corrupted (list length)");
        for (uint32_t j = 1; j <= l[0]; j++)
            if (l[j] >= count)
                return kd_fail(-KD_ECORRUPT, "index graph is corrupted (neighbour out of range)");
    }
    return 0;
}

/* Rows first..first+n of the id section into the id map (tombstones
 * skipped); counts the live ones. */
static int map_ids(struct kd_index *ix, const int64_t *ids, uint64_t first, uint64_t n,
                   uint64_t *live)
{
    for (uint64_t i = 0; i < n; i++) {
        if (ix->deleted[first + i])
            continue;
        if (++*live > ix->live || kd_idmap_put(&ix->idmap, ids[i], (uint32_t)(first + i)))
            return kd_fail(-KD_ECORRUPT, *live > ix->live
                                             ? "index file is corrupted (live count)"
                                             : "index file is corrupted (duplicate id)");
    }
    return 0;
}

/* A new index with the parameters and quantizer of m; `extra` holds the
 * centres, rotation signs and scalar ranges that follow m in the file. */
static int index_from_meta(struct kd_index **out, const struct kd_meta *m, const uint8_t *extra)
{
    struct kd_index_params params = {
        m->dim, (int)m->metric, m->m, m->ef_construction, (int)m->quantization, m->seed};
    struct kd_index *ix = NULL;
    int err = kd_index_alloc(&ix, &params);
    if (err)
        return err;
    struct kd_quant probe = {0};
    probe.pdim = m->pdim;
    const float *centres = (const float *)extra;
    const uint8_t *signs = extra + (size_t)m->ncentres * m->dim * sizeof(float);
    float *ranges = malloc(2 * (size_t)m->dim * sizeof(float));
    if (!ranges) {
        kd_index_free(ix);
        return kd_fail(-ENOMEM, "out of memory");
    }
    memcpy(ranges, signs + kd_quant_signs_bytes(&probe), 2 * (size_t)m->dim * sizeof(float));
    if ((err = kd_quant_init(&ix->quant, kd_q_bits((int)m->quantization),
                             kd_q_refine((int)m->quantization), m->dim, m->pdim, (int)m->metric,
                             m->ncentres, centres, signs, 0))) {
        free(ranges);
        kd_index_free(ix);
        return err;
    }
    kd_quant_set_ranges(&ix->quant, ranges, ranges + m->dim);
    free(ranges);
    ix->estimate = kd_estimator(&ix->quant);
    ix->refine = kd_refiner(&ix->quant);
    ix->record_stride = m->record_stride;
    ix->trained = 1;
    ix->count = ix->cap = m->count;
    ix->live = m->live;
    kd_idmap_free(&ix->idmap);
    if ((err = kd_idmap_init(&ix->idmap, m->live))) {
        kd_index_free(ix);
        return err;
    }
    *out = ix;
    return 0;
}

/* Bytes of a row's refinement; 0 for codes without. */
static uint32_t refine_size(const struct kd_meta *m)
{
    return kd_quant_refine_size(kd_q_refine((int)m->quantization), m->pdim);
}

/* Sections a file holds: eight, then the refinements and the calibration
 * when it has them. */
static int sections_in(const struct kd_meta *m)
{
    return 8 + (refine_size(m) != 0) + (m->calib_bytes != 0);
}

/* Stream offset where the first `nsec` sections end (as written by
 * kd_index_save), table and tail included when all are counted. */
static uint64_t stream_end(const struct kd_meta *m, uint64_t upper_bytes, int nsec)
{
    uint64_t n = m->count;
    uint64_t len[10] = {sizeof *m + meta_extra_bytes(m),
                        n * 8,
                        n,
                        n * m->code_size,
                        n,
                        n * (1 + (uint64_t)m->m0) * 4,
                        upper_bytes,
                        n * m->record_stride};
    int at = 8;
    if (refine_size(m))
        len[at++] = n * refine_size(m);
    len[at] = m->calib_bytes;
    uint64_t pos = KD_BLOCK;
    for (int i = 0; i < nsec; i++)
        pos = kd_round_up(pos + len[i], KD_BLOCK);
    int all = sections_in(m);
    return nsec == all ? pos + (uint64_t)all * sizeof(struct kd_section) + KD_TAIL_BYTES : pos;
}

/* Room for a calibration of n bytes, read next. */
static int take_calibration(struct kd_index *ix, uint32_t n)
{
    if (!(ix->calib = malloc(n)))
        return kd_fail(-ENOMEM, "out of memory");
    ix->calib_bytes = n;
    return 0;
}

static int read_section(struct kd_container_reader *cr, uint32_t id, void *dst, size_t n)
{
    int err = kd_cr_section_begin(cr, id);
    if (!err)
        err = kd_cr_read(cr, dst, n);
    return err ? err : kd_cr_section_end(cr);
}

/* The codes section into ix's layout: a file before format 4 holds
 * 1-bit codes with the longer tail, read aside and converted. */
static int read_codes(struct kd_container_reader *cr, struct kd_index *ix, uint64_t n,
                      uint32_t file_code_size)
{
    if (file_code_size == ix->quant.code_size)
        return read_section(cr, KD_SEC_CODES, ix->codes, n * file_code_size);
    uint8_t *old = malloc(n ? n * file_code_size : 1);
    if (!old)
        return kd_fail(-ENOMEM, "out of memory reading the codes");
    int err = read_section(cr, KD_SEC_CODES, old, n * file_code_size);
    if (!err)
        kd_quant_codes_from_file(&ix->quant, cr->version, old, ix->codes, n);
    free(old);
    return err;
}

int kd_index_load(struct kd_index **out, struct kd_reader *r)
{
    struct kd_container_reader cr;
    struct kd_meta m;
    uint8_t *extra = NULL;
    struct kd_index *ix = NULL;
    int err = kd_cr_begin(&cr, r);
    if (!err)
        err = kd_cr_section_begin(&cr, KD_SEC_META);
    if (!err)
        err = kd_cr_read(&cr, &m, sizeof m);
    if (!err)
        err = check_meta(&m, cr.version);
    size_t xb = err ? 0 : meta_extra_bytes(&m);
    if (!err && !(extra = malloc(xb)))
        err = kd_fail(-ENOMEM, "out of memory");
    if (!err)
        err = kd_cr_read(&cr, extra, xb);
    if (!err)
        err = kd_cr_section_end(&cr);
    uint64_t n = m.count;
    /* A size known in advance must hold what the metadata announces. */
    if (!err)
        err = kd_cr_need(&cr, n * (8 + 1 + m.code_size + refine_size(&m) + 1 +
                                   (1 + (uint64_t)m.m0) * 4 + m.record_stride));
    if (!err)
        kd_cr_expect(&cr, stream_end(&m, 0, 6));
    if (!err)
        err = index_from_meta(&ix, &m, extra);
    free(extra);
    if (err)
        goto fail;
    struct kd_graph *g = &ix->graph;
    /* The owned layout packs vectors at dim floats; the file stride is kept
     * for the next save. */
    ix->record_stride = kd_record_stride_for(m.dim);
    ix->cap = ix->count = 0;
    if ((err = kd_index_grow(ix, n ? n : 1)))
        goto fail;
    memset(g->upper, 0, (n ? n : 1) * sizeof *g->upper);
    memset(g->locks, 0, n ? n : 1);
    ix->count = g->count = n;
    uint64_t upper = 0;
    if ((err = read_section(&cr, KD_SEC_IDS, ix->ids, n * 8)) ||
        (err = read_section(&cr, KD_SEC_DELETED, ix->deleted, n)) ||
        (err = read_codes(&cr, ix, n, m.code_size)) ||
        (err = read_section(&cr, KD_SEC_LEVELS, g->levels, n)) ||
        (err = check_levels(g->levels, n, m.max_level, &upper)) ||
        (kd_cr_expect(&cr, stream_end(&m, upper * (1 + m.m) * 4, sections_in(&m))), 0) ||
        (err = read_section(&cr, KD_SEC_LEVEL0, g->level0, n * (1 + m.m0) * 4)) ||
        (err = check_lists(g->level0, n, m.m0, n)) ||
        (err = kd_cr_section_begin(&cr, KD_SEC_UPPER)))
        goto fail;
    for (uint64_t i = 0; i < n; i++) {
        size_t words = (size_t)g->levels[i] * (1 + m.m);
        if (!words)
            continue;
        if (!(g->upper[i] = malloc(words * 4))) {
            err = kd_fail(-ENOMEM, "out of memory loading the graph");
            goto fail;
        }
        if ((err = kd_cr_read(&cr, g->upper[i], words * 4)) ||
            (err = check_lists(g->upper[i], g->levels[i], m.m, n)))
            goto fail;
    }
    if ((err = kd_cr_section_end(&cr)) || (err = kd_cr_section_begin(&cr, KD_SEC_VECTORS)))
        goto fail;
    if (m.record_stride == m.record_bytes) {
        err = kd_cr_read(&cr, ix->vectors, n * m.record_bytes);
    } else {
        for (uint64_t i = 0; !err && i < n; i++) {
            err = kd_cr_read(&cr, ix->vectors + i * m.dim, m.record_bytes);
            if (!err)
                err = kd_cr_read(&cr, NULL, m.record_stride - m.record_bytes);
        }
    }
    if (err || (err = kd_cr_section_end(&cr)))
        goto fail;
    if (refine_size(&m) &&
        (err = read_section(&cr, KD_SEC_REFINE, ix->refined, n * refine_size(&m))))
        goto fail;
    if (m.calib_bytes && ((err = take_calibration(ix, m.calib_bytes)) ||
                          (err = read_section(&cr, KD_SEC_CALIBRATION, ix->calib, m.calib_bytes))))
        goto fail;
    if ((err = kd_cr_finish(&cr)))
        goto fail;
    uint64_t live = 0;
    if ((err = map_ids(ix, ix->ids, 0, n, &live)))
        goto fail;
    if (live != m.live) {
        err = kd_fail(-KD_ECORRUPT, "index file is corrupted (live count)");
        goto fail;
    }
    g->entry = n ? m.entry : KD_NONE;
    g->max_level = m.max_level;
    if (ix->inv_norms)
        for (uint64_t i = 0; i < n; i++)
            ix->inv_norms[i] = kd_inv_norm(ix, ix->vectors + i * m.dim);
    *out = ix;
    return 0;
fail:
    kd_cr_discard(&cr);
    kd_index_free(ix);
    return err;
}

int kd_index_load_path(struct kd_index **out, const char *path)
{
    struct kd_reader r;
    struct kd_fd_reader fr;
    int err = kd_fd_reader_open(&r, &fr, path);
    if (err)
        return err;
    err = kd_index_load(out, &r);
    kd_reader_close(&r);
    if (err == -EINVAL || err == -KD_ECORRUPT)
        prefix_path(path);
    return err;
}

/* What the open-time scans of the metadata sections fill in. */
struct open_scan {
    struct kd_index *ix;
    const uint32_t *upper_base; /* the mapped upper-level section */
    uint64_t upper_words;
    uint64_t live;
    int32_t max_level;
    uint32_t cap; /* neighbours per list of the section scanned */
};

static int scan_deleted(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    memcpy(o->ix->deleted + at, p, n);
    return 0;
}

static int scan_ids(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    return map_ids(o->ix, (const int64_t *)p, at / 8, n / 8, &o->live);
}

static int scan_levels(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    struct kd_graph *g = &o->ix->graph;
    uint64_t sum = 0;
    int err = check_levels(p, n, o->max_level, &sum);
    /* Pointers into the mapping; nothing is read through them before the
     * section's length has been checked against the levels. */
    for (size_t i = 0; !err && i < n; i++) {
        g->upper[at + i] = p[i] ? (uint32_t *)o->upper_base + o->upper_words : NULL;
        o->upper_words += (uint64_t)p[i] * (1 + g->m);
    }
    return err;
}

static int scan_lists(void *arg, const uint8_t *p, size_t n, uint64_t at)
{
    struct open_scan *o = arg;
    return check_lists((const uint32_t *)p, n / ((1 + o->cap) * 4), o->cap, o->ix->count);
}

int kd_index_open(struct kd_index **out, const char *path, const struct kd_open_params *op)
{
    /* O_NONBLOCK: a FIFO must not block the open (it is refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return kd_fail(-e, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    struct kd_scanner sc;
    int err = 0;
    uint8_t *map = MAP_FAILED;
    struct kd_index *ix = NULL;
    kd_scanner_init(&sc, NULL, NULL, 0);
    if (fstat(fd, &st) != 0) {
        err = kd_fail(-errno, "cannot stat %s", path);
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        err = kd_fail(-EISDIR, "%s is a directory, not an index file", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        err = kd_fail(-EINVAL,
                      "%s is not a regular file (a device, pipe or socket): open maps "
                      "an index file; knndirect.load reads a stream",
                      path);
        goto fail;
    }
    if ((uint64_t)st.st_size < KD_BLOCK + KD_TAIL_BYTES) {
        if ((uint64_t)st.st_size >= 8) {
            char magic[8];
            if (pread(fd, magic, 8, 0) == 8 && memcmp(magic, "KNNDIRCT", 8) == 0) {
                err = kd_fail(-KD_ECORRUPT, "%s: index file is truncated (%llu bytes)", path,
                              (unsigned long long)st.st_size);
                goto fail;
            }
        }
        err = kd_fail(-KD_ECORRUPT, "%s is not a knndirect index (too small)", path);
        goto fail;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        err = kd_fail(-e, "cannot map %s: %s", path, strerror(e));
        goto fail;
    }
    /* Every section reads only the pages it is asked for; preloaded ones are
     * read ahead explicitly below. */
    madvise(map, (size_t)st.st_size, MADV_RANDOM);
    struct kd_container c;
    if ((err = kd_container_parse(&c, map, (uint64_t)st.st_size, ~(1u << KD_SEC_META)))) {
        prefix_path(path);
        goto fail;
    }
    const struct kd_section *meta = kd_container_find(&c, KD_SEC_META), *ids, *deleted, *codes,
                            *levels, *level0, *upperp, *vectors;
#define NEED(var, id)                                                                              \
    if (!(var = kd_container_find(&c, id))) {                                                      \
        err = kd_fail(-KD_ECORRUPT, "%s: index file lacks section %d", path, id);                  \
        goto fail;                                                                                 \
    }
    NEED(ids, KD_SEC_IDS)
    NEED(deleted, KD_SEC_DELETED)
    NEED(codes, KD_SEC_CODES)
    NEED(levels, KD_SEC_LEVELS)
    NEED(level0, KD_SEC_LEVEL0)
    NEED(upperp, KD_SEC_UPPER)
    NEED(vectors, KD_SEC_VECTORS)
#undef NEED
    struct kd_meta m;
    if (!meta || meta->length < sizeof m) {
        err = kd_fail(-KD_ECORRUPT, "%s: index metadata is missing or short", path);
        goto fail;
    }
    memcpy(&m, map + meta->offset, sizeof m);
    if ((err = check_meta(&m, c.version)) || meta->length != sizeof m + meta_extra_bytes(&m)) {
        err = err ? err : kd_fail(-KD_ECORRUPT, "index metadata has the wrong size");
        prefix_path(path);
        goto fail;
    }
    uint64_t n = m.count;
    if (ids->length != n * 8 || deleted->length != n || codes->length != n * m.code_size ||
        levels->length != n || level0->length != n * (1 + m.m0) * 4 ||
        vectors->length != n * m.record_stride) {
        err = kd_fail(-KD_ECORRUPT, "%s: index sections do not match the vector count", path);
        goto fail;
    }
    const struct kd_section *refined = kd_container_find(&c, KD_SEC_REFINE);
    if (!refined != !refine_size(&m) || (refined && refined->length != n * refine_size(&m))) {
        err = kd_fail(-KD_ECORRUPT, "%s: index refinements do not match its metadata", path);
        goto fail;
    }
    const struct kd_section *calib = kd_container_find(&c, KD_SEC_CALIBRATION);
    if (!calib != !m.calib_bytes || (calib && calib->length != m.calib_bytes)) {
        err = kd_fail(-KD_ECORRUPT, "%s: index calibration section does not match its metadata",
                      path);
        goto fail;
    }
    if ((err = index_from_meta(&ix, &m, map + meta->offset + sizeof m)))
        goto fail;
    if (calib && (err = take_calibration(ix, m.calib_bytes)))
        goto fail;
    if (calib && kd_crc32c(0, map + calib->offset, calib->length) != calib->crc) {
        err = kd_fail(-KD_ECORRUPT,
                      "%s: index section %u (calibration) is corrupted (checksum mismatch)", path,
                      KD_SEC_CALIBRATION);
        goto fail;
    }
    if (calib)
        memcpy(ix->calib, map + calib->offset, m.calib_bytes);
    ix->map = map;
    ix->map_len = (size_t)st.st_size;
    map = MAP_FAILED;
    ix->src = &kd_vsource_file;
    ix->loaded_from_file = 1;
    struct kd_graph *g = &ix->graph;
    g->owns = 0;
    g->count = n;
    g->entry = n ? m.entry : KD_NONE;
    g->max_level = m.max_level;
    ix->deleted = malloc(n ? n : 1);
    g->upper = calloc(n ? n : 1, sizeof *g->upper);
    if (!ix->deleted || !g->upper) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto fail;
    }
    kd_scanner_init(&sc, ix->map, path, op->direct_io);
    struct open_scan o = {ix, (const uint32_t *)(ix->map + upperp->offset), 0, 0, m.max_level, 0};
#define VIA_MAP(s) ((op->preload >> (s)->id) & 1)
    if ((err = kd_scan_section(&sc, deleted, VIA_MAP(deleted), 1, scan_deleted, &o)) ||
        (err = kd_scan_section(&sc, ids, VIA_MAP(ids), 8, scan_ids, &o)))
        goto scan_fail;
    if (o.live != m.live) {
        err = kd_fail(-KD_ECORRUPT, "index file is corrupted (live count)");
        goto scan_fail;
    }
    if ((err = kd_scan_section(&sc, levels, VIA_MAP(levels), 1, scan_levels, &o)))
        goto scan_fail;
    if (upperp->length != o.upper_words * 4) {
        err = kd_fail(-KD_ECORRUPT, "index graph is corrupted (upper levels)");
        goto scan_fail;
    }
    o.cap = m.m0;
    if ((err = kd_scan_section(&sc, level0, VIA_MAP(level0), (1 + m.m0) * 4, scan_lists, &o)))
        goto scan_fail;
    o.cap = m.m;
    if ((err = kd_scan_section(&sc, upperp, VIA_MAP(upperp), (1 + m.m) * 4, scan_lists, &o)) ||
        (err = kd_scan_section(&sc, codes, VIA_MAP(codes), 1, NULL, NULL)) ||
        (refined && (err = kd_scan_section(&sc, refined, VIA_MAP(refined), 1, NULL, NULL))))
        goto scan_fail;
#undef VIA_MAP
    kd_scanner_free(&sc);
    ix->codes = ix->map + codes->offset;
    if (m.code_size != ix->quant.code_size) { /* before format 4: converted into RAM */
        if (!(ix->own_codes = kd_alloc_aligned(KD_CODE_ALIGN, n * ix->quant.code_size))) {
            err = kd_fail(-ENOMEM, "out of memory converting the codes of %s", path);
            goto fail;
        }
        kd_quant_codes_from_file(&ix->quant, c.version, ix->codes, ix->own_codes, n);
        ix->codes = ix->own_codes;
    }
    ix->refined = refined ? ix->map + refined->offset : NULL;
    ix->ids = (int64_t *)(ix->map + ids->offset);
    g->level0 = (uint32_t *)(ix->map + level0->offset);
    g->levels = ix->map + levels->offset;
    if (!(ix->path = strdup(path))) {
        err = kd_fail(-ENOMEM, "out of memory");
        goto fail;
    }
    if (n) {
        struct kd_vecio_config vc = {path,
                                     vectors->offset,
                                     n,
                                     ix->record_stride,
                                     ix->record_bytes,
                                     op->io_backend,
                                     op->direct_io,
                                     op->io_depth ? op->io_depth : 1};
        if ((err = kd_vecio_open(&ix->vio, &vc)))
            goto fail;
        struct kd_vecio_info vi;
        kd_vecio_get_info(ix->vio, &vi);
        /* Not with the thread pool: its workers, woken in the middle of the
         * beam, preempt it and the tail latency suffers (measured:
         * docs/benchmarks.md, 'Design figures'). */
        ix->read_early = vi.backend == KD_IO_URING;
        /* Vectors read with O_DIRECT never look at the page cache: only the
         * buffered backends gain from reading them ahead. */
        if ((op->preload >> KD_SEC_VECTORS & 1) && !vi.direct_io)
            posix_fadvise(fd, (off_t)vectors->offset, (off_t)vectors->length, POSIX_FADV_WILLNEED);
    }
    close(fd);
    *out = ix;
    return 0;
scan_fail:
    prefix_path(path);
fail:
    kd_scanner_free(&sc);
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    kd_index_free(ix);
    close(fd);
    return err;
}

/* An opened index: every checksum of the file, vectors included (metadata
 * through the mapping, vectors with the index's own reads). A loaded index
 * had every checksum checked as it was read, and has no file. */
int kd_index_verify(struct kd_index *ix)
{
    if (!ix->map)
        return 0;
    pthread_rwlock_rdlock(&ix->lock);
    struct kd_container c;
    struct kd_scanner sc;
    uint8_t *buf = NULL;
    int err = kd_container_parse(&c, ix->map, ix->map_len, ~0u);
    kd_scanner_init(&sc, ix->map, NULL, 0);
    const struct kd_section *vs = err ? NULL : kd_container_find(&c, KD_SEC_VECTORS);
    for (uint32_t i = 0; !err && i < c.nsections; i++)
        if (c.sections[i].id != KD_SEC_VECTORS)
            err = kd_scan_section(&sc, &c.sections[i], 1, 1, NULL, NULL);
    kd_scanner_free(&sc);
    if (!err && !vs)
        err = kd_fail(-KD_ECORRUPT, "index file lacks section %d", KD_SEC_VECTORS);
    if (!err && ix->vio) {
        /* A range read delivers the padding of every record but its last: one
         * record more is read (the next chunk's first), and the padding that
         * ends the section comes from the mapping. */
        uint64_t stride = ix->record_stride;
        size_t chunk = (4u << 20) / stride;
        chunk = chunk ? chunk : 1;
        buf = kd_alloc_aligned(kd_vecio_buffer_alignment(ix->vio), (chunk + 1) * stride);
        if (!buf)
            err = kd_fail(-ENOMEM, "out of memory");
        uint32_t crc = 0;
        for (uint64_t at = 0; !err && at < ix->count; at += chunk) {
            uint64_t m = ix->count - at < chunk ? ix->count - at : chunk;
            int last = at + m == ix->count;
            struct kd_io_counters io = {0};
            err = kd_vecio_read_range(ix->vio, at, m + !last, buf, &io);
            if (!err)
                crc = kd_crc32c(crc, buf, last ? (m - 1) * stride + ix->record_bytes : m * stride);
        }
        if (!err)
            crc = kd_crc32c(crc, ix->map + vs->offset + vs->length - (stride - ix->record_bytes),
                            stride - ix->record_bytes);
        if (!err && crc != vs->crc)
            err = kd_fail(-KD_ECORRUPT,
                          "index section %u (vectors) is corrupted (checksum mismatch)", vs->id);
    }
    kd_free_aligned(buf);
    pthread_rwlock_unlock(&ix->lock);
    if ((err == -EINVAL || err == -KD_ECORRUPT) && ix->path)
        prefix_path(ix->path);
    return err;
}

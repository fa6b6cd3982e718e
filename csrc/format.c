#include "format.h"
#include "common.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char HEAD_MAGIC[8] = {'K', 'N', 'N', 'D', 'I', 'R', 'C', 'T'};
static const char TAIL_MAGIC[8] = {'K', 'N', 'N', 'D', 'E', 'N', 'D', '1'};

/* ---- CRC-32C (Castagnoli): SSE4.2 instruction when present, else a table. */

static uint32_t crc_table[8][256];

static void crc_init_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n)
{
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        crc_init_table();
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^
              crc_table[5][(v >> 16) & 0xff] ^ crc_table[4][(v >> 24) & 0xff] ^
              crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
              crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

uint32_t kd_crc32c(uint32_t crc, const void *buf, size_t n)
{
    crc = ~crc;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        return ~crc_hw(crc, buf, n);
#endif
    return ~crc_sw(crc, buf, n);
}

static const char *section_name(uint32_t id)
{
    static const char *names[] = {"?",       "metadata",     "ids",           "tombstones",
                                  "codes",   "graph levels", "graph level 0", "graph upper levels",
                                  "vectors", "calibration",  "refinements"};
    return id < sizeof names / sizeof *names ? names[id] : "unknown";
}

/* ---- header and tail */

static void make_header(uint8_t head[KD_HEADER_BYTES], uint32_t version)
{
    memset(head, 0, KD_HEADER_BYTES);
    memcpy(head, HEAD_MAGIC, 8);
    uint32_t block = KD_BLOCK;
    memcpy(head + 8, &version, 4);
    memcpy(head + 12, &block, 4);
    uint32_t crc = kd_crc32c(0, head, KD_HEADER_BYTES - 4);
    memcpy(head + KD_HEADER_BYTES - 4, &crc, 4);
}

/* Check the first `have` bytes of a header (have < 64 means the data ends
 * there). Damage, truncation and a foreign file are -KD_ECORRUPT; a version
 * this build does not read is -EINVAL. */
static int check_header(const uint8_t *head, uint64_t have, uint32_t *version)
{
    if (have == 0)
        return kd_fail(-KD_ECORRUPT, "not a knndirect index (the data is empty)");
    if (memcmp(head, HEAD_MAGIC, have < 8 ? (size_t)have : 8) != 0)
        return kd_fail(-KD_ECORRUPT, "not a knndirect index (bad magic number)");
    if (have < KD_HEADER_BYTES)
        return kd_fail(-KD_ECORRUPT,
                       "index data is truncated (it ends inside the header, at byte %llu)",
                       (unsigned long long)have);
    uint32_t v, block, crc;
    memcpy(&v, head + 8, 4);
    memcpy(&block, head + 12, 4);
    memcpy(&crc, head + KD_HEADER_BYTES - 4, 4);
    if (crc != kd_crc32c(0, head, KD_HEADER_BYTES - 4))
        return kd_fail(-KD_ECORRUPT, "index header is corrupted (checksum mismatch)");
    if (v > KD_FORMAT_VERSION)
        return kd_fail(-EINVAL,
                       "index format version %u is newer than this build of knndirect reads "
                       "(version %u); upgrade knndirect to read it",
                       v, KD_FORMAT_VERSION);
    if (v < KD_FORMAT_MIN_VERSION)
        return kd_fail(-EINVAL,
                       "index format version %u is not supported (this build reads versions "
                       "%u to %u)",
                       v, KD_FORMAT_MIN_VERSION, KD_FORMAT_VERSION);
    if (block != KD_BLOCK)
        return kd_fail(-KD_ECORRUPT, "index header is corrupted (block size %u)", block);
    *version = v;
    return 0;
}

struct tail {
    uint64_t table_off;
    uint32_t n, crc, version, reserved;
};

static int parse_tail(const uint8_t *p, uint32_t version, struct tail *t)
{
    memcpy(&t->table_off, p, 8);
    memcpy(&t->n, p + 8, 4);
    memcpy(&t->crc, p + 12, 4);
    memcpy(&t->version, p + 16, 4);
    memcpy(&t->reserved, p + 20, 4);
    if (memcmp(p + 24, TAIL_MAGIC, 8) != 0)
        return kd_fail(-KD_ECORRUPT, "index file is truncated or corrupted (no footer)");
    if (t->version != version || t->reserved != 0)
        return kd_fail(-KD_ECORRUPT, "index footer is corrupted (version %u, header says %u)",
                       t->version, version);
    if (t->n == 0 || t->n > KD_MAX_SECTIONS)
        return kd_fail(-KD_ECORRUPT, "index footer is corrupted (bad section table)");
    return 0;
}

/* ---- writing */

#define WRITE_BUFFER (1u << 20)

static int flush(struct kd_container_writer *cw)
{
    if (!cw->fill)
        return 0;
    size_t n = cw->fill;
    cw->fill = 0;
    return cw->w->write(cw->w->ctx, cw->buf, n);
}

static int put(struct kd_container_writer *cw, const void *buf, size_t n)
{
    int err = 0;
    if (cw->buf && n < cw->cap) {
        if (cw->fill + n > cw->cap && (err = flush(cw)))
            return err;
        memcpy(cw->buf + cw->fill, buf, n);
        cw->fill += n;
    } else if (!(err = flush(cw))) {
        err = cw->w->write(cw->w->ctx, buf, n);
    }
    if (!err)
        cw->pos += n;
    return err;
}

static int pad_to_block(struct kd_container_writer *cw)
{
    static const uint8_t zeros[KD_BLOCK];
    size_t pad = (size_t)(kd_round_up(cw->pos, KD_BLOCK) - cw->pos);
    return pad ? put(cw, zeros, pad) : 0;
}

int kd_cw_begin(struct kd_container_writer *cw, struct kd_writer *w, uint32_t version)
{
    memset(cw, 0, sizeof *cw);
    cw->w = w;
    cw->version = version;
    /* Without the buffer every write goes straight through: slower, not wrong. */
    cw->buf = malloc(WRITE_BUFFER);
    cw->cap = cw->buf ? WRITE_BUFFER : 0;
    uint8_t head[KD_HEADER_BYTES];
    make_header(head, version);
    int err = put(cw, head, sizeof head);
    return err ? err : pad_to_block(cw);
}

int kd_cw_section_begin(struct kd_container_writer *cw, uint32_t id)
{
    if (cw->nsections >= KD_MAX_SECTIONS || cw->open)
        return kd_fail(-EINVAL, "container writer misuse");
    cw->open = &cw->sections[cw->nsections++];
    memset(cw->open, 0, sizeof *cw->open);
    cw->open->id = id;
    cw->open->offset = cw->pos;
    return 0;
}

int kd_cw_write(struct kd_container_writer *cw, const void *buf, size_t n)
{
    cw->open->crc = kd_crc32c(cw->open->crc, buf, n);
    cw->open->length += n;
    return put(cw, buf, n);
}

int kd_cw_section_end(struct kd_container_writer *cw)
{
    cw->open = NULL;
    return pad_to_block(cw);
}

int kd_cw_finish(struct kd_container_writer *cw)
{
    uint64_t table_off = cw->pos;
    size_t tbytes = cw->nsections * sizeof(struct kd_section);
    int err = put(cw, cw->sections, tbytes);
    if (!err) {
        uint8_t tail[KD_TAIL_BYTES];
        uint32_t n = cw->nsections, crc = kd_crc32c(0, cw->sections, tbytes);
        uint32_t version = cw->version;
        memcpy(tail, &table_off, 8);
        memcpy(tail + 8, &n, 4);
        memcpy(tail + 12, &crc, 4);
        memcpy(tail + 16, &version, 4);
        memset(tail + 20, 0, 4);
        memcpy(tail + 24, TAIL_MAGIC, 8);
        err = put(cw, tail, sizeof tail);
    }
    if (!err)
        err = flush(cw);
    kd_cw_discard(cw);
    return err;
}

void kd_cw_discard(struct kd_container_writer *cw)
{
    free(cw->buf);
    cw->buf = NULL;
    cw->fill = cw->cap = 0;
}

/* ---- reading a file in memory */

int kd_container_parse(struct kd_container *c, const uint8_t *base, uint64_t size,
                       uint32_t skip_verify)
{
    memset(c, 0, sizeof *c);
    c->base = base;
    c->size = size;
    int err = check_header(base, size < KD_HEADER_BYTES ? size : KD_HEADER_BYTES, &c->version);
    if (err)
        return err;
    if (size < KD_BLOCK + KD_TAIL_BYTES)
        return kd_fail(-KD_ECORRUPT, "index file is truncated (%llu bytes)",
                       (unsigned long long)size);
    struct tail t;
    if ((err = parse_tail(base + size - KD_TAIL_BYTES, c->version, &t)))
        return err;
    if (t.table_off < KD_BLOCK || t.table_off % KD_BLOCK ||
        t.table_off + (uint64_t)t.n * sizeof(struct kd_section) != size - KD_TAIL_BYTES)
        return kd_fail(-KD_ECORRUPT, "index footer is corrupted (bad section table)");
    memcpy(c->sections, base + t.table_off, t.n * sizeof(struct kd_section));
    if (kd_crc32c(0, c->sections, t.n * sizeof(struct kd_section)) != t.crc)
        return kd_fail(-KD_ECORRUPT, "index footer is corrupted (checksum mismatch)");
    c->nsections = t.n;
    uint64_t end = KD_BLOCK;
    for (uint32_t i = 0; i < t.n; i++) {
        const struct kd_section *s = &c->sections[i];
        /* Sections follow each other in order, each on its own blocks. */
        if (s->offset % KD_BLOCK || s->offset < end || s->offset > t.table_off ||
            s->length > t.table_off - s->offset)
            return kd_fail(-KD_ECORRUPT,
                           "index section %u (%s) lies outside the file or out of place "
                           "(offset %llu, %llu bytes)",
                           s->id, section_name(s->id), (unsigned long long)s->offset,
                           (unsigned long long)s->length);
        /* The writer leaves them 0 (the stream reader refuses them too). */
        if (s->reserved || s->reserved2)
            return kd_fail(-KD_ECORRUPT, "index section %u (%s) has a corrupted table entry", s->id,
                           section_name(s->id));
        end = kd_round_up(s->offset + s->length, KD_BLOCK);
        for (uint32_t j = 0; j < i; j++)
            if (c->sections[j].id == s->id)
                return kd_fail(-KD_ECORRUPT, "index section %u (%s) appears twice", s->id,
                               section_name(s->id));
        if (s->id < 32 && (skip_verify >> s->id & 1))
            continue;
        if (kd_crc32c(0, base + s->offset, s->length) != s->crc)
            return kd_fail(-KD_ECORRUPT, "index section %u (%s) is corrupted (checksum mismatch)",
                           s->id, section_name(s->id));
    }
    return 0;
}

const struct kd_section *kd_container_find(const struct kd_container *c, uint32_t id)
{
    for (uint32_t i = 0; i < c->nsections; i++)
        if (c->sections[i].id == id)
            return &c->sections[i];
    return NULL;
}

/* ---- reading a stream */

#define READ_BUFFER (1u << 20)
/* Large reads go straight to their destination, this much at a time, so the
 * checksum runs over bytes still in cache. */
#define DIRECT_PIECE (4u << 20)

static int truncated(struct kd_container_reader *cr)
{
    if (cr->open)
        return kd_fail(-KD_ECORRUPT,
                       "index data is truncated (it ends inside section %u (%s), at byte %llu)",
                       cr->open->id, section_name(cr->open->id), (unsigned long long)cr->pos);
    return kd_fail(-KD_ECORRUPT, "index data is truncated (it ends at byte %llu)",
                   (unsigned long long)cr->pos);
}

/* Refill the read-ahead buffer with at least one and at most `want` bytes, or
 * more when they are known to belong to the index (a stream that goes on
 * after the index is left just past it); returns bytes now buffered, 0 at the
 * end. */
static int64_t refill(struct kd_container_reader *cr, size_t want)
{
    cr->start = cr->end = 0;
    size_t n = want;
    if (cr->limit > cr->pos && cr->limit - cr->pos > n)
        n = cr->limit - cr->pos < cr->cap ? (size_t)(cr->limit - cr->pos) : cr->cap;
    if (n > cr->cap)
        n = cr->cap;
    int64_t got = cr->r->read(cr->r->ctx, cr->buf, n);
    if (got < 0)
        return got;
    if ((uint64_t)got > cr->cap)
        return kd_fail(-EIO, "the source returned more bytes than asked for");
    cr->end = (size_t)got;
    return got;
}

/* Read exactly n bytes (dst NULL: skip), outside or inside a section. */
static int take(struct kd_container_reader *cr, void *dst, size_t n)
{
    uint8_t *out = dst;
    while (n > 0) {
        const uint8_t *p;
        size_t got;
        if (cr->start < cr->end) {
            got = cr->end - cr->start < n ? cr->end - cr->start : n;
            p = cr->buf + cr->start;
            if (out)
                memcpy(out, p, got);
            cr->start += got;
        } else if (out && n >= cr->cap / 2) {
            int64_t r = cr->r->read(cr->r->ctx, out, n < DIRECT_PIECE ? n : DIRECT_PIECE);
            if (r < 0)
                return (int)r;
            if (r == 0)
                return truncated(cr);
            if ((uint64_t)r > n)
                return kd_fail(-EIO, "the source returned more bytes than asked for");
            got = (size_t)r;
            p = out;
        } else {
            int64_t r = refill(cr, n);
            if (r < 0)
                return (int)r;
            if (r == 0)
                return truncated(cr);
            continue;
        }
        if (cr->open) {
            cr->open->crc = kd_crc32c(cr->open->crc, p, got);
            cr->open->length += got;
        }
        cr->pos += got;
        n -= got;
        if (out)
            out += got;
    }
    return 0;
}

static int skip_to_block(struct kd_container_reader *cr)
{
    return take(cr, NULL, (size_t)(kd_round_up(cr->pos, KD_BLOCK) - cr->pos));
}

int kd_cr_begin(struct kd_container_reader *cr, struct kd_reader *r)
{
    memset(cr, 0, sizeof *cr);
    cr->r = r;
    cr->buf = malloc(READ_BUFFER);
    if (!cr->buf)
        return kd_fail(-ENOMEM, "out of memory");
    cr->cap = READ_BUFFER;
    /* Read what there is of the header first, to tell a foreign file from a
     * short one. */
    uint8_t head[KD_HEADER_BYTES];
    size_t have = 0;
    cr->limit = r->whole ? UINT64_MAX : 0;
    while (have < sizeof head) {
        if (cr->start == cr->end) {
            int64_t got = refill(cr, sizeof head - have);
            if (got < 0)
                return (int)got;
            if (got == 0)
                break;
        }
        size_t n = cr->end - cr->start < sizeof head - have ? cr->end - cr->start
                                                            : sizeof head - have;
        memcpy(head + have, cr->buf + cr->start, n);
        cr->start += n;
        have += n;
        cr->pos = have;
    }
    int err = check_header(head, have, &cr->version);
    return err ? err : skip_to_block(cr);
}

int kd_cr_section_begin(struct kd_container_reader *cr, uint32_t id)
{
    if (cr->open || cr->nsections >= KD_MAX_SECTIONS)
        return kd_fail(-EINVAL, "container reader misuse");
    int err = skip_to_block(cr);
    if (err)
        return err;
    cr->open = &cr->sections[cr->nsections++];
    memset(cr->open, 0, sizeof *cr->open);
    cr->open->id = id;
    cr->open->offset = cr->pos;
    return 0;
}

int kd_cr_read(struct kd_container_reader *cr, void *dst, size_t n)
{
    if (!cr->open)
        return kd_fail(-EINVAL, "container reader misuse");
    return take(cr, dst, n);
}

int kd_cr_section_end(struct kd_container_reader *cr)
{
    cr->open = NULL;
    return 0;
}

void kd_cr_expect(struct kd_container_reader *cr, uint64_t end)
{
    if (end > cr->limit)
        cr->limit = end;
}

int kd_cr_need(struct kd_container_reader *cr, uint64_t bytes)
{
    uint64_t size = cr->r->size;
    if (size != KD_SIZE_UNKNOWN && (cr->pos > size || bytes > size - cr->pos))
        return kd_fail(-KD_ECORRUPT,
                       "index data is truncated or its metadata corrupted (%llu bytes, the "
                       "metadata needs at least %llu)",
                       (unsigned long long)size, (unsigned long long)(cr->pos + bytes));
    return 0;
}

int kd_cr_finish(struct kd_container_reader *cr)
{
    uint8_t raw[KD_MAX_SECTIONS * sizeof(struct kd_section) + KD_TAIL_BYTES];
    size_t tbytes = cr->nsections * sizeof(struct kd_section);
    uint64_t table_off = kd_round_up(cr->pos, KD_BLOCK);
    int err = skip_to_block(cr);
    if (!err)
        err = take(cr, raw, tbytes + KD_TAIL_BYTES);
    struct tail t;
    if (!err)
        err = parse_tail(raw + tbytes, cr->version, &t);
    if (!err && (t.table_off != table_off || t.n != cr->nsections))
        err = kd_fail(-KD_ECORRUPT, "index footer is corrupted (bad section table)");
    if (!err && kd_crc32c(0, raw, tbytes) != t.crc)
        err = kd_fail(-KD_ECORRUPT, "index footer is corrupted (checksum mismatch)");
    for (uint32_t i = 0; !err && i < cr->nsections; i++) {
        struct kd_section s;
        const struct kd_section *got = &cr->sections[i];
        memcpy(&s, raw + i * sizeof s, sizeof s);
        if (s.id != got->id || s.offset != got->offset || s.length != got->length || s.reserved ||
            s.reserved2)
            err = kd_fail(-KD_ECORRUPT, "index section %u (%s) does not match the section table",
                          got->id, section_name(got->id));
        else if (s.crc != got->crc)
            err = kd_fail(-KD_ECORRUPT, "index section %u (%s) is corrupted (checksum mismatch)",
                          s.id, section_name(s.id));
    }
    if (!err && cr->r->whole) {
        uint8_t one;
        int64_t r = cr->start < cr->end ? 1 : cr->r->read(cr->r->ctx, &one, 1);
        if (r < 0)
            err = (int)r;
        else if (r > 0)
            err = kd_fail(-KD_ECORRUPT, "unexpected data after the end of the index (byte %llu)",
                          (unsigned long long)cr->pos);
    }
    kd_cr_discard(cr);
    return err;
}

void kd_cr_discard(struct kd_container_reader *cr)
{
    free(cr->buf);
    cr->buf = NULL;
    cr->start = cr->end = cr->cap = 0;
}

/* ---- scanning a section of a mapped file */

#define SCAN_CHUNK (4u << 20)
#define SCAN_AHEAD (8u << 20)

void kd_scanner_init(struct kd_scanner *s, const uint8_t *map, const char *path, int direct)
{
    memset(s, 0, sizeof *s);
    s->map = map;
    s->fd = -1;
    if (!direct || !path || kd_path_in_memory(path))
        return;
    const char *env = getenv("KNNDIRECT_DISABLE_DIRECT_IO");
    if (env && *env && strcmp(env, "0") != 0)
        return;
    s->bounce = kd_alloc_aligned(KD_BLOCK, SCAN_CHUNK + KD_BLOCK);
    if (!s->bounce)
        return;
    s->cap = SCAN_CHUNK + KD_BLOCK;
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
}

void kd_scanner_free(struct kd_scanner *s)
{
    if (s->fd >= 0)
        close(s->fd);
    kd_free_aligned(s->bounce);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

static void will_need(const uint8_t *p, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(page - 1);
    if (n)
        madvise((void *)a, (uintptr_t)p + n - a, MADV_WILLNEED);
}

/* pread all of n bytes at off; 1 when O_DIRECT was refused at read time. */
static int pread_full(int fd, uint8_t *buf, size_t n, uint64_t off, int *refused)
{
    while (n > 0) {
        ssize_t r = pread(fd, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EINVAL) {
            *refused = 1;
            return 0;
        }
        if (r < 0) {
            int e = errno;
            return kd_fail(-e, "reading the index file: %s", strerror(e));
        }
        if (r == 0)
            return kd_fail(-KD_ECORRUPT, "reading the index file: it ended early (truncated "
                                         "while open?)");
        buf += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int kd_scan_section(struct kd_scanner *s, const struct kd_section *sec, int via_map, size_t unit,
                    kd_chunk_fn fn, void *arg)
{
    /* A chunk holds whole units and, for unit = 4w, is a multiple of 4096. */
    size_t per = unit * 1024, chunk = per >= SCAN_CHUNK ? per : SCAN_CHUNK / per * per;
    if (!via_map && s->fd >= 0 && chunk + KD_BLOCK > s->cap) {
        kd_free_aligned(s->bounce);
        s->bounce = kd_alloc_aligned(KD_BLOCK, chunk + KD_BLOCK);
        s->cap = s->bounce ? chunk + KD_BLOCK : 0;
        if (!s->bounce) {
            close(s->fd);
            s->fd = -1;
        }
    }
    const uint8_t *base = s->map + sec->offset;
    uint32_t crc = 0;
    int err = 0;
    if (via_map || s->fd < 0) {
        will_need(base, sec->length < SCAN_AHEAD ? sec->length : SCAN_AHEAD);
        for (uint64_t at = 0; !err && at < sec->length; at += chunk) {
            size_t n = sec->length - at < chunk ? (size_t)(sec->length - at) : chunk;
            uint64_t ahead = at + SCAN_AHEAD;
            if (ahead < sec->length)
                will_need(base + ahead,
                          sec->length - ahead < chunk ? (size_t)(sec->length - ahead) : chunk);
            crc = kd_crc32c(crc, base + at, n);
            if (fn)
                err = fn(arg, base + at, n, at);
        }
    } else {
        for (uint64_t at = 0; !err && at < sec->length; at += chunk) {
            size_t n = sec->length - at < chunk ? (size_t)(sec->length - at) : chunk;
            int refused = 0;
            err = pread_full(s->fd, s->bounce, (size_t)kd_round_up(n, KD_BLOCK), sec->offset + at,
                             &refused);
            if (!err && refused) {
                /* O_DIRECT refused at read time: read through the mapping. */
                close(s->fd);
                s->fd = -1;
                return kd_scan_section(s, sec, 1, unit, fn, arg);
            }
            if (err)
                break;
            crc = kd_crc32c(crc, s->bounce, n);
            if (fn)
                err = fn(arg, s->bounce, n, at);
        }
    }
    if (!err && crc != sec->crc)
        err = kd_fail(-KD_ECORRUPT, "index section %u (%s) is corrupted (checksum mismatch)",
                      sec->id, section_name(sec->id));
    return err;
}

#include "format.h"
#include "common.h"

#include <string.h>

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

/* ---- writing */

static int put(struct kd_container_writer *cw, const void *buf, size_t n)
{
    int err = cw->w->write(cw->w->ctx, buf, n);
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

int kd_cw_begin(struct kd_container_writer *cw, struct kd_writer *w)
{
    memset(cw, 0, sizeof *cw);
    cw->w = w;
    uint8_t head[64] = {0};
    memcpy(head, HEAD_MAGIC, 8);
    uint32_t version = KD_FORMAT_VERSION, block = KD_BLOCK;
    memcpy(head + 8, &version, 4);
    memcpy(head + 12, &block, 4);
    uint32_t crc = kd_crc32c(0, head, 60);
    memcpy(head + 60, &crc, 4);
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
    if (err)
        return err;
    uint8_t tail[KD_TAIL_BYTES];
    uint32_t n = cw->nsections, crc = kd_crc32c(0, cw->sections, tbytes), version = KD_FORMAT_VERSION;
    memcpy(tail, &table_off, 8);
    memcpy(tail + 8, &n, 4);
    memcpy(tail + 12, &crc, 4);
    memcpy(tail + 16, &version, 4);
    memset(tail + 20, 0, 4);
    memcpy(tail + 24, TAIL_MAGIC, 8);
    return put(cw, tail, sizeof tail);
}

/* ---- reading */

int kd_container_parse(struct kd_container *c, const uint8_t *base, uint64_t size,
                       uint32_t skip_verify)
{
    memset(c, 0, sizeof *c);
    c->base = base;
    c->size = size;
    if (size < KD_BLOCK + KD_TAIL_BYTES || memcmp(base, HEAD_MAGIC, 8) != 0)
        return kd_fail(-EINVAL, size >= 8 && memcmp(base, HEAD_MAGIC, 8) == 0
                                    ? "index file is truncated"
                                    : "not a knndirect index (bad magic number)");
    uint32_t version, hcrc;
    memcpy(&version, base + 8, 4);
    memcpy(&hcrc, base + 60, 4);
    if (hcrc != kd_crc32c(0, base, 60))
        return kd_fail(-EINVAL, "index header is corrupted (checksum mismatch)");
    if (version != KD_FORMAT_VERSION)
        return kd_fail(-EINVAL, "unsupported index format version %u (this build reads %u)",
                       version, KD_FORMAT_VERSION);
    const uint8_t *tail = base + size - KD_TAIL_BYTES;
    if (memcmp(tail + 24, TAIL_MAGIC, 8) != 0)
        return kd_fail(-EINVAL, "index file is truncated or corrupted (no footer)");
    uint64_t table_off;
    uint32_t n, tcrc;
    memcpy(&table_off, tail, 8);
    memcpy(&n, tail + 8, 4);
    memcpy(&tcrc, tail + 12, 4);
    if (n == 0 || n > KD_MAX_SECTIONS ||
        table_off + (uint64_t)n * sizeof(struct kd_section) != size - KD_TAIL_BYTES)
        return kd_fail(-EINVAL, "index footer is corrupted (bad section table)");
    memcpy(c->sections, base + table_off, n * sizeof(struct kd_section));
    if (kd_crc32c(0, c->sections, n * sizeof(struct kd_section)) != tcrc)
        return kd_fail(-EINVAL, "index footer is corrupted (checksum mismatch)");
    c->nsections = n;
    for (uint32_t i = 0; i < n; i++) {
        const struct kd_section *s = &c->sections[i];
        if (s->offset % KD_BLOCK || s->offset < KD_BLOCK || s->offset > table_off ||
            s->length > table_off - s->offset)
            return kd_fail(-EINVAL, "index section %u lies outside the file", s->id);
        if (s->id < 32 && (skip_verify >> s->id & 1))
            continue;
        if (kd_crc32c(0, base + s->offset, s->length) != s->crc)
            return kd_fail(-EINVAL, "index section %u is corrupted (checksum mismatch)", s->id);
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

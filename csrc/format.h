/* format.h — the container: one little-endian file of 4 KiB-aligned sections.
 *
 *   [header block: magic, version]           4096 bytes
 *   [section 0][pad to 4096] ... [section n-1][pad to 4096]
 *   [section table: n entries][tail: table offset, count, crc, version, magic]
 *
 * It is written front to back (a non-seekable writer works). Each section has a
 * CRC-32C in the table; the table has its own. */
#ifndef KD_FORMAT_H
#define KD_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "storage.h"

#define KD_FORMAT_VERSION 1
#define KD_BLOCK 4096u
#define KD_MAX_SECTIONS 16

enum kd_section_id {
    KD_SEC_META = 1,
    KD_SEC_IDS = 2,
    KD_SEC_DELETED = 3,
    KD_SEC_CODES = 4,
    KD_SEC_LEVELS = 5,
    KD_SEC_LEVEL0 = 6,
    KD_SEC_UPPER = 7,
    KD_SEC_VECTORS = 8,
};

struct kd_section {
    uint32_t id;
    uint32_t reserved;
    uint64_t offset;
    uint64_t length;
    uint32_t crc;
    uint32_t reserved2;
};

struct kd_container {
    const uint8_t *base;    /* whole file in memory or mapped */
    uint64_t size;
    uint32_t nsections;
    struct kd_section sections[KD_MAX_SECTIONS];
};

uint32_t kd_crc32c(uint32_t crc, const void *buf, size_t n);

/* Streaming writer of a container. */
struct kd_container_writer {
    struct kd_writer *w;
    uint64_t pos;
    uint32_t nsections;
    struct kd_section sections[KD_MAX_SECTIONS];
    struct kd_section *open;    /* section being written */
};

int kd_cw_begin(struct kd_container_writer *cw, struct kd_writer *w);
int kd_cw_section_begin(struct kd_container_writer *cw, uint32_t id);
int kd_cw_write(struct kd_container_writer *cw, const void *buf, size_t n);
int kd_cw_section_end(struct kd_container_writer *cw);
int kd_cw_finish(struct kd_container_writer *cw);

/* Parse the header, tail and table of base[0..size) and verify the checksum of
 * every section except those in skip_verify (a bit per section id). */
int kd_container_parse(struct kd_container *c, const uint8_t *base, uint64_t size,
                       uint32_t skip_verify);
const struct kd_section *kd_container_find(const struct kd_container *c, uint32_t id);
/* Tail size, for readers that fetch the end of a file first. */
#define KD_TAIL_BYTES 32u

#endif

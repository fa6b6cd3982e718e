/* format.h — the container: one little-endian file of 4 KiB-aligned sections.
 *
 *   [header block: magic, version, block size, CRC]   4096 bytes
 *   [section 0][pad to 4096] ... [section n-1][pad to 4096]
 *   [section table: n entries][tail: table offset, count, table CRC, version, magic]
 *
 * It is written front to back (a non-seekable writer works). Each section has a
 * CRC-32C in the table; the table has its own, and so has the header.
 *
 * Three ways to read it:
 *   - kd_container_parse: the whole file in memory or mapped; the table is
 *     found through the tail;
 *   - kd_container_reader: a sequential stream (a pipe works). The caller
 *     names the sections in the order the writer wrote them, reads them, and
 *     the table at the end must agree with what was read, checksums included;
 *   - kd_scan_section: one section of a mapped file, handed over in chunks
 *     while its checksum is computed, read either through the mapping (which
 *     leaves it in the page cache) or with O_DIRECT (which does not).
 *
 * Versions: a file carries the lowest version that holds what it contains
 * (4 for 1-bit codes, whose tails it shortened, refined or not; 5 for 1-bit
 * codes of 256 dimensions or fewer, which it padded to 512 bits; 2 for
 * scalar codes; 3 added refined codes, section 10), so that a build that cannot
 * read a file says so by its version. A reader accepts
 * KD_FORMAT_MIN_VERSION..KD_FORMAT_VERSION; a newer file is refused with a
 * message naming both versions. Bumping the version means keeping a reader
 * for every older one: tests/data holds a golden file that must keep opening.
 *
 * Errors: a truncated, damaged or foreign file (bad magic, a checksum that
 * does not match, a table or tail that disagrees with the file, data that
 * ends early or goes on past the tail) is -KD_ECORRUPT (common.h), raised as
 * knndirect.CorruptIndexError; a version this build does not read and a
 * misuse of the API stay -EINVAL; a failing read passes its own errno on. */
#ifndef KD_FORMAT_H
#define KD_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "storage.h"

#define KD_FORMAT_VERSION 5
#define KD_FORMAT_MIN_VERSION 1
#define KD_FORMAT_PLAIN 2 /* the version of a file with scalar codes */
#define KD_BLOCK 4096u
#define KD_MAX_SECTIONS 16
#define KD_HEADER_BYTES 64u
/* Tail size, for readers that fetch the end of a file first. */
#define KD_TAIL_BYTES 32u

enum kd_section_id {
    KD_SEC_META = 1,
    KD_SEC_IDS = 2,
    KD_SEC_DELETED = 3,
    KD_SEC_CODES = 4,
    KD_SEC_LEVELS = 5,
    KD_SEC_LEVEL0 = 6,
    KD_SEC_UPPER = 7,
    KD_SEC_VECTORS = 8,
    KD_SEC_CALIBRATION = 9, /* format 2: opaque to the core, kept for the Python layer */
    KD_SEC_REFINE = 10,     /* refinements of the codes (quantization "1bit+4bit") */
};

struct kd_section {
    uint32_t id;
    uint32_t reserved;
    uint64_t offset;
    uint64_t length;
    uint32_t crc;
    uint32_t reserved2;
};

/* The section table is written as an array of these: their layout is the
 * file's. The header and tail are packed byte by byte (format.c). */
_Static_assert(sizeof(struct kd_section) == 32, "section entries are stored in files");
_Static_assert(offsetof(struct kd_section, offset) == 8, "section entries are stored in files");
_Static_assert(offsetof(struct kd_section, length) == 16, "section entries are stored in files");
_Static_assert(offsetof(struct kd_section, crc) == 24, "section entries are stored in files");
_Static_assert(KD_HEADER_BYTES <= KD_BLOCK && KD_TAIL_BYTES == 32, "header and tail sizes");

struct kd_container {
    const uint8_t *base; /* whole file in memory or mapped */
    uint64_t size;
    uint32_t version;
    uint32_t nsections;
    struct kd_section sections[KD_MAX_SECTIONS];
};

uint32_t kd_crc32c(uint32_t crc, const void *buf, size_t n);

/* ---- writing: a streaming writer of a container. Small writes are gathered
 * into a buffer, large ones go straight to the writer. */
struct kd_container_writer {
    struct kd_writer *w;
    uint64_t pos;
    uint32_t nsections;
    struct kd_section sections[KD_MAX_SECTIONS];
    struct kd_section *open; /* section being written */
    uint8_t *buf;
    size_t fill, cap;
    uint32_t version;
};

/* version: what the header and tail say, at most KD_FORMAT_VERSION. */
int kd_cw_begin(struct kd_container_writer *cw, struct kd_writer *w, uint32_t version);
int kd_cw_section_begin(struct kd_container_writer *cw, uint32_t id);
int kd_cw_write(struct kd_container_writer *cw, const void *buf, size_t n);
int kd_cw_section_end(struct kd_container_writer *cw);
/* Table and tail, then everything is handed to the writer. */
int kd_cw_finish(struct kd_container_writer *cw);
/* Release the writer after a failure (finish releases it otherwise). */
void kd_cw_discard(struct kd_container_writer *cw);

/* ---- reading a file in memory: header, tail and table of base[0..size),
 * with the checksum of every section verified except those in skip_verify (a
 * bit per section id). */
int kd_container_parse(struct kd_container *c, const uint8_t *base, uint64_t size,
                       uint32_t skip_verify);
const struct kd_section *kd_container_find(const struct kd_container *c, uint32_t id);

/* ---- reading a stream. Damage (truncation, a bad checksum, a table that
 * disagrees, a foreign file) is -KD_ECORRUPT; a failing source passes its own
 * errno on. */
struct kd_container_reader {
    struct kd_reader *r;
    uint64_t pos; /* bytes consumed from the source */
    uint32_t version;
    uint32_t nsections;
    struct kd_section sections[KD_MAX_SECTIONS];
    struct kd_section *open;
    uint8_t *buf; /* bytes read ahead: buf[start..end) */
    size_t start, end, cap;
    uint64_t limit; /* stream bytes known to belong to the index */
};

int kd_cr_begin(struct kd_container_reader *cr, struct kd_reader *r);
/* Start the next section, which must be `id`. */
int kd_cr_section_begin(struct kd_container_reader *cr, uint32_t id);
/* Read n bytes of the open section into dst (NULL: skip them). Large reads
 * land straight in dst. */
int kd_cr_read(struct kd_container_reader *cr, void *dst, size_t n);
int kd_cr_section_end(struct kd_container_reader *cr);
/* The index is known to extend to stream offset `end`: read ahead up to it.
 * (Without it, only what is asked for is read, so that a stream holding more
 * than the index is left right after it.) */
void kd_cr_expect(struct kd_container_reader *cr, uint64_t end);
/* Fail early, before allocating, when the source is known to hold fewer than
 * `bytes` more bytes. */
int kd_cr_need(struct kd_container_reader *cr, uint64_t bytes);
/* Table and tail: they must describe exactly the sections read. For a source
 * that is `whole`, nothing may follow. Releases the buffer. */
int kd_cr_finish(struct kd_container_reader *cr);
void kd_cr_discard(struct kd_container_reader *cr);

/* ---- scanning one section of a mapped file. */
struct kd_scanner {
    const uint8_t *map;
    int fd; /* O_DIRECT descriptor, or -1: read the mapping */
    uint8_t *bounce;
    size_t cap;
};

/* Called with consecutive chunks of a section; every chunk but the last is a
 * multiple of the unit. `at` is the chunk's offset in the section. */
typedef int (*kd_chunk_fn)(void *arg, const uint8_t *p, size_t n, uint64_t at);

/* path: opened with O_DIRECT unless direct is 0 or the file lives in memory;
 * without it (or when the kernel refuses it) sections are read through map. */
void kd_scanner_init(struct kd_scanner *s, const uint8_t *map, const char *path, int direct);
/* Hand the section to fn (may be NULL) and check its CRC. via_map reads it
 * through the mapping, with read-ahead asked a window ahead: the section is
 * then in the page cache. unit is 1 or a multiple of 4. */
int kd_scan_section(struct kd_scanner *s, const struct kd_section *sec, int via_map, size_t unit,
                    kd_chunk_fn fn, void *arg);
void kd_scanner_free(struct kd_scanner *s);

#endif

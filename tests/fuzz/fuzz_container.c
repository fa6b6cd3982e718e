/* fuzz_container.c — libFuzzer harness for the container parser and the index
 * readers: header, footer, section table, metadata, graph and id checks.
 *
 * Every input goes through
 *   - kd_container_parse (every checksum, then none),
 *   - kd_index_load from a memory reader (size known), and from a reader that
 *     hands the bytes over in small uneven pieces,
 *   - kd_index_open on a memfd (the mapped path, checks at open),
 * and an index that any of them accepts is searched (graph, exact, filtered),
 * read (get_vectors), verified and saved again.
 *
 * Input: one flags byte, then the body.
 *   bit 1 (2) clear: the body is a file as is;
 *   bit 1 set:       the body is a compact file: the 64-byte header, a section
 *                    count, then per section id, crc, length (u32 each) and
 *                    its bytes, then the 32-byte tail. The harness lays it out
 *                    (4 KiB-aligned sections, the table) so that mutations hit
 *                    content rather than padding;
 *   bit 2 (4):       (compact) keep the tail's table offset and count as given;
 *   bit 0 (1):       recompute every checksum (header, sections, table), so
 *                    that mutated content reaches the structural checks.
 *
 * Build (clang): see tests/fuzz/run.sh. With -DKD_FUZZ_STANDALONE a main()
 * replays the files named on the command line (any compiler). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"
#include "format.h"
#include "index.h"
#include "storage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_FILE (8u << 20)

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static int grow_to(struct buf *b, size_t n)
{
    if (n > MAX_FILE)
        return -1;
    if (n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n > b->n)
        memset(b->p + b->n, 0, n - b->n);
    b->n = n;
    return 0;
}

static int append(struct buf *b, const void *src, size_t n)
{
    if (n == 0)
        return 0;
    size_t at = b->n;
    if (grow_to(b, at + n))
        return -1;
    memcpy(b->p + at, src, n);
    return 0;
}

/* Lay out a compact body as a container file. */
static int expand(const uint8_t *d, size_t n, int keep_tail, struct buf *out)
{
    struct kd_section table[KD_MAX_SECTIONS];
    memset(table, 0, sizeof table);
    size_t head = n < KD_HEADER_BYTES ? n : KD_HEADER_BYTES;
    if (append(out, d, head) || grow_to(out, KD_BLOCK))
        return -1;
    d += head;
    n -= head;
    uint32_t nsec = 0;
    if (n) {
        nsec = d[0] % (KD_MAX_SECTIONS + 1);
        d++;
        n--;
    }
    uint32_t made = 0;
    for (; made < nsec && n >= 12; made++) {
        uint32_t id = get32(d), crc = get32(d + 4), len = get32(d + 8);
        d += 12;
        n -= 12;
        if (len > n)
            len = (uint32_t)n;
        table[made].id = id;
        table[made].offset = out->n;
        table[made].length = len;
        table[made].crc = crc;
        if (append(out, d, len) || grow_to(out, kd_round_up(out->n, KD_BLOCK)))
            return -1;
        d += len;
        n -= len;
    }
    uint64_t table_off = out->n;
    if (append(out, table, made * sizeof *table))
        return -1;
    uint8_t tail[KD_TAIL_BYTES];
    memset(tail, 0, sizeof tail);
    memcpy(tail + 24, "KNNDEND1", 8);
    put32(tail + 16, KD_FORMAT_VERSION);
    if (n)
        memcpy(tail, d, n < sizeof tail ? n : sizeof tail);
    if (!keep_tail) {
        memcpy(tail, &table_off, 8);
        put32(tail + 8, made);
    }
    return append(out, tail, sizeof tail);
}

/* Make every checksum agree with the bytes, where the structure allows. */
static void repair(uint8_t *p, size_t n)
{
    if (n >= KD_HEADER_BYTES)
        put32(p + KD_HEADER_BYTES - 4, kd_crc32c(0, p, KD_HEADER_BYTES - 4));
    if (n < KD_BLOCK + KD_TAIL_BYTES)
        return;
    uint8_t *tail = p + n - KD_TAIL_BYTES;
    uint64_t table_off;
    memcpy(&table_off, tail, 8);
    uint32_t nsec = get32(tail + 8);
    if (nsec == 0 || nsec > KD_MAX_SECTIONS || table_off > n - KD_TAIL_BYTES ||
        nsec * sizeof(struct kd_section) > n - KD_TAIL_BYTES - table_off)
        return;
    struct kd_section *s = (struct kd_section *)(void *)(p + table_off);
    for (uint32_t i = 0; i < nsec; i++) {
        struct kd_section sec;
        memcpy(&sec, &s[i], sizeof sec);
        if (sec.offset <= table_off && sec.length <= table_off - sec.offset) {
            sec.crc = kd_crc32c(0, p + sec.offset, sec.length);
            memcpy(&s[i], &sec, sizeof sec);
        }
    }
    put32(tail + 12, kd_crc32c(0, p + table_off, nsec * sizeof(struct kd_section)));
}

/* A reader that hands out a few bytes at a time, size unknown to the loader
 * only in `blind` mode (the size known keeps allocations to the input's). */
struct piece_reader {
    const uint8_t *p;
    size_t n, pos;
    uint32_t seed;
};

static int64_t piece_read(void *ctx, void *dst, size_t want)
{
    struct piece_reader *r = ctx;
    r->seed = r->seed * 1103515245u + 12345u;
    size_t step = 1 + (r->seed >> 16) % 9000;
    size_t left = r->n - r->pos;
    size_t n = want < step ? want : step;
    if (n > left)
        n = left;
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return (int64_t)n;
}

static void exercise(struct kd_index *ix)
{
    struct kd_info info;
    kd_index_info(ix, &info);
    uint32_t dim = info.params.dim;
    float *q = malloc(2 * (size_t)dim * sizeof *q);
    float D[2 * 12];
    int64_t I[2 * 12];
    if (!q)
        return;
    for (size_t i = 0; i < 2 * (size_t)dim; i++)
        q[i] = (float)((i * 37) % 11) - 5.0f;
    struct kd_search_params sp = {12, 16, 2.0, 1, 0, 1, NULL, 0};
    kd_index_search(ix, q, 2, &sp, D, I);
    sp.rerank = 0;
    kd_index_search(ix, q, 1, &sp, D, I);
    sp.rerank = 1;
    sp.exact = 1;
    kd_index_search(ix, q, 2, &sp, D, I);
    int64_t filter[4] = {0, 1, 2, -1};
    sp.exact = 0;
    sp.filter = filter;
    sp.nfilter = 4;
    kd_index_search(ix, q, 1, &sp, D, I);
    /* Ids the search returned exist: their vectors can be read. */
    int64_t ids[12];
    size_t n = 0;
    for (int i = 0; i < 12; i++)
        if (I[i] != -1)
            ids[n++] = I[i];
    float *v = malloc((n ? n : 1) * (size_t)dim * sizeof *v);
    if (v) {
        kd_index_get_vectors(ix, ids, n, v, (size_t)dim * sizeof *v);
        free(v);
    }
    kd_index_verify(ix);
    struct kd_writer w;
    struct kd_mem_writer mw;
    kd_mem_writer_init(&w, &mw);
    if (kd_index_save(ix, &w) == 0) {
        /* What was accepted and saved loads back. */
        struct kd_reader r;
        struct kd_mem_reader mr;
        kd_mem_reader_init(&r, &mr, mw.data, mw.size);
        struct kd_index *again = NULL;
        if (kd_index_load(&again, &r) != 0)
            abort();
        kd_index_free(again);
    }
    free(mw.data);
    free(q);
}

static void run_one(const uint8_t *p, size_t n)
{
    struct kd_container c;
    kd_container_parse(&c, p, n, 0);
    kd_container_parse(&c, p, n, ~0u);

    struct kd_reader r;
    struct kd_mem_reader mr;
    kd_mem_reader_init(&r, &mr, p, n);
    struct kd_index *ix = NULL;
    if (kd_index_load(&ix, &r) == 0) {
        exercise(ix);
        kd_index_free(ix);
    }

    struct piece_reader pr = {p, n, 0, (uint32_t)n};
    struct kd_reader rr = {piece_read, NULL, &pr, n, 1};
    ix = NULL;
    if (kd_index_load(&ix, &rr) == 0)
        kd_index_free(ix);

    int fd = memfd_create("kd-fuzz", MFD_CLOEXEC);
    if (fd < 0)
        return;
    if (write(fd, p, n) == (ssize_t)n) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        struct kd_open_params op = {0, KD_IO_PREAD, 4, (n & 1) ? ~0u : 0};
        ix = NULL;
        if (kd_index_open(&ix, path, &op) == 0) {
            exercise(ix);
            kd_index_free(ix);
        }
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    struct buf b = {0};
    if (flags & 2) {
        if (expand(data + 1, size - 1, flags & 4, &b)) {
            free(b.p);
            return 0;
        }
    } else if (append(&b, data + 1, size - 1) || b.n == 0) {
        free(b.p);
        return 0;
    }
    if (flags & 1)
        repair(b.p, b.n);
    run_one(b.p, b.n);
    free(b.p);
    kd_clear_error();
    return 0;
}

#ifdef KD_FUZZ_STANDALONE
int main(int argc, char **argv)
{
    int runs = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 1;
        }
        static uint8_t data[1 << 22];
        size_t n = fread(data, 1, sizeof data, f);
        fclose(f);
        LLVMFuzzerTestOneInput(data, n);
        runs++;
    }
    printf("replayed %d inputs\n", runs);
    return 0;
}
#endif

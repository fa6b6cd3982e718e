/* stress_index.c — the C core (csrc/index.h) driven from several threads and
 * through its error paths, for the sanitizers:
 *
 *   threads  searches from six threads while one adds, removes, saves and
 *            reads vectors (in memory; again with insertion's beam over the
 *            1-bit codes), then six threads searching, reading
 *            vectors and verifying an opened file on every backend while one
 *            removes and resets stats; for ThreadSanitizer (and ASan/UBSan);
 *   leaks    open/close and load/free cycles, searches whose reads fail,
 *            saves that fail, damaged files, merges that succeed, are
 *            cancelled at every step or fail on a read or a write: every path
 *            must free what it took (LeakSanitizer: build with
 *            -fsanitize=address);
 *   bigfile  batch reads of records beyond 2^31 rows and 4 GiB of file
 *            offset, on a sparse file, through every backend.
 *
 * Build (see tests/c/Makefile):
 *   gcc -std=c11 -O1 -g -fsanitize=thread -D_GNU_SOURCE -DKD_HAVE_LIBURING -Icsrc \
 *       csrc/*.c tests/c/stress_index.c -luring -lpthread -lm -o /tmp/stress_index_tsan
 * Run: stress_index [threads|leaks|bigfile|all] [directory for files, default /tmp]
 * Prints "N passed, M failed"; exits 1 on any failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"
#include "format.h"
#include "index.h"
#include "merge.h"
#include "storage.h"
#include "vecio.h"

#include <pthread.h>

static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
#define CHECK_LOCK() pthread_mutex_lock(&report_mu)
#define CHECK_UNLOCK() pthread_mutex_unlock(&report_mu)
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir = "/tmp";

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_float(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Clustered-ish vectors: a few centres plus noise. */
static float *make_vectors(size_t n, uint32_t dim, uint64_t seed)
{
    float *x = malloc(n * dim * sizeof *x);
    float centres[8][256];
    uint64_t s = seed;
    for (int c = 0; c < 8; c++)
        for (uint32_t j = 0; j < dim && j < 256; j++)
            centres[c][j] = 3.0f * rng_float(&s);
    for (size_t i = 0; i < n; i++) {
        int c = (int)(rng_next(&s) % 8);
        for (uint32_t j = 0; j < dim; j++)
            x[i * dim + j] = centres[c][j % 256] + rng_float(&s);
    }
    return x;
}

/* The errno of a damaged file: KD_ECORRUPT; the container layer's own
 * checks (format.c) may still report EINVAL. */
static int damaged(int err) { return err == -KD_ECORRUPT || err == -EINVAL; }

static int make_index(struct kd_index **ix, uint32_t dim, int metric, const float *x, size_t n,
                      int64_t first_id)
{
    struct kd_index_params p = {dim, metric, 8, 40, KD_Q_1BIT, 7};
    int err = kd_index_create(ix, &p);
    if (err)
        return err;
    int64_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = first_id + (int64_t)i;
    err = kd_index_add(*ix, x, n, ids, 2);
    free(ids);
    return err;
}

/* ------------------------------------------------------------------ threads */

#define DIM 32
#define N0 2000
#define ROUNDS 16
#define ADD_PER_ROUND 100
#define REMOVE_PER_ROUND 40
#define MAX_IDS (N0 + ROUNDS * ADD_PER_ROUND)

struct shared {
    struct kd_index *ix;
    const float *x;
    uint64_t gen;   /* removes completed */
    uint64_t slots; /* ids handed out so far */
    int stop;
    int on_disk;
    int merge;                    /* the writer merges the index too */
    uint64_t removed_at[MAX_IDS]; /* generation from which an id is gone; 0: live */
};

struct reader {
    struct shared *sh;
    int id;
    uint64_t searches, bad_ids, errors, back;
};

static void *reader_main(void *p)
{
    struct reader *r = p;
    struct shared *sh = r->sh;
    uint64_t s = 1000 + (uint64_t)r->id;
    float D[4 * 32];
    int64_t I[4 * 32];
    int64_t filter[300];
    while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        uint64_t g0 = __atomic_load_n(&sh->gen, __ATOMIC_ACQUIRE);
        uint64_t slots = __atomic_load_n(&sh->slots, __ATOMIC_ACQUIRE);
        size_t nq = 1 + rng_next(&s) % 4, k = 1 + rng_next(&s) % 32;
        const float *q = sh->x + (rng_next(&s) % (MAX_IDS - nq)) * DIM;
        struct kd_search_params sp = {k, 0, 0, 1, 0, (unsigned)(1 + rng_next(&s) % 2), NULL, 0};
        switch (rng_next(&s) % 4) {
        case 1:
            sp.exact = 1;
            break;
        case 2:
            sp.rerank = 0;
            break;
        case 3:
            for (int i = 0; i < 300; i++)
                filter[i] = (int64_t)(rng_next(&s) % MAX_IDS);
            sp.filter = filter;
            sp.nfilter = 300;
            break;
        }
        int err = kd_index_search(sh->ix, q, nq, &sp, D, I);
        r->searches++;
        if (err) {
            r->errors++;
            continue;
        }
        for (size_t i = 0; i < nq * k; i++) {
            if (I[i] == -1)
                continue;
            if (I[i] < 0 || (uint64_t)I[i] >= MAX_IDS) {
                r->bad_ids++;
                continue;
            }
            uint64_t at = __atomic_load_n(&sh->removed_at[I[i]], __ATOMIC_ACQUIRE);
            if (at && at <= g0)
                r->back++;
            (void)slots;
        }
        if (rng_next(&s) % 8 == 0) {
            /* Vectors of ids that may be removed meanwhile: found or -ESRCH. */
            int64_t ids[16];
            float out[16 * DIM];
            for (int i = 0; i < 16; i++)
                ids[i] = (int64_t)(rng_next(&s) % (slots ? slots : 1));
            err = kd_index_get_vectors(sh->ix, ids, 16, out, DIM * sizeof(float));
            if (err && err != -ESRCH)
                r->errors++;
            if (!err)
                for (int i = 0; i < 16; i++)
                    if (memcmp(out + i * DIM, sh->x + ids[i] * DIM, DIM * sizeof(float)) != 0)
                        r->bad_ids++;
        }
        if (rng_next(&s) % 16 == 0) {
            struct kd_info info;
            struct kd_stats st;
            kd_index_info(sh->ix, &info);
            kd_index_stats(sh->ix, &st, rng_next(&s) % 2);
            (void)kd_index_count(sh->ix);
        }
        if (sh->on_disk && rng_next(&s) % 64 == 0 && kd_index_verify(sh->ix) != 0)
            r->errors++;
    }
    return NULL;
}

static void run_readers(struct shared *sh, void (*writer)(struct shared *), const char *what)
{
    enum { NR = 6 };
    pthread_t t[NR];
    struct reader r[NR];
    for (int i = 0; i < NR; i++) {
        r[i] = (struct reader){sh, i, 0, 0, 0, 0};
        pthread_create(&t[i], NULL, reader_main, &r[i]);
    }
    writer(sh);
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
    uint64_t searches = 0, bad = 0, errors = 0, back = 0;
    for (int i = 0; i < NR; i++) {
        pthread_join(t[i], NULL);
        searches += r[i].searches;
        bad += r[i].bad_ids;
        errors += r[i].errors;
        back += r[i].back;
    }
    printf("%s: %llu searches\n", what, (unsigned long long)searches);
    CHECK(searches > 20, "%s: only %llu searches ran", what, (unsigned long long)searches);
    CHECK(errors == 0, "%s: %llu calls failed", what, (unsigned long long)errors);
    CHECK(bad == 0, "%s: %llu ids or vectors were wrong", what, (unsigned long long)bad);
    CHECK(back == 0, "%s: %llu removed ids came back", what, (unsigned long long)back);
}

/* Remove n live ids (tombstones); publish them once remove has returned. */
static void remove_some(struct shared *sh, uint64_t *s, size_t n)
{
    int64_t ids[64];
    size_t got = 0;
    uint64_t slots = __atomic_load_n(&sh->slots, __ATOMIC_RELAXED);
    while (got < n) {
        int64_t id = (int64_t)(rng_next(s) % slots);
        int dup = 0;
        for (size_t i = 0; i < got; i++)
            dup |= ids[i] == id;
        if (!dup && !__atomic_load_n(&sh->removed_at[id], __ATOMIC_RELAXED))
            ids[got++] = id;
    }
    int err = kd_index_remove(sh->ix, ids, n);
    CHECK(err == 0, "remove");
    uint64_t g = __atomic_load_n(&sh->gen, __ATOMIC_RELAXED) + 1;
    for (size_t i = 0; i < n; i++)
        __atomic_store_n(&sh->removed_at[ids[i]], g, __ATOMIC_RELEASE);
    __atomic_store_n(&sh->gen, g, __ATOMIC_RELEASE);
}

/* A merge of the index alone holds its read lock and reads its vectors,
 * graph and codes while the searches run. */
static void merge_during_searches(struct shared *sh)
{
    char path[256];
    snprintf(path, sizeof path, "%s/stress_merge_%d.kdx", dir, (int)getpid());
    struct kd_merge_params mp = {2, 0, 5, NULL, NULL};
    struct kd_merge_report rep;
    int err = kd_merge(path, &sh->ix, 1, &mp, &rep);
    CHECK(err == 0 && rep.rows_written == kd_index_count(sh->ix), "merge during searches");
    unlink(path);
}

static void memory_writer(struct shared *sh)
{
    uint64_t s = 77;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t first = __atomic_load_n(&sh->slots, __ATOMIC_RELAXED);
        int64_t ids[ADD_PER_ROUND];
        for (int i = 0; i < ADD_PER_ROUND; i++)
            ids[i] = (int64_t)first + i;
        int err = kd_index_add(sh->ix, sh->x + first * DIM, ADD_PER_ROUND, ids, 2);
        CHECK(err == 0, "add round %d", round);
        __atomic_store_n(&sh->slots, first + ADD_PER_ROUND, __ATOMIC_RELEASE);
        remove_some(sh, &s, REMOVE_PER_ROUND);
        /* A save to memory holds the read lock while searches run. */
        struct kd_writer w;
        struct kd_mem_writer mw;
        kd_mem_writer_init(&w, &mw);
        err = kd_index_save(sh->ix, &w);
        CHECK(err == 0 && mw.size > 0, "save to memory during searches");
        free(mw.data);
        if (round % 8 == 3)
            merge_during_searches(sh);
    }
}

static void disk_writer(struct shared *sh)
{
    uint64_t s = 78;
    for (int round = 0; round < ROUNDS; round++) {
        remove_some(sh, &s, 20);
        struct kd_stats st;
        kd_index_stats(sh->ix, &st, 1);
        if (round % 8 == 5 && sh->merge)
            merge_during_searches(sh);
        usleep(5000);
    }
}

/* beam: the cache taken as 1 byte, so that every add's insertion runs its
 * beam over the 1-bit codes (kd_beam_pays); only the in-memory part. */
static void test_threads(int beam)
{
    struct shared *sh = calloc(1, sizeof *sh);
    float *x = make_vectors(MAX_IDS, DIM, 11);
    sh->x = x;
    kd_set_llc_bytes(beam ? 1 : 0);
    int err = make_index(&sh->ix, DIM, KD_L2, x, N0, 0);
    CHECK(err == 0, "build");
    if (err) {
        kd_set_llc_bytes(0);
        free(x);
        free(sh);
        return;
    }
    sh->slots = N0;
    run_readers(sh, memory_writer,
                beam ? "in memory, adds through the 1-bit beam" : "in memory, adds and removes");
    kd_set_llc_bytes(0);
    CHECK(kd_index_count(sh->ix) == MAX_IDS - ROUNDS * REMOVE_PER_ROUND, "live count %llu",
          (unsigned long long)kd_index_count(sh->ix));
    if (beam) {
        kd_index_free(sh->ix);
        free(x);
        free(sh);
        return;
    }

    char path[256];
    snprintf(path, sizeof path, "%s/stress_index_%d.kdx", dir, (int)getpid());
    err = kd_index_save_path(sh->ix, path);
    CHECK(err == 0, "save %s", path);
    kd_index_free(sh->ix);
    static const int backends[] = {KD_IO_URING, KD_IO_THREADS, KD_IO_PREAD, KD_IO_MMAP};
    for (size_t b = 0; !err && b < sizeof backends / sizeof *backends; b++) {
        if (backends[b] == KD_IO_URING && !kd_vecio_have_uring())
            continue;
        struct kd_open_params op = {1, backends[b], 32, 0};
        struct kd_index *ix = NULL;
        int e = kd_index_open(&ix, path, &op);
        if (e && backends[b] == KD_IO_URING) {
            printf("io_uring unavailable here: %s\n", kd_last_error());
            continue;
        }
        CHECK(e == 0, "open %s with %s", path, kd_io_backend_name(backends[b]));
        if (e)
            continue;
        uint64_t gen = sh->gen;
        sh->ix = ix;
        sh->stop = 0;
        sh->on_disk = 1;
        /* Not beside io_uring readers: a merge's stream ring, unmapped, and a
         * reader's new ring at the same address look to ThreadSanitizer like
         * a race in the order tsan.supp cannot match (its entry 1). */
        sh->merge = backends[b] != KD_IO_URING;
        char what[64];
        snprintf(what, sizeof what, "opened (%s), removes", kd_io_backend_name(backends[b]));
        run_readers(sh, disk_writer, what);
        kd_index_free(ix);
        /* The removes of one backend's run are in memory only: forget them. */
        for (uint64_t i = 0; i < MAX_IDS; i++)
            if (sh->removed_at[i] > gen)
                sh->removed_at[i] = 0;
        sh->gen = gen;
    }
    unlink(path);
    free(x);
    free(sh);
}

/* ------------------------------------------------------------------ leaks */

static int cancel_after;

/* Counts its calls; cancels the merge at call number cancel_after. */
static int count_calls(void *arg, uint64_t done, uint64_t total)
{
    int *calls = arg;
    return ++*calls == cancel_after;
}

static int gone(const char *path) { return access(path, F_OK) != 0 && errno == ENOENT; }

/* Merges of an opened index (some rows removed) and an in-memory segment:
 * one that succeeds, then cancels at every progress call, failing reads and
 * writes, one re-encoding every row with the caller's quantizer (and
 * failing reads under it), a misfit input and a misfit quantizer. No path
 * may leave memory or a file behind. */
static void merge_leaks(const char *from, const float *x, uint32_t dim, size_t n)
{
    struct kd_open_params op = {1, KD_IO_AUTO, 16, 0};
    struct kd_index *o = NULL, *seg = NULL, *odd = NULL, *fine = NULL;
    struct kd_index_params p = {dim, KD_COSINE, 8, 40, KD_Q_1BIT, 7};
    int64_t ids[300], gone_ids[200];
    for (int i = 0; i < 300; i++)
        ids[i] = 100000 + i;
    for (int i = 0; i < 200; i++)
        gone_ids[i] = 1000 + 3 * i;
    int err = kd_index_open(&o, from, &op);
    if (!err)
        err = kd_index_remove(o, gone_ids, 200);
    if (!err)
        err = kd_index_create(&seg, &p);
    if (!err)
        err = kd_index_adopt_quantizer(seg, o);
    if (!err)
        err = kd_index_add(seg, x, 300, ids, 2);
    CHECK(err == 0, "merge inputs");
    char path[256];
    snprintf(path, sizeof path, "%s/stress_merged_%d.kdx", dir, (int)getpid());
    struct kd_index *in[2] = {seg, o};
    int calls = 0;
    struct kd_merge_params mp = {2, 0, 9, count_calls, &calls};
    struct kd_merge_report rep;
    cancel_after = 0;
    err = err ? err : kd_merge(path, in, 2, &mp, &rep);
    CHECK(err == 0 && rep.rows_written == n - 200 + 300 && rep.base == 1, "merge");
    struct kd_index *m = NULL;
    CHECK(err == 0 && kd_index_open(&m, path, &op) == 0 && kd_index_verify(m) == 0,
          "open and verify the merged file");
    kd_index_free(m);
    unlink(path);
    int steps = calls;
    for (cancel_after = 1; !err && cancel_after <= steps; cancel_after++) {
        calls = 0;
        CHECK(kd_merge(path, in, 2, &mp, &rep) == -ECANCELED && gone(path), "cancel at %d of %d",
              cancel_after, steps);
    }
    mp.progress = NULL;
    for (int cycle = 0; !err && cycle < 4; cycle++) {
        /* Each of the three passes over the vectors reads: fail any. */
        kd_fault_arm(cycle % 2 ? KD_FAULT_READ_EOF : KD_FAULT_READ_EIO, (uint64_t)(cycle % 3), -1);
        int e = kd_merge(path, in, 2, &mp, &rep);
        kd_fault_arm(KD_FAULT_NONE, 0, 0);
        CHECK(e < 0 && gone(path), "merge with failing reads: %d", e);
        /* A file this small goes out in one write. */
        kd_fault_arm(cycle % 2 ? KD_FAULT_WRITE_ENOSPC : KD_FAULT_WRITE_EIO, 0, 1);
        e = kd_merge(path, in, 2, &mp, &rep);
        kd_fault_arm(KD_FAULT_NONE, 0, 0);
        CHECK(e < 0 && gone(path), "merge with a failing write: %d", e);
    }
    if (!err && kd_index_create(&fine, &p) == 0 && kd_index_train(fine, x, 300) == 0) {
        mp.quantizer = fine;
        CHECK(kd_merge(path, in, 2, &mp, &rep) == 0 && rep.codes_reencoded == rep.rows_written,
              "merge with the caller's quantizer");
        unlink(path);
        kd_fault_arm(KD_FAULT_READ_EIO, 0, -1);
        int e = kd_merge(path, in, 2, &mp, &rep);
        kd_fault_arm(KD_FAULT_NONE, 0, 0);
        CHECK(e < 0 && gone(path), "re-encoding merge with failing reads: %d", e);
        mp.quantizer = NULL;
    }
    kd_index_free(fine);
    if (!err && kd_index_create(&odd, &p) == 0 && kd_index_adopt_quantizer(odd, o) == 0) {
        int64_t twice = 1001; /* live in o as well: refused before anything is written */
        CHECK(kd_index_add(odd, x, 1, &twice, 1) == 0, "add");
        struct kd_index *dup[2] = {o, odd};
        CHECK(kd_merge(path, dup, 2, &mp, &rep) == -EEXIST && gone(path), "an id live twice");
        kd_index_free(odd);
        odd = NULL;
    }
    p.dim = dim + 1;
    if (!err && kd_index_create(&odd, &p) == 0) {
        struct kd_index *bad[3] = {o, seg, odd};
        CHECK(kd_merge(path, bad, 3, &mp, &rep) == -EINVAL && gone(path), "misfit input");
        bad[2] = o;
        CHECK(kd_merge(path, bad, 3, &mp, &rep) == -EINVAL, "an input twice");
        mp.quantizer = odd;
        CHECK(kd_merge(path, in, 2, &mp, &rep) == -EINVAL && gone(path), "misfit quantizer");
        mp.quantizer = NULL;
    }
    kd_index_free(odd);
    kd_index_free(seg);
    kd_index_free(o);
}

static void test_leaks(void)
{
    const uint32_t dim = 24;
    const size_t n = 1500;
    float *x = make_vectors(n, dim, 21);
    struct kd_index *ix = NULL;
    int err = make_index(&ix, dim, KD_COSINE, x, n, 1000);
    CHECK(err == 0, "build");
    if (err) {
        free(x);
        return;
    }
    char path[256], bad[280];
    snprintf(path, sizeof path, "%s/stress_leaks_%d.kdx", dir, (int)getpid());
    CHECK(kd_index_save_path(ix, path) == 0, "save");
    struct kd_writer w;
    struct kd_mem_writer mw;
    kd_mem_writer_init(&w, &mw);
    CHECK(kd_index_save(ix, &w) == 0, "save to memory");

    float D[10];
    int64_t I[10];
    struct kd_search_params sp = {10, 0, 0, 1, 0, 1, NULL, 0};
    static const int backends[] = {KD_IO_AUTO, KD_IO_URING, KD_IO_THREADS, KD_IO_PREAD, KD_IO_MMAP};
    for (int cycle = 0; cycle < 60; cycle++) {
        int be = backends[cycle % 5];
        if (be == KD_IO_URING && !kd_vecio_have_uring())
            be = KD_IO_THREADS;
        struct kd_open_params op = {cycle % 2, be, 16, cycle % 3 ? 0 : ~0u};
        struct kd_index *o = NULL;
        err = kd_index_open(&o, path, &op);
        if (err && be == KD_IO_URING) {
            op.io_backend = KD_IO_THREADS;
            err = kd_index_open(&o, path, &op);
        }
        CHECK(err == 0, "open cycle %d", cycle);
        if (err)
            continue;
        CHECK(kd_index_search(o, x + cycle * dim, 1, &sp, D, I) == 0, "search");
        /* Failing reads, on every other cycle: the error path frees too. */
        if (be != KD_IO_MMAP && cycle % 2) {
            kd_fault_arm(cycle % 4 == 1 ? KD_FAULT_READ_EIO : KD_FAULT_READ_EOF, 0, -1);
            CHECK(kd_index_search(o, x, 1, &sp, D, I) == -EIO, "search with failing reads");
            struct kd_search_params ex = sp;
            ex.exact = 1;
            CHECK(kd_index_search(o, x, 1, &ex, D, I) == -EIO, "exact with failing reads");
            int64_t ids[3] = {1000, 1001, 1002};
            float v[3 * 24];
            CHECK(kd_index_get_vectors(o, ids, 3, v, sizeof(float) * dim) == -EIO,
                  "get_vectors with failing reads");
            CHECK(kd_index_verify(o) == -EIO, "verify with failing reads");
            kd_fault_arm(KD_FAULT_NONE, 0, 0);
            CHECK(kd_index_search(o, x, 1, &sp, D, I) == 0, "search after the fault");
        }
        kd_index_free(o);
    }
    for (int cycle = 0; cycle < 30; cycle++) {
        struct kd_reader r;
        struct kd_mem_reader mr;
        kd_mem_reader_init(&r, &mr, mw.data, mw.size);
        struct kd_index *l = NULL;
        CHECK(kd_index_load(&l, &r) == 0, "load from memory");
        kd_index_free(l);
        /* Damaged copies: a flipped byte, a truncation. */
        uint8_t *copy = malloc(mw.size);
        memcpy(copy, mw.data, mw.size);
        size_t at = (size_t)(cycle * 7919) % mw.size;
        copy[at] ^= 0x40;
        kd_mem_reader_init(&r, &mr, copy, cycle % 2 ? mw.size : at);
        l = NULL;
        err = kd_index_load(&l, &r);
        /* A truncation always fails; a flip may land in padding between sections. */
        CHECK(damaged(err) || (err == 0 && cycle % 2), "damaged load: %d", err);
        if (err == 0)
            kd_index_free(l);
        free(copy);
    }
    /* A damaged file opened from disk. */
    snprintf(bad, sizeof bad, "%s.bad", path);
    for (int cycle = 0; cycle < 10; cycle++) {
        FILE *f = fopen(bad, "wb");
        size_t cut = cycle % 2 ? mw.size : mw.size / (size_t)(cycle + 2);
        fwrite(mw.data, 1, cut, f);
        if (cycle % 2) {
            fseek(f, (long)((size_t)(cycle * 4099) % mw.size), SEEK_SET);
            fputc(0x5a, f);
        }
        fclose(f);
        struct kd_open_params op = {1, KD_IO_AUTO, 16, 0};
        struct kd_index *o = NULL;
        err = kd_index_open(&o, bad, &op);
        CHECK(damaged(err) || (err == 0 && cycle % 2), "open of a damaged file: %d", err);
        if (err == 0) { /* a flip in the vectors is found by verify, one in padding is harmless */
            err = kd_index_verify(o);
            CHECK(err == 0 || damaged(err), "verify of a damaged file: %d", err);
            CHECK(kd_index_search(o, x, 1, &sp, D, I) == 0, "search of a damaged file");
        }
        kd_index_free(o);
    }
    unlink(bad);
    merge_leaks(path, x, dim, n);
    /* Saves that fail midway. */
    for (int cycle = 0; cycle < 6; cycle++) {
        kd_fault_arm(cycle % 2 ? KD_FAULT_WRITE_ENOSPC : KD_FAULT_WRITE_EIO, 0, 1);
        CHECK(kd_index_save_path(ix, path) < 0, "failing save");
        kd_fault_arm(KD_FAULT_NONE, 0, 0);
    }
    kd_index_free(ix);
    free(mw.data);
    unlink(path);
    free(x);
}

/* ------------------------------------------------------------------ bigfile */

static void put_record(int fd, uint64_t offset, uint32_t stride, uint32_t rb, uint64_t row)
{
    uint8_t buf[4096];
    for (uint32_t j = 0; j < rb; j++)
        buf[j] = (uint8_t)((row * 31 + j * 7 + (row >> 32)) & 0xff);
    ssize_t w = pwrite(fd, buf, rb, (off_t)(offset + row * stride));
    CHECK(w == (ssize_t)rb, "pwrite row %llu", (unsigned long long)row);
}

static int record_ok(const uint8_t *p, uint32_t rb, uint64_t row)
{
    for (uint32_t j = 0; j < rb; j++)
        if (p[j] != (uint8_t)((row * 31 + j * 7 + (row >> 32)) & 0xff))
            return 0;
    return 1;
}

static void big_case(uint64_t offset, uint32_t stride, uint32_t rb, uint64_t count,
                     const uint64_t *rows, size_t nrows)
{
    char path[256];
    snprintf(path, sizeof path, "%s/stress_big_%d.bin", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(fd >= 0, "create %s", path);
    if (fd < 0)
        return;
    uint64_t size = offset + count * stride;
    if (ftruncate(fd, (off_t)size) != 0) {
        printf("bigfile: cannot make a sparse file of %llu bytes in %s (%s): skipped\n",
               (unsigned long long)size, dir, strerror(errno));
        close(fd);
        unlink(path);
        return;
    }
    for (size_t i = 0; i < nrows; i++)
        put_record(fd, offset, stride, rb, rows[i]);
    fsync(fd);
    close(fd);
    static const int backends[] = {KD_IO_URING, KD_IO_THREADS, KD_IO_PREAD, KD_IO_MMAP};
    uint8_t *dst = kd_alloc_aligned(4096, (nrows + 2) * 4096 * 2);
    for (size_t b = 0; b < sizeof backends / sizeof *backends; b++) {
        if (backends[b] == KD_IO_URING && !kd_vecio_have_uring())
            continue;
        struct kd_vecio_config cfg = {path, offset, count, stride, rb, backends[b], 1, 8};
        struct kd_vecio *v = NULL;
        int err = kd_vecio_open(&v, &cfg);
        if (err && backends[b] == KD_IO_URING)
            continue;
        CHECK(err == 0, "open %s with %s", path, kd_io_backend_name(backends[b]));
        if (err)
            continue;
        size_t ds = stride >= 4096 ? stride : 4096;
        struct kd_io_counters c;
        err = kd_vecio_read(v, rows, nrows, dst, ds, &c);
        CHECK(err == 0, "read of far rows (%s)", kd_io_backend_name(backends[b]));
        for (size_t i = 0; !err && i < nrows; i++)
            CHECK(record_ok(dst + i * ds, rb, rows[i]), "row %llu at file offset %llu (%s)",
                  (unsigned long long)rows[i], (unsigned long long)(offset + rows[i] * stride),
                  kd_io_backend_name(backends[b]));
        /* A range read around each far row. */
        for (size_t i = 0; i < nrows; i++) {
            uint64_t first = rows[i] > 0 ? rows[i] - 1 : 0;
            uint64_t m = first + 3 <= count ? 3 : count - first;
            err = kd_vecio_read_range(v, first, m, dst, &c);
            CHECK(err == 0, "range read at row %llu", (unsigned long long)first);
            if (!err)
                CHECK(record_ok(dst + (rows[i] - first) * stride, rb, rows[i]),
                      "range row %llu (%s)", (unsigned long long)rows[i],
                      kd_io_backend_name(backends[b]));
        }
        /* A stream over the last records. */
        struct kd_vecio_stream *st = NULL;
        uint64_t tail = count > 1000 ? 1000 : count;
        err = kd_vecio_stream_open(v, count - tail, tail, &st);
        CHECK(err == 0, "stream open");
        if (!err) {
            const void *buf;
            uint64_t first, seen = 0;
            int64_t got;
            while ((got = kd_vecio_stream_next(st, &buf, &first, &c)) > 0) {
                if (first + (uint64_t)got == count)
                    CHECK(record_ok((const uint8_t *)buf + (count - 1 - first) * stride, rb,
                                    count - 1),
                          "streamed last row");
                seen += (uint64_t)got;
            }
            CHECK(got == 0 && seen == tail, "stream of the tail: %lld, %llu", (long long)got,
                  (unsigned long long)seen);
            kd_vecio_stream_close(st);
        }
        kd_vecio_close(v);
    }
    kd_free_aligned(dst);
    unlink(path);
}

static void test_bigfile(void)
{
    /* Small records: 2^32 + 100 rows of 16 bytes (a 64 GiB sparse file), rows
     * on both sides of 2^31 and 2^32, offsets beyond 4 GiB. */
    uint64_t count = (1ull << 32) + 100;
    uint64_t rows[] = {0,          (1ull << 31) - 1, 1ull << 31, (1ull << 31) + 7, (1ull << 32) - 1,
                       1ull << 32, (1ull << 32) + 3, count - 1};
    big_case(4096, 16, 16, count, rows, sizeof rows / sizeof *rows);
    /* Whole-block records past 4 GiB (zero-copy O_DIRECT reads), with the
     * section itself starting beyond 4 GiB. */
    uint64_t rows2[] = {0, 1ull << 20, (1ull << 21) - 1};
    big_case((5ull << 30), 4096, 4096, 1ull << 21, rows2, 3);
    /* Records straddling nothing but not block-sized: 3 KiB in 4 KiB slots. */
    uint64_t rows3[] = {5, 1ull << 20, (3ull << 19) + 1, (3ull << 20) - 1};
    big_case(8192, 4096, 3072, 3ull << 20, rows3, 4);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "threads";
    if (argc > 2)
        dir = argv[2];
    int all = strcmp(mode, "all") == 0;
    if (all || strcmp(mode, "threads") == 0) {
        test_threads(0);
        test_threads(1);
    }
    if (all || strcmp(mode, "leaks") == 0)
        test_leaks();
    if (all || strcmp(mode, "bigfile") == 0)
        test_bigfile();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

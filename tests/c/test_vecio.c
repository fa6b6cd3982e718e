/* test_vecio.c — standalone test of the batch reader, csrc/vecio*.c.
 *
 * Build and run from the repository root (see tests/c/Makefile):
 *   gcc -O2 -g -Wall -Wextra -std=c11 -DKD_HAVE_LIBURING -fsanitize=address,undefined \
 *       -Icsrc csrc/common.c csrc/vecio*.c tests/c/test_vecio.c -luring -lpthread -ldl \
 *       -o /tmp/test_vecio && /tmp/test_vecio
 * and once without -DKD_HAVE_LIBURING / -luring. Files go to /tmp (O_DIRECT)
 * and /dev/shm (tmpfs: the buffered fallback). pread and liburing's submit calls
 * are interposed to see every O_DIRECT read's buffer (link with -ldl). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"
#include "vecio.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dlfcn.h>
#include <stdatomic.h>
#ifdef KD_HAVE_LIBURING
#include <liburing.h>
#endif

/* ---- Every O_DIRECT read's buffer, seen on its way to the kernel.
 * pread and liburing's submit calls are interposed: a read that fits in a
 * page must not cross one, a longer one must start on a page (vecio_backend.h,
 * KD_PAGE_ALIGN: a buffer straddling pages costs the device a segment). */
static atomic_ulong n_direct_seen, n_page_crossing;
static atomic_int watching; /* test_configs only: no short reads resumed mid-buffer */

static void see_read(int fd, uintptr_t buf, size_t len)
{
    int fl = atomic_load(&watching) ? fcntl(fd, F_GETFL) : -1;
    if (fl < 0 || !(fl & O_DIRECT))
        return;
    uintptr_t in_page = buf % 4096;
    atomic_fetch_add(&n_direct_seen, 1);
    if (in_page != 0 && in_page + len > 4096) {
        if (atomic_fetch_add(&n_page_crossing, 1) == 0)
            printf("  O_DIRECT read of %zu bytes at buffer offset %lu in its page\n", len,
                   (unsigned long)in_page);
    }
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    see_read(fd, (uintptr_t)buf, n);
    return syscall(SYS_pread64, fd, buf, n, off);
}

#ifdef KD_HAVE_LIBURING
static void see_sqes(struct io_uring *ring)
{
    unsigned mask = *ring->sq.kring_mask;
    for (unsigned h = ring->sq.sqe_head; h != ring->sq.sqe_tail; h++) {
        const struct io_uring_sqe *sqe = &ring->sq.sqes[h & mask];
        if (sqe->opcode == IORING_OP_READ)
            see_read(sqe->fd, (uintptr_t)sqe->addr, sqe->len);
    }
}

int io_uring_submit(struct io_uring *ring)
{
    static int (*real)(struct io_uring *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "io_uring_submit");
    see_sqes(ring);
    return real(ring);
}

int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
    static int (*real)(struct io_uring *, unsigned);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "io_uring_submit_and_wait");
    see_sqes(ring);
    return real(ring, wait_nr);
}
#endif

#define HEADER 4096u
#define PAD_BYTE 0xAB

/* Byte j of record r: differs between rows and positions. */
static uint8_t pat(uint64_t r, uint32_t j)
{
    uint64_t x = (r + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)j * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    x *= 0x94D049BB133111EBull;
    return (uint8_t)(x >> 32);
}

static void fill_record(uint8_t *p, uint64_t r, uint32_t rb)
{
    for (uint32_t j = 0; j < rb; j++)
        p[j] = pat(r, j);
}

static int record_ok(const uint8_t *p, uint64_t r, uint32_t rb)
{
    for (uint32_t j = 0; j < rb; j++)
        if (p[j] != pat(r, j))
            return 0;
    return 1;
}

/* Header, then count records with padding, the file ending right after the
 * last record's payload (so a full-stride read of it crosses EOF). */
static int make_file(const char *dir, uint32_t rb, uint32_t stride, uint64_t count, char *path,
                     size_t plen)
{
    snprintf(path, plen, "%s/kd_vecio_test_XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return -errno;
    size_t size = HEADER + (size_t)(count - 1) * stride + rb;
    uint8_t *buf = malloc(size);
    memset(buf, 0xEE, HEADER);
    for (uint64_t r = 0; r < count; r++) {
        uint8_t *p = buf + HEADER + r * stride;
        fill_record(p, r, rb);
        if (r + 1 < count)
            memset(p + rb, PAD_BYTE, stride - rb);
    }
    ssize_t w = pwrite(fd, buf, size, 0);
    free(buf);
    close(fd);
    return w == (ssize_t)size ? 0 : -EIO;
}

static struct kd_vecio_config base_cfg(const char *path, uint32_t rb, uint32_t stride,
                                       uint64_t count, int backend, int direct, unsigned depth)
{
    struct kd_vecio_config c = {
        .path = path,
        .offset = HEADER,
        .count = count,
        .stride = stride,
        .record_bytes = rb,
        .backend = backend,
        .direct_io = direct,
        .io_depth = depth,
    };
    return c;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Shuffled rows with repeats, always including the first and the last. */
static void make_rows(uint64_t *rows, size_t n, uint64_t count, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++)
        rows[i] = rng_next(&s) % count;
    if (n > 2) {
        rows[n / 3] = count - 1;
        rows[n / 2] = 0;
        rows[n - 1] = rows[1]; /* a repeat */
    }
}

static const int all_backends[] = {KD_IO_URING, KD_IO_THREADS, KD_IO_PREAD, KD_IO_MMAP};

/* Batch reads of one open handle in every buffer layout. */
static void check_reads(struct kd_vecio *v, const char *what, uint32_t rb, uint32_t stride,
                        uint64_t count)
{
    struct kd_vecio_info info;
    kd_vecio_get_info(v, &info);
    uint32_t balign = kd_vecio_buffer_alignment(v);
    CHECK(balign >= 64 && (balign & (balign - 1)) == 0, "%s: buffer alignment %u", what, balign);

    size_t n = 97;
    uint64_t *rows = malloc(n * sizeof *rows);
    make_rows(rows, n, count, 0x1234 + rb);

    size_t strides[4] = {stride, rb, (size_t)kd_round_up(rb, 4096) + 4096, 0};
    for (int si = 0; strides[si]; si++) {
        size_t ds = strides[si];
        for (int aligned = 1; aligned >= 0; aligned--) {
            size_t total = n * ds + 2 * 4096;
            uint8_t *base = kd_alloc_aligned(4096, total);
            uint8_t *dst = base + (aligned ? 0 : 8);
            memset(base, 0x5A, total);
            struct kd_io_counters c = {7, 7, 7};
            int rc = kd_vecio_read(v, rows, n, dst, ds, &c);
            CHECK(rc == 0, "%s: read ds=%zu aligned=%d rc=%d", what, ds, aligned, rc);
            int bad = 0;
            for (size_t i = 0; i < n && rc == 0; i++) {
                if (!record_ok(dst + i * ds, rows[i], rb)) {
                    if (!bad)
                        printf("  %s: ds=%zu aligned=%d slot %zu row %llu differs\n", what, ds,
                               aligned, i, (unsigned long long)rows[i]);
                    bad++;
                }
            }
            CHECK(bad == 0, "%s: %d slots wrong (ds=%zu aligned=%d)", what, bad, ds, aligned);
            /* Nothing written before dst or after the last slot's stride. */
            if (!aligned)
                CHECK(base[0] == 0x5A && base[7] == 0x5A, "%s: wrote before dst", what);
            CHECK(dst[n * ds] == 0x5A, "%s: wrote past the buffer (ds=%zu)", what, ds);
            CHECK(c.wait_ns > 0 && c.wait_ns < 60ull * 1000000000ull, "%s: wait_ns %llu", what,
                  (unsigned long long)c.wait_ns);

            int zc = info.direct_io && aligned && ds % info.alignment == 0 &&
                     stride % info.alignment == 0 && ds >= stride;
            if (info.backend == KD_IO_MMAP || !info.direct_io) {
                CHECK(c.read_ops == n && c.read_bytes == (uint64_t)n * rb,
                      "%s: buffered/mmap counters ops=%llu bytes=%llu", what,
                      (unsigned long long)c.read_ops, (unsigned long long)c.read_bytes);
            } else if (zc) {
                CHECK(c.read_ops == n && c.read_bytes == (uint64_t)n * stride,
                      "%s: zero-copy counters ops=%llu bytes=%llu (ds=%zu)", what,
                      (unsigned long long)c.read_ops, (unsigned long long)c.read_bytes, ds);
            } else {
                /* Bounce: one aligned span per record. */
                uint64_t a = info.alignment;
                uint64_t lo = (uint64_t)n * kd_round_up(rb, a), hi = lo + n * a;
                CHECK(c.read_ops == n && c.read_bytes >= lo && c.read_bytes <= hi,
                      "%s: bounce counters ops=%llu bytes=%llu (ds=%zu aligned=%d)", what,
                      (unsigned long long)c.read_ops, (unsigned long long)c.read_bytes, ds,
                      aligned);
            }
            kd_free_aligned(base);
        }
    }

    /* Ranges, including the last record (ends the file) and unaligned starts. */
    uint64_t ranges[][2] = {{0, count},     {1, 5},         {3, 1},
                            {count - 7, 7}, {count - 1, 1}, {count / 2, count / 3}};
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        uint64_t first = ranges[k][0], m = ranges[k][1];
        for (int aligned = 1; aligned >= 0; aligned--) {
            size_t total = m * stride + 8192;
            uint8_t *base = kd_alloc_aligned(4096, total);
            uint8_t *dst = base + (aligned ? 0 : 24);
            memset(base, 0x5A, total);
            struct kd_io_counters c;
            int rc = kd_vecio_read_range(v, first, m, dst, &c);
            CHECK(rc == 0, "%s: read_range(%llu, %llu) aligned=%d rc=%d", what,
                  (unsigned long long)first, (unsigned long long)m, aligned, rc);
            int bad = 0;
            for (uint64_t i = 0; i < m && rc == 0; i++) {
                if (!record_ok(dst + i * stride, first + i, rb))
                    bad++;
                else if (i + 1 < m && stride > rb &&
                         (dst[i * stride + rb] != PAD_BYTE ||
                          dst[i * stride + stride - 1] != PAD_BYTE))
                    bad++;
            }
            CHECK(bad == 0, "%s: read_range(%llu, %llu) %d records wrong", what,
                  (unsigned long long)first, (unsigned long long)m, bad);
            CHECK(dst[m * stride] == 0x5A, "%s: read_range wrote past n*stride", what);
            CHECK(c.read_ops >= 1 && c.read_bytes >= (m - 1) * stride + rb,
                  "%s: read_range counters ops=%llu bytes=%llu", what,
                  (unsigned long long)c.read_ops, (unsigned long long)c.read_bytes);
            kd_free_aligned(base);
        }
    }

    /* Out of range rows, empty batches. */
    uint64_t badrow[2] = {0, count};
    uint8_t *tmp = kd_alloc_aligned(4096, 2 * (size_t)kd_round_up(stride, 4096));
    struct kd_io_counters c;
    CHECK(kd_vecio_read(v, badrow, 2, tmp, stride, &c) == -EINVAL, "%s: row == count", what);
    CHECK(strstr(kd_last_error(), "out of range") != NULL, "%s: message", what);
    CHECK(kd_vecio_read(v, rows, 0, NULL, stride, &c) == 0 && c.read_ops == 0, "%s: n=0", what);
    CHECK(kd_vecio_read(v, rows, 1, tmp, rb - 1 ? rb - 1 : 0, &c) == -EINVAL,
          "%s: dst_stride < record_bytes", what);
    CHECK(kd_vecio_read_range(v, count - 1, 2, tmp, &c) == -EINVAL, "%s: range past end", what);
    CHECK(kd_vecio_read_range(v, count, 1, tmp, &c) == -EINVAL, "%s: range start", what);
    CHECK(kd_vecio_read_range(v, 0, 0, NULL, &c) == 0, "%s: empty range", what);
    kd_free_aligned(tmp);
    free(rows);
}

static void test_configs(void)
{
    atomic_store(&watching, 1);
    static const uint32_t cfgs[][2] = {
        {3072, 4096}, {512, 512}, {128, 128}, {8192, 8192}, {100, 300}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        uint32_t rb = cfgs[k][0], stride = cfgs[k][1];
        uint64_t count = 301;
        char path[128];
        CHECK(make_file("/tmp", rb, stride, count, path, sizeof path) == 0, "make_file");
        for (size_t b = 0; b < sizeof all_backends / sizeof all_backends[0]; b++) {
            int be = all_backends[b];
            if (be == KD_IO_URING && !kd_vecio_have_uring())
                continue;
            for (int direct = 1; direct >= 0; direct--) {
                unsigned depths[] = {8, 1, 1000};
                for (size_t d = 0; d < 3; d++) {
                    if (d > 0 && (be == KD_IO_MMAP || be == KD_IO_PREAD || !direct))
                        break; /* depth matters only for the parallel backends */
                    char what[160];
                    snprintf(what, sizeof what, "%s rb=%u stride=%u direct=%d depth=%u",
                             kd_io_backend_name(be), rb, stride, direct, depths[d]);
                    struct kd_vecio_config cfg = base_cfg(path, rb, stride, count, be, direct,
                                                          depths[d]);
                    struct kd_vecio *v = NULL;
                    int rc = kd_vecio_open(&v, &cfg);
                    CHECK(rc == 0, "%s: open rc=%d", what, rc);
                    if (rc)
                        continue;
                    struct kd_vecio_info info;
                    kd_vecio_get_info(v, &info);
                    CHECK(info.backend == be, "%s: backend %d", what, info.backend);
                    CHECK(info.direct_io == (direct && be != KD_IO_MMAP), "%s: direct_io %d", what,
                          info.direct_io);
                    CHECK(info.fallbacks == 0, "%s: fallbacks %u", what, info.fallbacks);
                    CHECK(info.alignment >= 512 && (info.alignment & (info.alignment - 1)) == 0,
                          "%s: alignment %u", what, info.alignment);
                    check_reads(v, what, rb, stride, count);
                    kd_vecio_close(v);
                }
            }
        }
        unlink(path);
    }
    atomic_store(&watching, 0);
    CHECK(atomic_load(&n_direct_seen) > 1000 && atomic_load(&n_page_crossing) == 0,
          "%lu of %lu O_DIRECT reads crossed a page in their buffer", atomic_load(&n_page_crossing),
          atomic_load(&n_direct_seen));
}

static void test_auto_and_env(void)
{
    char path[128];
    CHECK(make_file("/tmp", 512, 512, 64, path, sizeof path) == 0, "make_file");
    struct kd_vecio_config cfg = base_cfg(path, 512, 512, 64, KD_IO_AUTO, 1, 16);
    struct kd_vecio *v = NULL;
    struct kd_vecio_info info;

    unsetenv("KNNDIRECT_DISABLE_IO_URING");
    CHECK(kd_vecio_open(&v, &cfg) == 0, "auto open");
    kd_vecio_get_info(v, &info);
    if (kd_vecio_have_uring()) {
        CHECK(info.backend == KD_IO_URING && info.fallbacks == 0, "auto -> io_uring (%s, %u)",
              kd_io_backend_name(info.backend), info.fallbacks);
    } else {
        CHECK(info.backend == KD_IO_THREADS && info.fallbacks == KD_FALLBACK_NO_URING,
              "auto without liburing -> threads (%s, %u)", kd_io_backend_name(info.backend),
              info.fallbacks);
    }
    printf("  /tmp direct-I/O alignment: %u, buffer alignment %u\n", info.alignment,
           kd_vecio_buffer_alignment(v));
    kd_vecio_close(v);
    v = NULL;

    cfg.backend = KD_IO_URING;
    int rc = kd_vecio_open(&v, &cfg);
    if (kd_vecio_have_uring()) {
        CHECK(rc == 0, "uring open rc=%d", rc);
    } else {
        CHECK(rc == -ENOSYS && v == NULL, "uring without liburing rc=%d", rc);
        CHECK(strstr(kd_last_error(), "io_uring") != NULL, "message '%s'", kd_last_error());
    }
    kd_vecio_close(v);
    v = NULL;

    /* "0" and "" do not disable. */
    setenv("KNNDIRECT_DISABLE_IO_URING", "0", 1);
    rc = kd_vecio_open(&v, &cfg);
    CHECK(rc == (kd_vecio_have_uring() ? 0 : -ENOSYS), "env=0 rc=%d", rc);
    kd_vecio_close(v);
    v = NULL;

    setenv("KNNDIRECT_DISABLE_IO_URING", "1", 1);
    cfg.backend = KD_IO_AUTO;
    CHECK(kd_vecio_open(&v, &cfg) == 0, "auto open with env");
    kd_vecio_get_info(v, &info);
    CHECK(info.backend == KD_IO_THREADS, "env: auto -> %s", kd_io_backend_name(info.backend));
    CHECK(info.fallbacks & KD_FALLBACK_NO_URING, "env: fallback bits %u", info.fallbacks);
    CHECK(info.direct_io == 1, "env: direct %d", info.direct_io);
    check_reads(v, "auto(env)->threads", 512, 512, 64);
    kd_vecio_close(v);
    v = NULL;

    cfg.backend = KD_IO_URING;
    rc = kd_vecio_open(&v, &cfg);
    CHECK(rc == -ENOSYS && v == NULL, "env: uring rc=%d", rc);
    CHECK(strstr(kd_last_error(), "io_uring is unavailable") != NULL, "message '%s'",
          kd_last_error());
    unsetenv("KNNDIRECT_DISABLE_IO_URING");
    unlink(path);
}

/* All backends on a file in dir, asking for O_DIRECT; with expect_fallback the
 * filesystem refuses O_DIRECT and the handle must read buffered. */
static void fallback_checks(const char *dir, int expect_fallback)
{
    char path[128];
    if (make_file(dir, 3072, 4096, 50, path, sizeof path) != 0) {
        CHECK(0, "cannot create a file in %s", dir);
        return;
    }
    for (size_t b = 0; b < sizeof all_backends / sizeof all_backends[0]; b++) {
        int be = all_backends[b];
        if (be == KD_IO_URING && !kd_vecio_have_uring())
            continue;
        char what[160];
        snprintf(what, sizeof what, "%s on %s", kd_io_backend_name(be), dir);
        struct kd_vecio_config cfg = base_cfg(path, 3072, 4096, 50, be, 1, 8);
        struct kd_vecio *v = NULL;
        int rc = kd_vecio_open(&v, &cfg);
        CHECK(rc == 0, "%s: open rc=%d", what, rc);
        if (rc)
            continue;
        struct kd_vecio_info info;
        kd_vecio_get_info(v, &info);
        int mm = be == KD_IO_MMAP;
        CHECK(info.direct_io == (!expect_fallback && !mm), "%s: direct_io %d", what,
              info.direct_io);
        CHECK(!!(info.fallbacks & KD_FALLBACK_NO_DIRECT) == (expect_fallback && !mm),
              "%s: fallbacks %u", what, info.fallbacks);
        if (expect_fallback)
            CHECK(kd_vecio_buffer_alignment(v) == 64, "%s: buffer alignment %u", what,
                  kd_vecio_buffer_alignment(v));
        check_reads(v, what, 3072, 4096, 50);
        kd_vecio_close(v);
    }
    unlink(path);
}


/* Run fn(arg) in a forked child (for namespaces and seccomp filters that must
 * not touch this process) and add its counts to ours. fn returns nonzero when
 * its set-up is not permitted here; returns 0 then (skipped), 1 when it ran. */
static int run_in_child(const char *name, int (*fn)(void *), void *arg)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        n_pass = n_fail = 0;
        if (fn(arg) != 0)
            _exit(77);
        int counts[2] = {n_pass, n_fail};
        ssize_t w = write(fds[1], counts, sizeof counts);
        fflush(stdout);
        _exit(w == (ssize_t)sizeof counts ? 0 : 1);
    }
    close(fds[1]);
    int counts[2] = {0, 0}, status = 0;
    ssize_t got = pid > 0 ? read(fds[0], counts, sizeof counts) : -1;
    if (pid > 0)
        waitpid(pid, &status, 0);
    close(fds[0]);
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 77)
        return 0;
    CHECK(pid > 0 && got == (ssize_t)sizeof counts && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "%s: child failed (status %d)", name, status);
    printf("  %s: %d passed, %d failed\n", name, counts[0], counts[1]);
    n_pass += counts[0];
    n_fail += counts[1];
    return 1;
}

/* ramfs never supports O_DIRECT; mount one in a private mount namespace
 * (needs CAP_SYS_ADMIN; skipped otherwise). */
static int ramfs_child(void *arg)
{
    const char *dir = arg;
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("none", dir, "ramfs", 0, NULL) != 0)
        return 1;
    fallback_checks(dir, 1);
    return 0;
}

static void test_no_direct_fallback(void)
{
    /* Memory-backed filesystems always take the buffered path, whether or not
     * the kernel accepts O_DIRECT there (tmpfs does since Linux 6.6). */
    int shm = access("/dev/shm", W_OK) == 0 ? 0 : -1;
    if (shm == 0)
        fallback_checks("/dev/shm", 1);
    char dir[] = "/tmp/kd_vecio_ramfs_XXXXXX";
    int ran = mkdtemp(dir) && run_in_child("buffered fallback on ramfs", ramfs_child, dir);
    rmdir(dir);
    if (shm != 0 && !ran)
        printf("  (skipped: no filesystem without O_DIRECT is reachable; fallback untested)\n");
}

#if defined(__x86_64__)
#define KD_TEST_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define KD_TEST_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

/* io_uring_setup refused with EPERM by seccomp, as container runtimes do. */
static int seccomp_child(void *arg)
{
    (void)arg;
#if defined(KD_TEST_AUDIT_ARCH) && defined(__NR_io_uring_setup)
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, KD_TEST_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return 1;
    char path[128];
    CHECK(make_file("/tmp", 512, 512, 64, path, sizeof path) == 0, "make_file");
    struct kd_vecio_config cfg = base_cfg(path, 512, 512, 64, KD_IO_URING, 1, 16);
    struct kd_vecio *v = NULL;
    int rc = kd_vecio_open(&v, &cfg);
    CHECK(rc == -EPERM && v == NULL, "seccomp: uring rc=%d", rc);
    CHECK(strstr(kd_last_error(), "io_uring is unavailable") != NULL, "message '%s'",
          kd_last_error());
    cfg.backend = KD_IO_AUTO;
    CHECK(kd_vecio_open(&v, &cfg) == 0, "seccomp: auto open");
    struct kd_vecio_info info;
    kd_vecio_get_info(v, &info);
    CHECK(info.backend == KD_IO_THREADS && info.fallbacks == KD_FALLBACK_NO_URING,
          "seccomp: auto -> %s, fallbacks %u", kd_io_backend_name(info.backend), info.fallbacks);
    check_reads(v, "seccomp auto->threads", 512, 512, 64);
    kd_vecio_close(v);
    unlink(path);
    return 0;
#else
    return 1;
#endif
}

static void test_uring_blocked(void)
{
    if (!kd_vecio_have_uring())
        return;
    if (!run_in_child("io_uring blocked by seccomp", seccomp_child, NULL))
        printf("  (skipped: cannot install a seccomp filter here)\n");
}

static void test_bad_configs(void)
{
    char path[128];
    CHECK(make_file("/tmp", 512, 512, 10, path, sizeof path) == 0, "make_file");
    struct kd_vecio *v = (struct kd_vecio *)1;
    struct kd_vecio_config c;

    c = base_cfg(path, 512, 256, 10, KD_IO_PREAD, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == -EINVAL && v == NULL, "stride < record_bytes");
    c = base_cfg(path, 0, 512, 10, KD_IO_PREAD, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == -EINVAL, "record_bytes 0");
    c = base_cfg(path, 512, 512, 10, KD_IO_PREAD, 1, 4);
    c.offset = 512;
    CHECK(kd_vecio_open(&v, &c) == -EINVAL, "offset not 4096-aligned");
    c = base_cfg(path, 512, 512, 10, KD_IO_PREAD, 1, 0);
    CHECK(kd_vecio_open(&v, &c) == -EINVAL, "io_depth 0");
    c = base_cfg(path, 512, 512, 11, KD_IO_THREADS, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == -EINVAL, "count past EOF");
    CHECK(strstr(kd_last_error(), path) != NULL, "message names the path: %s", kd_last_error());
    c = base_cfg(path, 512, 512, UINT64_MAX / 2, KD_IO_PREAD, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == -EINVAL, "overflowing count");
    c = base_cfg(path, 512, 512, 10, 9, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == -EINVAL, "unknown backend");
    c = base_cfg("/tmp/kd_vecio_does_not_exist", 512, 512, 10, KD_IO_PREAD, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == -ENOENT, "missing file");
    CHECK(strstr(kd_last_error(), "kd_vecio_does_not_exist") != NULL, "message %s",
          kd_last_error());
    /* The record may end the file: 10 records fit exactly. */
    c = base_cfg(path, 512, 512, 10, KD_IO_PREAD, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == 0, "exact fit");
    kd_vecio_close(v);
    c = base_cfg(path, 512, 512, 0, KD_IO_MMAP, 1, 4);
    CHECK(kd_vecio_open(&v, &c) == 0, "empty section");
    kd_vecio_close(v);
    kd_vecio_close(NULL);

    CHECK(strcmp(kd_io_backend_name(KD_IO_AUTO), "auto") == 0 &&
              strcmp(kd_io_backend_name(KD_IO_URING), "io_uring") == 0 &&
              strcmp(kd_io_backend_name(KD_IO_THREADS), "threads") == 0 &&
              strcmp(kd_io_backend_name(KD_IO_PREAD), "pread") == 0 &&
              strcmp(kd_io_backend_name(KD_IO_MMAP), "mmap") == 0,
          "backend names");
    unlink(path);
}

/* A file that shrinks under an open handle: reads past the new end are -EIO. */
static void test_truncated(void)
{
    for (size_t b = 0; b < 3; b++) { /* not mmap: that would be SIGBUS */
        int be = all_backends[b];
        if (be == KD_IO_URING && !kd_vecio_have_uring())
            continue;
        for (int direct = 1; direct >= 0; direct--) {
            char path[128];
            CHECK(make_file("/tmp", 3072, 4096, 40, path, sizeof path) == 0, "make_file");
            struct kd_vecio_config cfg = base_cfg(path, 3072, 4096, 40, be, direct, 4);
            struct kd_vecio *v = NULL;
            CHECK(kd_vecio_open(&v, &cfg) == 0, "open");
            CHECK(truncate(path, HEADER + 30 * 4096 + 1000) == 0, "truncate");
            uint64_t rows[3] = {1, 30, 2};
            uint8_t *dst = kd_alloc_aligned(4096, 16 * 4096);
            struct kd_io_counters c;
            int rc = kd_vecio_read(v, rows, 3, dst, 4096, &c);
            CHECK(rc == -EIO, "%s direct=%d: read of a cut record rc=%d", kd_io_backend_name(be),
                  direct, rc);
            CHECK(strstr(kd_last_error(), "end of file") && strstr(kd_last_error(), path),
                  "message '%s'", kd_last_error());
            uint64_t ok_rows[2] = {29, 0};
            CHECK(kd_vecio_read(v, ok_rows, 2, dst, 4096, &c) == 0 && record_ok(dst, 29, 3072) &&
                      record_ok(dst + 4096, 0, 3072),
                  "reads before the cut still work");
            CHECK(kd_vecio_read_range(v, 25, 10, dst, &c) == -EIO, "range over the cut");
            kd_free_aligned(dst);
            kd_vecio_close(v);
            unlink(path);
        }
    }
}

struct thr_arg {
    struct kd_vecio *v;
    uint32_t rb, stride;
    uint64_t count;
    int id;
    int bad;
};

static void *reader_thread(void *p)
{
    struct thr_arg *a = p;
    uint64_t s = 0x9E37 + (uint64_t)a->id * 7919;
    size_t n = 64;
    uint64_t rows[64];
    size_t ds = a->stride;
    uint8_t *base = kd_alloc_aligned(4096, n * ds + 64);
    for (int it = 0; it < 40; it++) {
        uint8_t *dst = base + ((it & 1) ? 8 : 0); /* bounce and zero-copy */
        for (size_t i = 0; i < n; i++)
            rows[i] = rng_next(&s) % a->count;
        size_t m = 1 + rng_next(&s) % n;
        struct kd_io_counters c;
        if (kd_vecio_read(a->v, rows, m, dst, ds, &c) != 0) {
            a->bad++;
            continue;
        }
        for (size_t i = 0; i < m; i++)
            if (!record_ok(dst + i * ds, rows[i], a->rb))
                a->bad++;
    }
    kd_free_aligned(base);
    return NULL;
}

static void test_concurrent(void)
{
    char path[128];
    CHECK(make_file("/tmp", 3072, 4096, 500, path, sizeof path) == 0, "make_file");
    for (size_t b = 0; b < sizeof all_backends / sizeof all_backends[0]; b++) {
        int be = all_backends[b];
        if (be == KD_IO_URING && !kd_vecio_have_uring())
            continue;
        struct kd_vecio_config cfg = base_cfg(path, 3072, 4096, 500, be, 1, 8);
        struct kd_vecio *v = NULL;
        CHECK(kd_vecio_open(&v, &cfg) == 0, "open");
        pthread_t t[4];
        struct thr_arg args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (struct thr_arg){v, 3072, 4096, 500, i, 0};
            pthread_create(&t[i], NULL, reader_thread, &args[i]);
        }
        int bad = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(t[i], NULL);
            bad += args[i].bad;
        }
        CHECK(bad == 0, "concurrent %s: %d bad records", kd_io_backend_name(be), bad);
        kd_vecio_close(v);
    }
    unlink(path);
}

/* The counters of one batch (submit/complete) agree between backends reading
 * the same way, and streams count their reads in every backend. */
static void test_counters_agree(void)
{
    uint32_t rb = 3072, stride = 4096;
    uint64_t count = 5000; /* a stream of several chunks */
    char path[128];
    CHECK(make_file("/tmp", rb, stride, count, path, sizeof path) == 0, "make_file");
    size_t n = 80;
    uint64_t rows[80];
    make_rows(rows, n, count, 99);
    uint8_t *dst = kd_alloc_aligned(4096, n * 4096);
    for (int direct = 1; direct >= 0; direct--) {
        struct kd_io_counters ref = {0, 0, 0};
        int have_ref = 0;
        for (size_t b = 0; b < sizeof all_backends / sizeof all_backends[0]; b++) {
            int be = all_backends[b];
            if ((be == KD_IO_URING && !kd_vecio_have_uring()) || (direct && be == KD_IO_MMAP))
                continue;
            char what[96];
            snprintf(what, sizeof what, "counters %s direct=%d", kd_io_backend_name(be), direct);
            struct kd_vecio_config cfg = base_cfg(path, rb, stride, count, be, direct, 8);
            struct kd_vecio *v = NULL;
            if (kd_vecio_open(&v, &cfg) != 0) {
                CHECK(0, "%s: open: %s", what, kd_last_error());
                continue;
            }
            /* Unaligned dst: the bounce path under O_DIRECT. */
            for (int off = 0; off <= 8; off += 8) {
                struct kd_vecio_pending *p = NULL;
                struct kd_io_counters c = {0, 0, 0};
                int rc = kd_vecio_submit(v, rows, n, dst + off, stride, &p);
                if (rc == 0)
                    rc = kd_vecio_complete(p, &c);
                CHECK(rc == 0 && c.read_ops == n && c.wait_ns > 0, "%s off=%d: rc=%d ops=%llu",
                      what, off, rc, (unsigned long long)c.read_ops);
                if (off == 0 && !have_ref) {
                    ref = c;
                    have_ref = 1;
                } else if (off == 0) {
                    CHECK(c.read_bytes == ref.read_bytes, "%s: bytes %llu, first backend %llu",
                          what, (unsigned long long)c.read_bytes,
                          (unsigned long long)ref.read_bytes);
                }
            }
            struct kd_vecio_stream *st = NULL;
            int rc = kd_vecio_stream_open(v, 1, count - 1, &st);
            CHECK(rc == 0, "%s: stream_open rc=%d", what, rc);
            struct kd_io_counters c = {0, 0, 0};
            uint64_t seen = 0, bad = 0;
            const void *buf;
            uint64_t first;
            int64_t got;
            while (rc == 0 && (got = kd_vecio_stream_next(st, &buf, &first, &c)) > 0) {
                CHECK(first == 1 + seen, "%s: chunk at %llu", what, (unsigned long long)first);
                for (int64_t i = 0; i < got; i++)
                    bad += !record_ok((const uint8_t *)buf + i * stride, first + i, rb);
                seen += (uint64_t)got;
            }
            kd_vecio_stream_close(st);
            CHECK(rc || (seen == count - 1 && bad == 0), "%s: stream %llu rows, %llu wrong", what,
                  (unsigned long long)seen, (unsigned long long)bad);
            CHECK(c.read_ops >= 1 && c.read_bytes >= (count - 1) * rb && c.wait_ns > 0,
                  "%s: stream counters ops=%llu bytes=%llu", what, (unsigned long long)c.read_ops,
                  (unsigned long long)c.read_bytes);
            kd_vecio_close(v);
        }
    }
    kd_free_aligned(dst);
    unlink(path);
}

int main(int argc, char **argv)
{
    /* "concurrent" runs only the multi-threaded part (for -fsanitize=thread). */
    int only_conc = argc > 1 && strcmp(argv[1], "concurrent") == 0;
    printf("io_uring compiled in: %d\n", kd_vecio_have_uring());
    if (!only_conc) {
        test_bad_configs();
        test_auto_and_env();
        test_configs();
        test_counters_agree();
        test_no_direct_fallback();
        test_uring_blocked();
        test_truncated();
    }
    test_concurrent();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

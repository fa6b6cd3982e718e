/* vecio_threads.c — the thread-pool backend: a batch is cut into chunks
 * that the pool's workers, and the caller at complete, read with pread. */
#include "vecio_backend.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

/* A batch handed to the pool: the backend part of struct kd_vecio_pending.
 * Workers touch it only between claiming a chunk and completing it. */
struct kd_batch {
    struct kd_batch *qnext;
    const uint64_t *rows;
    size_t n;
    char *dst;
    size_t dst_stride;
    int zc;
    size_t chunk, nchunks, next, done;
    int err;
    char errmsg[KD_ERRMSG_LEN];
    struct kd_io_counters c;
    pthread_cond_t cv;
};

struct kd_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    struct kd_batch *head; /* batches with unclaimed chunks */
    int stop;
    int ok; /* mu and work_cv exist */
    unsigned nthreads;
    pthread_t *threads;
};

static void batch_unlink(struct kd_pool *p, struct kd_batch *b)
{
    for (struct kd_batch **pp = &p->head; *pp; pp = &(*pp)->qnext) {
        if (*pp == b) {
            *pp = b->qnext;
            return;
        }
    }
}

/* Claim the next chunk of b; pool lock held. Returns 0 if none is left. */
static int batch_claim(struct kd_pool *p, struct kd_batch *b, size_t *chunk, int *skip)
{
    if (b->next >= b->nchunks)
        return 0;
    *chunk = b->next++;
    *skip = b->err != 0; /* after a failure, finish the remaining chunks unread */
    if (b->next == b->nchunks)
        batch_unlink(p, b);
    return 1;
}

static void batch_run_chunk(struct kd_vecio *v, struct kd_batch *b, size_t k, int skip,
                            char **bounce)
{
    struct kd_io_counters c = {0, 0, 0};
    int rc = 0;
    if (!skip) {
        if (!b->zc && v->direct && !*bounce) {
            *bounce = kd_alloc_aligned(v->buf_align, v->max_span);
            if (!*bounce)
                rc = kd_fail(-ENOMEM, "out of memory for a bounce buffer reading %s", v->path);
        }
        if (rc == 0) {
            size_t i0 = k * b->chunk;
            size_t i1 = i0 + b->chunk < b->n ? i0 + b->chunk : b->n;
            rc = kd_read_rows_sync(v, b->rows + i0, i1 - i0, b->dst + i0 * b->dst_stride,
                                   b->dst_stride, b->zc, *bounce, &c);
        }
    }
    struct kd_pool *p = v->be;
    pthread_mutex_lock(&p->mu);
    io_add(&b->c, &c);
    if (rc < 0 && !b->err) {
        b->err = rc;
        snprintf(b->errmsg, sizeof b->errmsg, "%s", kd_last_error());
    }
    if (++b->done == b->nchunks)
        pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *pool_worker(void *arg)
{
    struct kd_vecio *v = arg;
    struct kd_pool *p = v->be;
    char *bounce = NULL; /* per worker: one synchronous read at a time */

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->head)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop)
            break;
        struct kd_batch *b = p->head;
        size_t k;
        int skip;
        if (!batch_claim(p, b, &k, &skip))
            continue;
        pthread_mutex_unlock(&p->mu);
        batch_run_chunk(v, b, k, skip, &bounce);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    kd_free_aligned(bounce);
    return NULL;
}

static int pool_start(struct kd_vecio *v)
{
    unsigned nthreads = v->io_depth < KD_MAX_THREADS ? v->io_depth : KD_MAX_THREADS;
    struct kd_pool *p = calloc(1, sizeof *p);
    if (!p)
        return kd_fail(-ENOMEM, "out of memory for the I/O thread pool of %s", v->path);
    v->be = p; /* from here pool_stop() cleans up */
    int rc = pthread_mutex_init(&p->mu, NULL);
    if (rc)
        return kd_fail(-rc, "cannot create the I/O thread pool mutex for %s", v->path);
    rc = pthread_cond_init(&p->work_cv, NULL);
    if (rc) {
        pthread_mutex_destroy(&p->mu);
        return kd_fail(-rc, "cannot create the I/O thread pool condition for %s", v->path);
    }
    p->ok = 1;
    p->threads = calloc(nthreads, sizeof *p->threads);
    if (!p->threads)
        return kd_fail(-ENOMEM, "out of memory for the I/O thread pool of %s", v->path);
    /* Workers block all signals so that they go to the application's threads
     * (the Python interpreter handles them on its main thread). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (unsigned i = 0; i < nthreads; i++) {
        rc = pthread_create(&p->threads[i], NULL, pool_worker, v);
        if (rc) {
            rc = kd_fail(-rc, "cannot start I/O thread %u of %u for %s: %s", i, nthreads, v->path,
                         kd_errstr(rc));
            break;
        }
        p->nthreads = i + 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static void pool_stop(struct kd_vecio *v)
{
    struct kd_pool *p = v->be;
    if (!p)
        return;
    if (p->ok) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
        for (unsigned i = 0; i < p->nthreads; i++)
            pthread_join(p->threads[i], NULL);
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
    }
    free(p->threads);
    free(p);
    v->be = NULL;
}

/* Hand a batch to the pool's workers; the caller joins in at pool_complete. */
static int pool_submit(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct kd_pool *pool = v->be;
    struct kd_batch *b = pending_be(p);
    /* Chunks smaller than an even split so that fast threads take more. */
    size_t parts = 2 * ((size_t)pool->nthreads + 1);
    if (parts > p->n)
        parts = p->n;
    b->rows = p->rows;
    b->n = p->n;
    b->dst = p->dst;
    b->dst_stride = p->dst_stride;
    b->zc = p->zc;
    b->chunk = (p->n + parts - 1) / parts;
    b->nchunks = (p->n + b->chunk - 1) / b->chunk;
    int rc = pthread_cond_init(&b->cv, NULL);
    if (rc)
        return kd_fail(-rc, "cannot create a condition variable reading %s", v->path);
    pthread_mutex_lock(&pool->mu);
    struct kd_batch **pp = &pool->head; /* FIFO: older batches first */
    while (*pp)
        pp = &(*pp)->qnext;
    *pp = b;
    for (size_t w = 0; w < b->nchunks && w < pool->nthreads; w++)
        pthread_cond_signal(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
    return 0;
}

static int pool_complete(struct kd_vecio *v, struct kd_vecio_pending *p)
{
    struct kd_pool *pool = v->be;
    struct kd_batch *b = pending_be(p);
    char *none = NULL; /* no caller context: no bounce needed */
    char **bounce = p->x ? &p->x->bounce : &none;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        size_t k;
        int skip;
        if (!batch_claim(pool, b, &k, &skip))
            break;
        pthread_mutex_unlock(&pool->mu);
        batch_run_chunk(v, b, k, skip, bounce);
        pthread_mutex_lock(&pool->mu);
    }
    while (b->done < b->nchunks)
        pthread_cond_wait(&b->cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_cond_destroy(&b->cv);
    p->c.read_ops += b->c.read_ops;
    p->c.read_bytes += b->c.read_bytes;
    if (b->err) {
        kd_set_error_text(b->errmsg);
        return b->err;
    }
    return 0;
}

const struct kd_vecio_ops kd_threads_ops = {
    .pending_size = sizeof(struct kd_batch),
    .open = pool_start,
    .close = pool_stop,
    .submit = pool_submit,
    .complete = pool_complete,
    .read_range = kd_read_range_pread,
};

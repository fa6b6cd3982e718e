/* vecio_stream.c — sequential streaming of a record range (see vecio.h).
 *
 * The stream owns KD_STREAM_BUFS chunk buffers: one with the consumer, the
 * others being read. The backend's stream_start picks how they are read;
 * every backend can use the reader thread here, which fills the buffers in
 * turn with kd_vecio_read_range (io_uring reads them with its own ring when
 * the range is aligned: vecio_uring.c). */
#include "vecio_backend.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

void kd_stream_assign(struct kd_vecio_stream *s, struct kd_stream_buf *b)
{
    b->first = s->next_issue;
    b->rows = min_u64(s->chunk_rows, s->end - s->next_issue);
    b->ready = b->err = 0;
    s->next_issue += b->rows;
}

/* ------------------------------------------------------------------ */
/* Reader thread                                                       */

static void *stream_reader(void *arg)
{
    struct kd_vecio_stream *s = arg;
    for (unsigned i = 0;; i = (i + 1) % KD_STREAM_BUFS) {
        struct kd_stream_buf *b = &s->buf[i];
        pthread_mutex_lock(&s->mu);
        while (!s->stop && b->ready) /* still with the consumer or unread */
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop || s->next_issue >= s->end) {
            s->reader_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        kd_stream_assign(s, b);
        pthread_mutex_unlock(&s->mu);
        struct kd_io_counters c = {0, 0, 0};
        int err = kd_vecio_read_range(s->v, b->first, b->rows, b->data, &c);
        pthread_mutex_lock(&s->mu);
        s->c.read_ops += c.read_ops;
        s->c.read_bytes += c.read_bytes;
        b->err = err;
        b->ready = 1;
        if (err) {
            snprintf(s->errmsg, sizeof s->errmsg, "%s", kd_last_error());
            s->reader_done = 1;
        }
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (err)
            return NULL;
    }
}

static int reader_wait(struct kd_vecio_stream *s, unsigned i, unsigned prev)
{
    struct kd_stream_buf *b = &s->buf[i];
    pthread_mutex_lock(&s->mu);
    if (s->handed) {
        s->buf[prev].ready = 0; /* back to the reader */
        pthread_cond_broadcast(&s->cv);
    }
    s->handed = 0;
    while (!b->ready && !s->reader_done)
        pthread_cond_wait(&s->cv, &s->mu);
    int ready = b->ready, err = b->err;
    pthread_mutex_unlock(&s->mu);
    if (!ready)
        return 0;
    if (err) {
        kd_set_error_text(s->errmsg);
        return err;
    }
    return 1;
}

static void reader_stop(struct kd_vecio_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
}

static const struct kd_stream_ops reader_ops = {
    .wait = reader_wait,
    .stop = reader_stop,
};

int kd_stream_reader_start(struct kd_vecio_stream *s)
{
    /* The reader blocks all signals so that they go to the application's
     * threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, stream_reader, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc)
        return kd_fail(-rc, "cannot start a reader thread for %s", s->v->path);
    s->ops = &reader_ops;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Public calls                                                        */

int kd_vecio_stream_open(struct kd_vecio *v, uint64_t first, uint64_t n,
                         struct kd_vecio_stream **out)
{
    if (first > v->count || n > v->count - first)
        return kd_fail(-EINVAL, "records [%llu, %llu) are out of range: %s holds %llu records",
                       (unsigned long long)first, (unsigned long long)(first + n), v->path,
                       (unsigned long long)v->count);
    struct kd_vecio_stream *s = calloc(1, sizeof *s);
    if (!s)
        return kd_fail(-ENOMEM, "out of memory for a stream of %s", v->path);
    s->v = v;
    s->next_issue = first;
    s->end = first + n;
    s->chunk_rows = KD_RANGE_CHUNK / v->stride ? KD_RANGE_CHUNK / v->stride : 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    size_t size = (size_t)kd_round_up(s->chunk_rows * v->stride, 4096) + 4096;
    size_t align = v->buf_align > 4096 ? v->buf_align : 4096;
    int err = 0;
    for (int i = 0; i < KD_STREAM_BUFS && !err; i++)
        if (!(s->buf[i].data = kd_alloc_aligned(align, size)))
            err = kd_fail(-ENOMEM, "out of memory for stream buffers of %s", v->path);
    if (!err && n > 0)
        err = v->ops->stream_start ? v->ops->stream_start(s) : kd_stream_reader_start(s);
    if (err) {
        kd_vecio_stream_close(s);
        return err;
    }
    *out = s;
    return 0;
}

int64_t kd_vecio_stream_next(struct kd_vecio_stream *s, const void **buf, uint64_t *first_row,
                             struct kd_io_counters *c)
{
    uint64_t t0 = kd_now_ns();
    int64_t rc = 0;
    unsigned i = s->head, prev = (i + KD_STREAM_BUFS - 1) % KD_STREAM_BUFS;
    struct kd_stream_buf *b = &s->buf[i];
    if (!s->ops) /* an empty range */
        goto out;
    int st = s->ops->wait(s, i, prev);
    if (st <= 0) {
        rc = st;
        goto out;
    }
    *buf = b->data;
    *first_row = b->first;
    rc = (int64_t)b->rows;
    b->rows = 0;
    s->head = (i + 1) % KD_STREAM_BUFS;
    s->handed = 1;
out:
    pthread_mutex_lock(&s->mu);
    if (c) {
        c->read_ops += s->c.read_ops - s->told_ops;
        c->read_bytes += s->c.read_bytes - s->told_bytes;
        c->wait_ns += kd_now_ns() - t0;
    }
    s->told_ops = s->c.read_ops;
    s->told_bytes = s->c.read_bytes;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void kd_vecio_stream_close(struct kd_vecio_stream *s)
{
    if (!s)
        return;
    if (s->ops)
        s->ops->stop(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    for (int i = 0; i < KD_STREAM_BUFS; i++)
        kd_free_aligned(s->buf[i].data);
    free(s);
}

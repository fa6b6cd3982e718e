/* The knndirect._core.Index type. */
#include "pyext.h"
#include "calibrate.h"
#include "common.h"
#include "format.h"
#include "metric.h"

#include <string.h>

/* ---- guarding the core index against close() */

struct kd_index *kd_py_enter(KdIndexObject *self)
{
    if (self->ix) {
        pthread_rwlock_rdlock(&self->use);
        if (self->ix)
            return self->ix;
        pthread_rwlock_unlock(&self->use);
    }
    PyErr_SetString(PyExc_ValueError, "index is closed");
    return NULL;
}

void kd_py_leave(KdIndexObject *self) { pthread_rwlock_unlock(&self->use); }

/* ---- buffers */

static int is_format(const Py_buffer *v, const char *codes, Py_ssize_t itemsize)
{
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return v->itemsize == itemsize && f[0] && !f[1] && strchr(codes, f[0]);
}

/* A C-contiguous float32 matrix with `dim` columns. */
int kd_take_matrix(PyObject *obj, Py_buffer *v, uint32_t dim, size_t *rows)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return -1;
    if (!is_format(v, "f", 4) || v->ndim != 2) {
        PyErr_SetString(PyExc_TypeError, "expected a C-contiguous float32 matrix");
        goto fail;
    }
    if (v->shape[1] != (Py_ssize_t)dim) {
        PyErr_Format(PyExc_ValueError, "expected vectors of dim %u, got dim %zd", dim, v->shape[1]);
        goto fail;
    }
    *rows = (size_t)v->shape[0];
    return 0;
fail:
    PyBuffer_Release(v);
    return -1;
}

/* A contiguous int64 vector, or None (data NULL). */
int kd_take_ids(PyObject *obj, Py_buffer *v, const int64_t **data, size_t *n)
{
    memset(v, 0, sizeof *v);
    *data = NULL;
    *n = 0;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return -1;
    if (!is_format(v, "qlL", 8) || v->ndim != 1) {
        PyErr_SetString(PyExc_TypeError, "expected a contiguous int64 vector of ids");
        PyBuffer_Release(v);
        return -1;
    }
    *data = v->buf;
    *n = (size_t)v->shape[0];
    return 0;
}

void kd_release_buffer(Py_buffer *v)
{
    if (v->obj)
        PyBuffer_Release(v);
}

/* ---- type */

PyObject *kd_index_wrap(struct kd_index *ix)
{
    KdIndexObject *self = PyObject_New(KdIndexObject, &KdIndexType);
    if (!self) {
        kd_index_free(ix);
        return NULL;
    }
    self->ix = ix;
    self->weakrefs = NULL;
    pthread_rwlock_init(&self->use, NULL);
    return (PyObject *)self;
}

PyObject *kd_metrics_table(void)
{
    PyObject *t = PyTuple_New(KD_NMETRICS);
    for (int i = 0; t && i < KD_NMETRICS; i++) {
        const struct kd_metric_info *m = &kd_metrics[i];
        PyObject *d = Py_BuildValue("{s:s,s:i,s:O,s:O,s:d}", "name", m->name, "code", m->code,
                                    "larger_is_better", m->larger_is_better ? Py_True : Py_False,
                                    "normalized", m->normalized ? Py_True : Py_False, "missing",
                                    (double)m->missing);
        if (!d) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, d);
    }
    return t;
}

static PyObject *Index_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"dim", "metric", "m", "ef_construction", "quantization", "seed", NULL};
    unsigned int dim, m = 16, efc = 200;
    int metric = KD_L2, quant = KD_Q_1BIT;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Ii|IIiK", names, &dim, &metric, &m, &efc, &quant,
                                     &seed))
        return NULL;
    struct kd_index_params p = {dim, metric, m, efc, quant, seed};
    struct kd_index *ix;
    int err;
    Py_BEGIN_ALLOW_THREADS err = kd_index_create(&ix, &p);
    Py_END_ALLOW_THREADS if (err) return kd_raise(err);
    return kd_index_wrap(ix);
}

static void Index_dealloc(KdIndexObject *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    kd_index_free(self->ix);
    pthread_rwlock_destroy(&self->use);
    PyObject_Free(self);
}

static PyObject *Index_close(KdIndexObject *self, PyObject *unused)
{
    struct kd_index *ix;
    Py_BEGIN_ALLOW_THREADS pthread_rwlock_wrlock(&self->use);
    ix = self->ix;
    self->ix = NULL;
    pthread_rwlock_unlock(&self->use);
    kd_index_free(ix);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *Index_closed(KdIndexObject *self, void *unused)
{
    return PyBool_FromLong(self->ix == NULL);
}

static PyObject *Index_train(KdIndexObject *self, PyObject *arg)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    uint32_t dim = kd_index_dim(ix);
    Py_buffer v;
    size_t n;
    int err = 0;
    if (kd_take_matrix(arg, &v, dim, &n)) {
        kd_py_leave(self);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS err = kd_index_train(ix, v.buf, n);
    Py_END_ALLOW_THREADS PyBuffer_Release(&v);
    kd_py_leave(self);
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_add(KdIndexObject *self, PyObject *args)
{
    PyObject *xo, *ido;
    unsigned int threads = 0;
    if (!PyArg_ParseTuple(args, "OO|I", &xo, &ido, &threads))
        return NULL;
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    uint32_t dim = kd_index_dim(ix);
    Py_buffer xv, iv = {0};
    size_t n, nids;
    const int64_t *ids;
    int err = 0;
    if (kd_take_matrix(xo, &xv, dim, &n)) {
        kd_py_leave(self);
        return NULL;
    }
    if (kd_take_ids(ido, &iv, &ids, &nids)) {
        PyBuffer_Release(&xv);
        kd_py_leave(self);
        return NULL;
    }
    if (ids && nids != n) {
        PyErr_Format(PyExc_ValueError, "got %zu ids for %zu vectors", nids, n);
    } else {
        Py_BEGIN_ALLOW_THREADS err = kd_index_add(ix, xv.buf, n, ids, threads);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&xv);
    kd_release_buffer(&iv);
    kd_py_leave(self);
    if (PyErr_Occurred())
        return NULL;
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_reserve(KdIndexObject *self, PyObject *arg)
{
    unsigned long long more = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS err = kd_index_reserve(ix, more);
    Py_END_ALLOW_THREADS kd_py_leave(self);
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_remove(KdIndexObject *self, PyObject *arg)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    Py_buffer iv;
    const int64_t *ids;
    size_t n;
    int err;
    if (kd_take_ids(arg, &iv, &ids, &n)) {
        kd_py_leave(self);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS err = kd_index_remove(ix, ids, n);
    Py_END_ALLOW_THREADS kd_release_buffer(&iv);
    kd_py_leave(self);
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_contains(KdIndexObject *self, PyObject *arg)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    Py_buffer iv;
    const int64_t *ids;
    size_t n;
    if (kd_take_ids(arg, &iv, &ids, &n)) {
        kd_py_leave(self);
        return NULL;
    }
    npy_intp dim = (npy_intp)n;
    PyObject *out = PyArray_SimpleNew(1, &dim, NPY_BOOL);
    if (out) {
        Py_BEGIN_ALLOW_THREADS kd_index_contains(ix, ids, n, PyArray_DATA((PyArrayObject *)out));
        Py_END_ALLOW_THREADS
    }
    kd_release_buffer(&iv);
    kd_py_leave(self);
    return out;
}

int kd_py_search_begin(struct kd_py_search *s, PyObject *queries, PyObject *filter, uint32_t dim,
                       Py_ssize_t k, Py_ssize_t ef, double oversample, int rerank, int exact,
                       unsigned threads)
{
    memset(s, 0, sizeof *s);
    if (k <= 0 || ef < 0) {
        PyErr_SetString(PyExc_ValueError, k <= 0 ? "k must be at least 1" : "ef must be >= 0");
        return -1;
    }
    const int64_t *rows;
    size_t nf;
    if (kd_take_matrix(queries, &s->qv, dim, &s->nq)) {
        memset(&s->qv, 0, sizeof s->qv);
        return -1;
    }
    if (kd_take_ids(filter, &s->fv, &rows, &nf))
        return -1;
    npy_intp dims[2] = {(npy_intp)s->nq, (npy_intp)k};
    s->dist = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    s->ids = PyArray_SimpleNew(2, dims, NPY_INT64);
    if (!s->dist || !s->ids)
        return -1;
    /* A filter that is given but empty still filters (to nothing). */
    static const int64_t none[1] = {0};
    struct kd_search_params sp = {(size_t)k,
                                  (size_t)ef,
                                  oversample,
                                  rerank,
                                  exact,
                                  threads,
                                  filter != Py_None && !rows ? none : rows,
                                  nf};
    s->sp = sp;
    return 0;
}

PyObject *kd_py_search_finish(struct kd_py_search *s, int err)
{
    kd_release_buffer(&s->qv);
    kd_release_buffer(&s->fv);
    if (err)
        kd_raise(err);
    if (PyErr_Occurred()) {
        Py_XDECREF(s->dist);
        Py_XDECREF(s->ids);
        return NULL;
    }
    return Py_BuildValue("(NN)", s->dist, s->ids);
}

static PyObject *Index_search(KdIndexObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"queries", "k",       "ef",     "oversample", "rerank",
                            "exact",   "threads", "filter", "serves",     NULL};
    PyObject *qo, *fo = Py_None;
    Py_ssize_t k, ef = 0, serves = 0;
    double oversample = 0;
    int rerank = 1, exact = 0;
    unsigned int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On|ndppIO$n", names, &qo, &k, &ef, &oversample,
                                     &rerank, &exact, &threads, &fo, &serves))
        return NULL;
    if (serves < 0) {
        PyErr_SetString(PyExc_ValueError, "serves must be >= 0");
        return NULL;
    }
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    struct kd_py_search s;
    int err = 0;
    if (!kd_py_search_begin(&s, qo, fo, kd_index_dim(ix), k, ef, oversample, rerank, exact,
                            threads)) {
        s.sp.serves = (size_t)serves;
        Py_BEGIN_ALLOW_THREADS err = kd_index_search(ix, s.qv.buf, s.nq, &s.sp,
                                                     PyArray_DATA((PyArrayObject *)s.dist),
                                                     PyArray_DATA((PyArrayObject *)s.ids));
        Py_END_ALLOW_THREADS
    }
    kd_py_leave(self);
    return kd_py_search_finish(&s, err);
}

static PyObject *Index_search_widths(KdIndexObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"k", "ef", "oversample", "serves", NULL};
    Py_ssize_t k, ef = 0, serves = 0;
    double oversample = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n|nd$n", names, &k, &ef, &oversample, &serves))
        return NULL;
    if (k <= 0 || ef < 0 || serves < 0) {
        PyErr_SetString(PyExc_ValueError, "k must be >= 1, ef and serves >= 0");
        return NULL;
    }
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    struct kd_search_params sp = {.k = (size_t)k,
                                  .ef = (size_t)ef,
                                  .oversample = oversample,
                                  .serves = (size_t)serves};
    size_t beam, shortlist;
    kd_index_search_widths(ix, &sp, &beam, &shortlist);
    kd_py_leave(self);
    return Py_BuildValue("(nn)", (Py_ssize_t)beam, (Py_ssize_t)shortlist);
}

static PyObject *Index_get_vectors(KdIndexObject *self, PyObject *arg)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    uint32_t dim = kd_index_dim(ix);
    Py_buffer iv;
    const int64_t *ids;
    size_t n, align, stride;
    PyObject *raw = NULL, *out = NULL;
    int err = 0;
    if (kd_take_ids(arg, &iv, &ids, &n)) {
        kd_py_leave(self);
        return NULL;
    }
    kd_index_vector_layout(ix, &align, &stride);
    /* NumPy owns the bytes; the result is an aligned row-strided float32 view
     * of them, so records land with no copy. */
    npy_intp rawlen = (npy_intp)(n * stride + align);
    raw = PyArray_SimpleNew(1, &rawlen, NPY_UINT8);
    if (!raw)
        goto out;
    char *base = PyArray_DATA((PyArrayObject *)raw);
    size_t skip = (size_t)((align - (uintptr_t)base % align) % align);
    npy_intp dims[2] = {(npy_intp)n, (npy_intp)dim};
    npy_intp strides[2] = {(npy_intp)stride, 4};
    PyArray_Descr *descr = PyArray_DescrFromType(NPY_FLOAT32);
    out = PyArray_NewFromDescr(&PyArray_Type, descr, 2, dims, strides, base + skip,
                               NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED, NULL);
    if (!out)
        goto out;
    Py_INCREF(raw);
    if (PyArray_SetBaseObject((PyArrayObject *)out, raw) != 0)
        goto out;
    Py_BEGIN_ALLOW_THREADS err = kd_index_get_vectors(ix, ids, n, base + skip, stride);
    Py_END_ALLOW_THREADS out : Py_XDECREF(raw);
    kd_release_buffer(&iv);
    kd_py_leave(self);
    if (err)
        kd_raise(err);
    if (PyErr_Occurred()) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *Index_save_path(KdIndexObject *self, PyObject *arg)
{
    PyObject *bytes;
    if (!PyUnicode_FSConverter(arg, &bytes))
        return NULL;
    struct kd_index *ix = kd_py_enter(self);
    int err = 0;
    if (ix) {
        const char *path = PyBytes_AS_STRING(bytes);
        Py_BEGIN_ALLOW_THREADS err = kd_index_save_path(ix, path);
        Py_END_ALLOW_THREADS kd_py_leave(self);
    }
    Py_DECREF(bytes);
    if (!ix)
        return NULL;
    if (err == -EROFS) /* a read-only filesystem, not a read-only index */
        return kd_raise_os(err);
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_save_file(KdIndexObject *self, PyObject *file)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    struct kd_writer w;
    struct kd_pywriter pw;
    int err;
    if (kd_pywriter_init(&w, &pw, file)) {
        kd_py_leave(self);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS err = kd_index_save(ix, &w);
    Py_END_ALLOW_THREADS kd_py_leave(self);
    if (kd_pywriter_finish(&pw)) {
        kd_clear_error();
        return NULL;
    }
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_to_bytes(KdIndexObject *self, PyObject *unused)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    struct kd_writer w;
    struct kd_mem_writer mw;
    int err;
    kd_mem_writer_init(&w, &mw);
    Py_BEGIN_ALLOW_THREADS err = kd_index_save(ix, &w);
    Py_END_ALLOW_THREADS kd_py_leave(self);
    PyObject *r = err ? kd_raise(err)
                      : PyBytes_FromStringAndSize((const char *)mw.data, (Py_ssize_t)mw.size);
    free(mw.data);
    return r;
}

static PyObject *Index_verify(KdIndexObject *self, PyObject *unused)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS err = kd_index_verify(ix);
    Py_END_ALLOW_THREADS kd_py_leave(self);
    return err ? kd_raise(err) : (Py_INCREF(Py_True), Py_True);
}

#define SET(d, key, value)                                                                         \
    do {                                                                                           \
        PyObject *v_ = (value);                                                                    \
        if (!v_ || PyDict_SetItemString(d, key, v_) != 0) {                                        \
            Py_XDECREF(v_);                                                                        \
            Py_DECREF(d);                                                                          \
            return NULL;                                                                           \
        }                                                                                          \
        Py_DECREF(v_);                                                                             \
    } while (0)

static PyObject *Index_info(KdIndexObject *self, PyObject *unused)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    struct kd_info in;
    kd_index_info(ix, &in);
    kd_py_leave(self);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    SET(d, "dim", PyLong_FromUnsignedLong(in.params.dim));
    SET(d, "metric", PyUnicode_FromString(kd_metric(in.params.metric)->name));
    SET(d, "count", PyLong_FromUnsignedLongLong(in.count));
    SET(d, "slots", PyLong_FromUnsignedLongLong(in.slots));
    SET(d, "quantization", PyUnicode_FromString(kd_quantization_name(in.params.quantization)));
    SET(d, "m", PyLong_FromUnsignedLong(in.params.m));
    SET(d, "ef_construction", PyLong_FromUnsignedLong(in.params.ef_construction));
    SET(d, "seed", PyLong_FromUnsignedLongLong(in.params.seed));
    SET(d, "path", in.path ? PyUnicode_DecodeFSDefault(in.path) : (Py_INCREF(Py_None), Py_None));
    SET(d, "storage", PyUnicode_FromString(in.on_disk ? "disk" : "memory"));
    SET(d, "io_backend",
        PyUnicode_FromString(in.on_disk ? kd_io_backend_name(in.io.backend) : "memory"));
    SET(d, "direct_io", PyBool_FromLong(in.on_disk && in.io.direct_io));
    SET(d, "record_size", PyLong_FromUnsignedLong(in.record_size));
    SET(d, "code_size", PyLong_FromUnsignedLong(in.code_size));
    SET(d, "centres", PyLong_FromUnsignedLong(in.centres));
    SET(d, "alignment", PyLong_FromUnsignedLong(in.on_disk ? in.io.alignment : KD_BLOCK));
    SET(d, "resident_bytes", PyLong_FromUnsignedLongLong(in.resident_bytes));
    SET(d, "default_oversample", PyFloat_FromDouble(in.default_oversample));
    SET(d, "default_ef", PyLong_FromSize_t(in.default_ef));
    PyObject *fb = PyList_New(0);
    static const char *fallbacks[] = {"no_direct_io", "no_io_uring"};
    static const unsigned bits[] = {KD_FALLBACK_NO_DIRECT, KD_FALLBACK_NO_URING};
    for (int i = 0; fb && i < 2; i++) {
        if (!in.on_disk || !(in.io.fallbacks & bits[i]))
            continue;
        PyObject *name = PyUnicode_FromString(fallbacks[i]);
        if (!name || PyList_Append(fb, name) != 0)
            Py_CLEAR(fb);
        Py_XDECREF(name);
    }
    SET(d, "fallbacks", fb);
    return d;
}

static PyObject *Index_stats(KdIndexObject *self, PyObject *args)
{
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p", &reset))
        return NULL;
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    struct kd_stats s;
    kd_index_stats(ix, &s, reset);
    kd_py_leave(self);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    SET(d, "queries", PyLong_FromUnsignedLongLong(s.queries));
    SET(d, "exact_queries", PyLong_FromUnsignedLongLong(s.exact_queries));
    SET(d, "read_ops", PyLong_FromUnsignedLongLong(s.read_ops));
    SET(d, "read_bytes", PyLong_FromUnsignedLongLong(s.read_bytes));
    SET(d, "rerank_vectors", PyLong_FromUnsignedLongLong(s.rerank_vectors));
    SET(d, "early_reads", PyLong_FromUnsignedLongLong(s.early_reads));
    SET(d, "early_unused", PyLong_FromUnsignedLongLong(s.early_unused));
    SET(d, "refined", PyLong_FromUnsignedLongLong(s.refined));
    SET(d, "scored", PyLong_FromUnsignedLongLong(s.scored));
    SET(d, "io_wait_seconds", PyFloat_FromDouble((double)s.io_wait_ns * 1e-9));
    SET(d, "graph_seconds", PyFloat_FromDouble((double)s.graph_ns * 1e-9));
    SET(d, "rerank_seconds", PyFloat_FromDouble((double)s.rerank_ns * 1e-9));
    return d;
}

static Py_ssize_t Index_len(KdIndexObject *self)
{
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return -1;
    Py_ssize_t n = (Py_ssize_t)kd_index_count(ix);
    kd_py_leave(self);
    return n;
}

static PyObject *Index_live_ids(KdIndexObject *self, PyObject *unused)
{
    (void)unused;
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    PyObject *out = NULL;
    /* Removes may land between sizing and filling (only removes can run
     * beside this call's callers): size again until it fits. */
    for (;;) {
        npy_intp n = (npy_intp)kd_index_count(ix);
        Py_XDECREF(out);
        out = PyArray_SimpleNew(1, &n, NPY_INT64);
        if (!out)
            break;
        size_t got;
        Py_BEGIN_ALLOW_THREADS got = kd_index_live_ids(ix, PyArray_DATA((PyArrayObject *)out),
                                                       (size_t)n);
        Py_END_ALLOW_THREADS if (got == (size_t)n) break;
    }
    kd_py_leave(self);
    return out;
}

/* For the two quantizer methods: self and another live core index (arg),
 * both entered; NULL with an exception set. */
static struct kd_index *enter_pair(KdIndexObject *self, PyObject *arg, KdIndexObject **other,
                                   struct kd_index **other_ix)
{
    if (!PyObject_TypeCheck(arg, &KdIndexType)) {
        PyErr_SetString(PyExc_TypeError, "expected a knndirect._core.Index");
        return NULL;
    }
    *other = (KdIndexObject *)arg;
    if (!(*other_ix = kd_py_enter(*other)))
        return NULL;
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        kd_py_leave(*other);
    return ix;
}

static PyObject *Index_adopt_quantizer(KdIndexObject *self, PyObject *arg)
{
    KdIndexObject *other;
    struct kd_index *from, *ix = enter_pair(self, arg, &other, &from);
    if (!ix)
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS err = kd_index_adopt_quantizer(ix, from);
    Py_END_ALLOW_THREADS kd_py_leave(self);
    kd_py_leave(other);
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *Index_same_quantizer(KdIndexObject *self, PyObject *arg)
{
    KdIndexObject *other;
    struct kd_index *b, *a = enter_pair(self, arg, &other, &b);
    if (!a)
        return NULL;
    int same;
    Py_BEGIN_ALLOW_THREADS same = kd_index_same_quantizer(a, b);
    Py_END_ALLOW_THREADS kd_py_leave(self);
    kd_py_leave(other);
    return PyBool_FromLong(same);
}

/* recall_sweep(queries, hidden, truth, k, ef, lens, threads=0, half=None,
 *              half_truth=None) ->
 * (recall per length, its spread over queries, code distances computed per
 * query, refinements per query, queries measured, the half's recall per
 * length or None).
 * hidden, truth and the half's are int64 (hidden may be None; truths are
 * nq * k ids, flat), lens int64 ascending. half: the half's ids, or an int,
 * the salt of kd_in_half's half. */
static PyObject *Index_recall_sweep(KdIndexObject *self, PyObject *args)
{
    PyObject *qo, *ho, *to, *lo, *hio = Py_None, *hto = Py_None;
    Py_ssize_t k, ef;
    unsigned int threads = 0;
    if (!PyArg_ParseTuple(args, "OOOnnO|IOO", &qo, &ho, &to, &k, &ef, &lo, &threads, &hio, &hto))
        return NULL;
    if (k < 1 || ef < 1) {
        PyErr_SetString(PyExc_ValueError, "k and ef must be at least 1");
        return NULL;
    }
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    Py_buffer qv = {0}, hv = {0}, tv = {0}, lv = {0}, hiv = {0}, htv = {0};
    const int64_t *hidden = NULL, *truth = NULL, *lens64 = NULL, *half_ids = NULL,
                  *half_truth = NULL;
    size_t nq = 0, nh = 0, nt = 0, nl = 0, nhalf = 0, nht = 0;
    unsigned long long salt = 0;
    int by_salt = PyLong_Check(hio);
    uint32_t *lens = NULL;
    PyObject *recall = NULL, *spread = NULL, *half = NULL, *out = NULL;
    int err = 0, taken = 0;
    if (kd_take_matrix(qo, &qv, kd_index_dim(ix), &nq))
        goto done;
    taken = 1;
    if (kd_take_ids(ho, &hv, &hidden, &nh) || kd_take_ids(to, &tv, &truth, &nt) ||
        kd_take_ids(lo, &lv, &lens64, &nl) ||
        (by_salt ? (salt = PyLong_AsUnsignedLongLong(hio), PyErr_Occurred() != NULL)
                 : kd_take_ids(hio, &hiv, &half_ids, &nhalf)) ||
        kd_take_ids(hto, &htv, &half_truth, &nht))
        goto done;
    if ((hidden && nh != nq) || nt != nq * (size_t)k || nl == 0 ||
        (half_ids || by_salt ? !half_truth || nht != nq * (size_t)k : half_truth != NULL)) {
        PyErr_SetString(PyExc_ValueError,
                        "recall_sweep: hidden, truth, lens or the half's of the wrong size");
        goto done;
    }
    npy_intp dims = (npy_intp)nl;
    if (!(lens = PyMem_Malloc(nl * sizeof *lens)) ||
        !(recall = PyArray_SimpleNew(1, &dims, NPY_FLOAT64)) ||
        !(spread = PyArray_SimpleNew(1, &dims, NPY_FLOAT64)) ||
        (half_truth && !(half = PyArray_SimpleNew(1, &dims, NPY_FLOAT64)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < nl; i++) {
        if (lens64[i] < 1 || lens64[i] > 1000000) {
            PyErr_SetString(PyExc_ValueError, "recall_sweep: a shortlist length out of range");
            goto done;
        }
        lens[i] = (uint32_t)lens64[i];
    }
    struct kd_sweep sw = {qv.buf,
                          nq,
                          hidden,
                          truth,
                          half_ids,
                          half_truth,
                          nhalf,
                          (uint64_t)salt,
                          (size_t)k,
                          (size_t)ef,
                          lens,
                          nl,
                          threads,
                          PyArray_DATA((PyArrayObject *)recall),
                          PyArray_DATA((PyArrayObject *)spread),
                          half ? PyArray_DATA((PyArrayObject *)half) : NULL,
                          0,
                          0,
                          0};
    Py_BEGIN_ALLOW_THREADS err = kd_index_recall_sweep(ix, &sw);
    Py_END_ALLOW_THREADS if (!err)
        out = Py_BuildValue("OOddnO", recall, spread, sw.scored, sw.refined,
                            (Py_ssize_t)sw.nqueries, half ? half : Py_None);
done:
    if (taken)
        PyBuffer_Release(&qv);
    kd_release_buffer(&hv);
    kd_release_buffer(&tv);
    kd_release_buffer(&lv);
    kd_release_buffer(&hiv);
    kd_release_buffer(&htv);
    PyMem_Free(lens);
    Py_XDECREF(recall);
    Py_XDECREF(spread);
    Py_XDECREF(half);
    kd_py_leave(self);
    if (err)
        return kd_raise(err);
    return out;
}

static PyObject *Index_calibration(KdIndexObject *self, PyObject *unused)
{
    (void)unused;
    struct kd_index *ix = kd_py_enter(self);
    if (!ix)
        return NULL;
    PyObject *out = NULL;
    /* A set_calibration may land between sizing and copying: size again. */
    for (;;) {
        size_t n = kd_index_calibration(ix, NULL, 0);
        Py_XDECREF(out);
        if (!(out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n)))
            break;
        if (kd_index_calibration(ix, PyBytes_AS_STRING(out), n) == n)
            break;
    }
    kd_py_leave(self);
    return out;
}

static PyObject *Index_set_calibration(KdIndexObject *self, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) != 0)
        return NULL;
    struct kd_index *ix = kd_py_enter(self);
    int err = ix ? kd_index_set_calibration(ix, b.buf, (size_t)b.len) : 0;
    if (ix)
        kd_py_leave(self);
    PyBuffer_Release(&b);
    if (!ix)
        return NULL;
    return err ? kd_raise(err) : (Py_INCREF(Py_None), Py_None);
}

static PyMethodDef Index_methods[] = {
    {"train", (PyCFunction)Index_train, METH_O, "Fit the quantizer's centre to a sample."},
    {"add", (PyCFunction)Index_add, METH_VARARGS, "add(x, ids, threads=0)"},
    {"reserve", (PyCFunction)Index_reserve, METH_O, "reserve(n): room for n more vectors"},
    {"remove", (PyCFunction)Index_remove, METH_O, "remove(ids)"},
    {"contains", (PyCFunction)Index_contains, METH_O, "contains(ids) -> bool array"},
    {"search", (PyCFunction)(void (*)(void))Index_search, METH_VARARGS | METH_KEYWORDS,
     "search(queries, k, ef=0, oversample=0, rerank=True, exact=False, threads=0, filter=None, *, "
     "serves=0)"},
    {"search_widths", (PyCFunction)(void (*)(void))Index_search_widths,
     METH_VARARGS | METH_KEYWORDS,
     "search_widths(k, ef=0, oversample=0, *, serves=0) -> (beam width, shortlist rows)"},
    {"get_vectors", (PyCFunction)Index_get_vectors, METH_O, "get_vectors(ids)"},
    {"save_path", (PyCFunction)Index_save_path, METH_O, "Atomic save to a path."},
    {"save_file", (PyCFunction)Index_save_file, METH_O, "Save through a binary file object."},
    {"to_bytes", (PyCFunction)Index_to_bytes, METH_NOARGS, "Serialize to bytes."},
    {"verify", (PyCFunction)Index_verify, METH_NOARGS, "Check every checksum."},
    {"info", (PyCFunction)Index_info, METH_NOARGS, "Dict describing the index."},
    {"stats", (PyCFunction)Index_stats, METH_VARARGS, "stats(reset=False)"},
    {"close", (PyCFunction)Index_close, METH_NOARGS, "Free the index."},
    {"live_ids", (PyCFunction)Index_live_ids, METH_NOARGS, "live_ids() -> int64 array, row order"},
    {"adopt_quantizer", (PyCFunction)Index_adopt_quantizer, METH_O,
     "adopt_quantizer(other): take other's quantizer; rows held are encoded anew and the "
     "calibration is dropped."},
    {"same_quantizer", (PyCFunction)Index_same_quantizer, METH_O,
     "same_quantizer(other) -> True when both encode alike."},
    {"recall_sweep", (PyCFunction)Index_recall_sweep, METH_VARARGS,
     "recall_sweep(queries, hidden, truth, k, ef, lens, threads=0, half=None, "
     "half_truth=None); half: ids, or in_half's salt"},
    {"calibration", (PyCFunction)Index_calibration, METH_NOARGS, "The stored calibration (bytes)."},
    {"set_calibration", (PyCFunction)Index_set_calibration, METH_O,
     "set_calibration(data): store bytes as the calibration (b'': none)."},
    {NULL},
};

static PyGetSetDef Index_getset[] = {
    {"closed", (getter)Index_closed, NULL, "True once close() ran", NULL},
    {NULL},
};

static PySequenceMethods Index_as_sequence = {.sq_length = (lenfunc)Index_len};

PyTypeObject KdIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "knndirect._core.Index",
    .tp_basicsize = sizeof(KdIndexObject),
    .tp_weaklistoffset = offsetof(KdIndexObject, weakrefs),
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Core index (use knndirect.Index).",
    .tp_methods = Index_methods,
    .tp_getset = Index_getset,
    .tp_as_sequence = &Index_as_sequence,
    .tp_new = Index_new,
};

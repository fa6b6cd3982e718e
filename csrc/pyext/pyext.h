/* pyext.h — internal header of the CPython binding. The binding parses
 * arguments, takes buffers and allocates NumPy outputs with the GIL held,
 * runs the C core with the GIL released, and raises only afterwards. */
#ifndef KD_PYEXT_H
#define KD_PYEXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL kd_ARRAY_API
#ifndef KD_PYEXT_MODULE
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <pthread.h>

#include "index.h"
#include "storage.h"

/* The Python-visible index: owns one core index. `use` lets close() wait for
 * calls that are running with the GIL released. */
typedef struct {
    PyObject_HEAD struct kd_index *ix;
    pthread_rwlock_t use;
    PyObject *weakrefs; /* a collection tracks the segment files its handles hold */
} KdIndexObject;

extern PyTypeObject KdIndexType;

/* The index of a live object, with close() held off until kd_py_leave;
 * NULL with ValueError set when it is closed. */
struct kd_index *kd_py_enter(KdIndexObject *self);
void kd_py_leave(KdIndexObject *self);
/* Buffers, taken with the GIL held; -1 with an exception set. A C-contiguous
 * float32 matrix of dim columns: */
int kd_take_matrix(PyObject *obj, Py_buffer *v, uint32_t dim, size_t *rows);
/* A contiguous int64 vector, or None (data NULL); release with kd_release_buffer. */
int kd_take_ids(PyObject *obj, Py_buffer *v, const int64_t **data, size_t *n);
void kd_release_buffer(Py_buffer *v);

/* A search call between its parsing and the core: queries and filter
 * taken, the outputs allocated, the core's parameters set. */
struct kd_py_search {
    Py_buffer qv, fv;
    size_t nq;
    struct kd_search_params sp;
    PyObject *dist, *ids;
};
/* -1 with an exception set; kd_py_search_finish releases what was taken
 * either way. */
int kd_py_search_begin(struct kd_py_search *s, PyObject *queries, PyObject *filter, uint32_t dim,
                       Py_ssize_t k, Py_ssize_t ef, double oversample, int rerank, int exact,
                       unsigned threads);
/* The buffers released; (distances, ids), or NULL with the core's error
 * (err, 0 for none) or the pending exception raised. */
PyObject *kd_py_search_finish(struct kd_py_search *s, int err);

/* Wrap a core index in a new Python object (steals ix). */
PyObject *kd_index_wrap(struct kd_index *ix);

/* The metric table (metric.h) for Python: a tuple, in code order, of dicts
 * {name, code, larger_is_better, normalized, missing}. */
PyObject *kd_metrics_table(void);

/* Turn a negative errno from the core into the matching Python exception. */
PyObject *kd_raise(int err);
/* The same as an OSError whatever the errno (a failure of the filesystem). */
PyObject *kd_raise_os(int err);

/* A writer whose sink is a Python binary file-like object. It takes the GIL
 * for each chunk; a Python exception raised by write() is kept and restored
 * by kd_pywriter_finish. */
struct kd_pywriter {
    PyObject *file, *name;
    PyObject *exc_type, *exc_value, *exc_tb;
};
/* With the GIL held; -1 with an exception set on failure. */
int kd_pywriter_init(struct kd_writer *w, struct kd_pywriter *ctx, PyObject *file);
/* With the GIL held: restore a pending exception; returns 1 if there was one. */
int kd_pywriter_finish(struct kd_pywriter *ctx);

/* A reader whose source is a Python binary file-like object: readinto() into
 * the destination itself (8 MiB at most per call), else read() and a copy.
 * It takes the GIL for each chunk; an exception is kept as for the writer.
 * size: bytes the source is known to hold, or KD_SIZE_UNKNOWN. */
struct kd_pyreader {
    PyObject *readinto, *read;
    PyObject *exc_type, *exc_value, *exc_tb;
};
/* With the GIL held; -1 with TypeError set when file cannot be read. */
int kd_pyreader_init(struct kd_reader *r, struct kd_pyreader *ctx, PyObject *file, uint64_t size);
int kd_pyreader_finish(struct kd_pyreader *ctx);

/* Release a memoryview over our memory after a call into Python. */
int kd_release_view(PyObject *view);

/* Module functions: load_bytes(buffer), load_path(path), load_file(file, size=-1). */
PyObject *kd_mod_load_bytes(PyObject *mod, PyObject *arg);
PyObject *kd_mod_load_path(PyObject *mod, PyObject *arg);
PyObject *kd_mod_load_file(PyObject *mod, PyObject *args);

/* Module functions over several indexes (segments of a collection):
 * search_many(indexes, queries, k, ...) in pyext/segments.c and
 * merge(path, indexes, ...) in pyext/merge.c. */
PyObject *kd_mod_search_many(PyObject *mod, PyObject *args, PyObject *kw);
PyObject *kd_mod_merge(PyObject *mod, PyObject *args, PyObject *kw);
/* Test hook of merge's build-code distances (pyext/merge.c). */
PyObject *kd_mod_merge_kernel_gap(PyObject *mod, PyObject *args);
PyObject *kd_mod_merge_row_bytes(PyObject *mod, PyObject *args);

#endif

/* knndirect._core.merge(path, indexes, threads=0, memory_budget=0, seed=0,
 * progress=None, quantizer=None) -> dict: the live vectors of several
 * indexes written as one index file (csrc/merge.h), encoded with the
 * quantizer of `quantizer` (an index) where one is given. The GIL is
 * released for the merge and taken back only to call progress. */
#include "pyext.h"
#include "common.h"
#include "merge.h"
#include "metric.h"

/* The C progress callback's state: the Python callable (or NULL) and the
 * exception that cancelled the merge, kept for after it. */
struct py_progress {
    PyObject *fn;
    PyObject *exc_type, *exc_value, *exc_tb;
    int said_no; /* the callable returned False */
};

/* Called on the merging thread, which holds no GIL. A pending signal
 * (KeyboardInterrupt) cancels the merge as well, progress or not. */
static int call_progress(void *arg, uint64_t done, uint64_t total)
{
    struct py_progress *p = arg;
    PyGILState_STATE gs = PyGILState_Ensure();
    int cancel = 0;
    if (PyErr_CheckSignals() < 0) {
        cancel = 1;
    } else if (p->fn) {
        PyObject *r = PyObject_CallFunction(p->fn, "KK", (unsigned long long)done,
                                            (unsigned long long)total);
        if (!r) {
            cancel = 1;
        } else if (r == Py_False) {
            cancel = p->said_no = 1;
        }
        Py_XDECREF(r);
    }
    if (cancel && PyErr_Occurred())
        PyErr_Fetch(&p->exc_type, &p->exc_value, &p->exc_tb);
    PyGILState_Release(gs);
    return cancel;
}

static PyObject *report_dict(const struct kd_merge_report *r)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:d,s:d,s:d,s:d,s:d,s:d}",
                         "rows_written", (unsigned long long)r->rows_written, "rows_reused",
                         (unsigned long long)r->rows_reused, "rows_inserted",
                         (unsigned long long)r->rows_inserted, "nodes_repaired",
                         (unsigned long long)r->nodes_repaired, "nodes_reconnected",
                         (unsigned long long)r->nodes_reconnected, "codes_reencoded",
                         (unsigned long long)r->codes_reencoded, "build_code_bits",
                         r->build_code_bits, "base", r->base, "fit_seconds", r->fit_seconds,
                         "encode_seconds", r->encode_seconds, "repair_seconds", r->repair_seconds,
                         "insert_seconds", r->insert_seconds, "write_seconds", r->write_seconds,
                         "total_seconds", r->total_seconds);
}

/* The merge itself, with the GIL released. */
static int merge_nogil(const char *path, struct kd_index **ix, size_t n,
                       const struct kd_merge_params *mp, struct kd_merge_report *rep)
{
    int err;
    Py_BEGIN_ALLOW_THREADS err = kd_merge(path, ix, n, mp, rep);
    Py_END_ALLOW_THREADS return err;
}

PyObject *kd_mod_merge(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", "indexes",  "threads",   "memory_budget",
                            "seed", "progress", "quantizer", NULL};
    PyObject *pathobj, *seq = NULL, *indexes, *progress = Py_None, *quantizer = Py_None,
                       *result = NULL;
    unsigned int threads = 0;
    unsigned long long budget = 0, seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|IKKOO", names, PyUnicode_FSConverter, &pathobj,
                                     &indexes, &threads, &budget, &seed, &progress, &quantizer))
        return NULL;
    struct kd_index **ix = NULL;
    Py_ssize_t n = 0, entered = 0;
    struct py_progress pp = {progress == Py_None ? NULL : progress, NULL, NULL, NULL, 0};
    struct kd_merge_params mp = {threads, budget, seed, call_progress, &pp, NULL};
    struct kd_merge_report rep;
    if (progress != Py_None && !PyCallable_Check(progress)) {
        PyErr_SetString(PyExc_TypeError, "progress must be None or a callable(done, total)");
        goto out;
    }
    if (quantizer != Py_None) {
        if (!PyObject_TypeCheck(quantizer, &KdIndexType)) {
            PyErr_SetString(PyExc_TypeError, "quantizer must be None or a knndirect._core.Index");
            goto out;
        }
        if (!(mp.quantizer = kd_py_enter((KdIndexObject *)quantizer)))
            goto out;
    }
    if (!(seq = PySequence_Fast(indexes, "indexes must be a sequence of knndirect._core.Index")))
        goto out;
    n = PySequence_Fast_GET_SIZE(seq);
    if (!(ix = PyMem_Calloc(n ? (size_t)n : 1, sizeof *ix))) {
        PyErr_NoMemory();
        goto out;
    }
    for (; entered < n; entered++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, entered);
        if (!PyObject_TypeCheck(o, &KdIndexType)) {
            PyErr_Format(PyExc_TypeError, "indexes[%zd] is not a knndirect._core.Index", entered);
            goto out;
        }
        if (!(ix[entered] = kd_py_enter((KdIndexObject *)o)))
            goto out;
    }
    int err = merge_nogil(PyBytes_AS_STRING(pathobj), ix, (size_t)n, &mp, &rep);
    if (pp.exc_type) {
        kd_clear_error();
        PyErr_Restore(pp.exc_type, pp.exc_value, pp.exc_tb);
    } else if (err == -ECANCELED) {
        kd_clear_error();
        PyErr_SetString(PyExc_RuntimeError,
                        "merge cancelled: the progress callback returned False");
    } else if (err) {
        kd_raise(err);
    } else {
        result = report_dict(&rep);
    }
out:
    for (Py_ssize_t i = 0; i < entered; i++)
        kd_py_leave((KdIndexObject *)PySequence_Fast_GET_ITEM(seq, i));
    if (mp.quantizer)
        kd_py_leave((KdIndexObject *)quantizer);
    PyMem_Free(ix);
    Py_XDECREF(seq);
    Py_DECREF(pathobj);
    return result;
}

/* merge_row_bytes(bits, dim) -> int: memory_budget a merged row needs (merge.h). */
PyObject *kd_mod_merge_row_bytes(PyObject *mod, PyObject *args)
{
    (void)mod;
    unsigned int bits, dim;
    if (!PyArg_ParseTuple(args, "II", &bits, &dim))
        return NULL;
    if (bits != 4 && bits != 8) {
        PyErr_SetString(PyExc_ValueError, "bits must be 4 or 8");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(kd_merge_row_bytes(bits, dim));
}

/* Test hook: _merge_kernel_gap(bits, dim, metric, seed) -> float (merge.h). */
PyObject *kd_mod_merge_kernel_gap(PyObject *mod, PyObject *args)
{
    unsigned int bits, dim;
    int metric;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "IIi|K", &bits, &dim, &metric, &seed))
        return NULL;
    if ((bits != 4 && bits != 8) || !dim || dim > (1u << 16) || !kd_metric(metric)) {
        PyErr_SetString(PyExc_ValueError, "bits must be 4 or 8, dim 1..65536, metric a code");
        return NULL;
    }
    double gap = kd_merge_kernel_gap(bits, dim, metric, seed);
    if (gap < 0)
        return PyErr_NoMemory();
    return PyFloat_FromDouble(gap);
}

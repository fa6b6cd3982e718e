/* knndirect._core.search_many: one search over several indexes, the segments
 * of a collection (multisearch.h). */
#include "pyext.h"
#include "multisearch.h"

/* The number of columns of a 2-d buffer, for a call with no index to take
 * the dimension from; 0 when it is not one (kd_take_matrix then says why). */
static uint32_t buffer_columns(PyObject *obj)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    uint32_t dim = v.ndim == 2 && v.shape[1] > 0 && v.shape[1] <= UINT32_MAX ? (uint32_t)v.shape[1]
                                                                             : 0;
    PyBuffer_Release(&v);
    return dim;
}

PyObject *kd_mod_search_many(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *names[] = {"indexes", "queries", "k",       "ef",     "oversample",
                            "rerank",  "exact",   "threads", "filter", NULL};
    PyObject *io, *qo, *fo = Py_None;
    Py_ssize_t k, ef = 0;
    double oversample = 0;
    int rerank = 1, exact = 0;
    unsigned int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOn|ndppIO", names, &io, &qo, &k, &ef, &oversample,
                                     &rerank, &exact, &threads, &fo))
        return NULL;
    if (!PySequence_Check(io) || PyUnicode_Check(io) || PyBytes_Check(io)) {
        PyErr_Format(PyExc_TypeError, "indexes must be a sequence of Index objects, got %s",
                     Py_TYPE(io)->tp_name);
        return NULL;
    }
    /* A tuple of our own: the caller's list may change, and drop its
     * references, while the GIL is released. */
    PyObject *seq = PySequence_Tuple(io);
    if (!seq)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *o = PyTuple_GET_ITEM(seq, j);
        if (!PyObject_TypeCheck(o, &KdIndexType)) {
            PyErr_Format(PyExc_TypeError, "indexes[%zd] is a %s, not a knndirect._core.Index", j,
                         Py_TYPE(o)->tp_name);
            Py_DECREF(seq);
            return NULL;
        }
    }
    struct kd_index **ixs = PyMem_Malloc((n ? (size_t)n : 1) * sizeof *ixs);
    if (!ixs) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t entered = 0;
    struct kd_py_search s;
    memset(&s, 0, sizeof s);
    int err = 0;
    for (; entered < n; entered++)
        if (!(ixs[entered] = kd_py_enter((KdIndexObject *)PyTuple_GET_ITEM(seq, entered))))
            goto out;
    uint32_t dim = n ? kd_index_dim(ixs[0]) : buffer_columns(qo);
    for (Py_ssize_t j = 1; j < n; j++)
        if (kd_index_dim(ixs[j]) != dim) {
            PyErr_Format(PyExc_ValueError, "indexes[%zd] has dim %u, indexes[0] dim %u", j,
                         kd_index_dim(ixs[j]), dim);
            goto out;
        }
    if (kd_py_search_begin(&s, qo, fo, dim, k, ef, oversample, rerank, exact, threads))
        goto out;
    Py_BEGIN_ALLOW_THREADS err = kd_search_many(ixs, (size_t)n, s.qv.buf, s.nq, &s.sp,
                                                PyArray_DATA((PyArrayObject *)s.dist),
                                                PyArray_DATA((PyArrayObject *)s.ids));
    Py_END_ALLOW_THREADS out : while (entered)
                                   kd_py_leave((KdIndexObject *)PyTuple_GET_ITEM(seq, --entered));
    PyMem_Free(ixs);
    Py_DECREF(seq);
    return kd_py_search_finish(&s, err);
}

/* The knndirect._core module: loaders, features and error mapping. */
#define KD_PYEXT_MODULE
#include "pyext.h"
#include "common.h"
#include "distance.h"
#include "format.h"
#include "vecio.h"

#include <string.h>

PyObject *kd_raise(int err)
{
    const char *msg = kd_last_error();
    if (!msg[0])
        msg = strerror(-err);
    switch (-err) {
    case EINVAL:
    case EDOM:
    case EEXIST:
    case EROFS:
    case EOVERFLOW:
        PyErr_SetString(PyExc_ValueError, msg);
        break;
    case ESRCH:
        PyErr_SetString(PyExc_KeyError, msg);
        break;
    case ENOMEM:
        PyErr_SetString(PyExc_MemoryError, msg);
        break;
    default: {
        PyObject *e = Py_BuildValue("(is)", -err, msg);
        if (e) {
            PyErr_SetObject(PyExc_OSError, e);
            Py_DECREF(e);
        }
    }
    }
    kd_clear_error();
    return NULL;
}

static PyObject *mod_load_bytes(PyObject *mod, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    struct kd_index *ix = NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = kd_index_load(&ix, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (err)
        return kd_raise(err);
    return kd_index_wrap(ix);
}

static PyObject *mod_open(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", "direct_io", "io_backend", "io_depth", "preload", NULL};
    PyObject *pathobj;
    int direct = 1, backend = KD_IO_AUTO;
    unsigned int depth = 128, preload = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|piII", names, PyUnicode_FSConverter,
                                     &pathobj, &direct, &backend, &depth, &preload))
        return NULL;
    struct kd_open_params op = {direct, backend, depth, preload};
    struct kd_index *ix = NULL;
    int err;
    const char *path = PyBytes_AS_STRING(pathobj);
    Py_BEGIN_ALLOW_THREADS
    err = kd_index_open(&ix, path, &op);
    Py_END_ALLOW_THREADS
    Py_DECREF(pathobj);
    if (err)
        return kd_raise(err);
    return kd_index_wrap(ix);
}

static PyObject *mod_features(PyObject *mod, PyObject *unused)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    PyObject *v;
#define PUT(key, expr)                                                                  \
    v = (expr);                                                                         \
    if (!v || PyDict_SetItemString(d, key, v)) {                                        \
        Py_XDECREF(v);                                                                  \
        Py_DECREF(d);                                                                   \
        return NULL;                                                                    \
    }                                                                                   \
    Py_DECREF(v);
    PUT("io_uring", PyBool_FromLong(kd_vecio_have_uring()));
    PUT("avx2", PyBool_FromLong(kd_cpu_has_avx2()));
    PUT("avx512", PyBool_FromLong(kd_cpu_has_avx512()));
    PUT("simd", PyUnicode_FromString(kd_kernels()->name));
    PUT("format_version", PyLong_FromLong(KD_FORMAT_VERSION));
#undef PUT
    return d;
}

/* Test hooks: kernels and estimators by name, against their scalar reference. */
static PyObject *mod_kernel(PyObject *mod, PyObject *args)
{
    const char *name, *which;
    Py_buffer a, b;
    if (!PyArg_ParseTuple(args, "ssy*y*", &name, &which, &a, &b))
        return NULL;
    const struct kd_kernels *k = kd_kernels_named(name);
    PyObject *r = NULL;
    if (!k)
        PyErr_Format(PyExc_ValueError, "kernel set %s is unavailable", name);
    else if (a.len != b.len || a.len % 4)
        PyErr_SetString(PyExc_ValueError, "operands differ in length");
    else if (strcmp(which, "l2sq") == 0)
        r = PyFloat_FromDouble(k->l2sq(a.buf, b.buf, (size_t)a.len / 4));
    else if (strcmp(which, "dot") == 0)
        r = PyFloat_FromDouble(k->dot(a.buf, b.buf, (size_t)a.len / 4));
    else
        PyErr_SetString(PyExc_ValueError, "unknown kernel");
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return r;
}

static PyMethodDef mod_methods[] = {
    {"load_bytes", mod_load_bytes, METH_O, "Load an index held in a bytes-like object."},
    {"open", (PyCFunction)(void (*)(void))mod_open, METH_VARARGS | METH_KEYWORDS,
     "open(path, direct_io=True, io_backend=0, io_depth=128, preload=0)"},
    {"features", mod_features, METH_NOARGS, "What this build and CPU offer."},
    {"_kernel", mod_kernel, METH_VARARGS, "Run one distance kernel variant (tests)."},
    {NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "knndirect._core", "knndirect C core binding.", -1, mod_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    if (PyType_Ready(&KdIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    Py_INCREF(&KdIndexType);
    if (PyModule_AddObject(m, "Index", (PyObject *)&KdIndexType) < 0) {
        Py_DECREF(&KdIndexType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "IO_AUTO", KD_IO_AUTO);
    PyModule_AddIntConstant(m, "IO_URING", KD_IO_URING);
    PyModule_AddIntConstant(m, "IO_THREADS", KD_IO_THREADS);
    PyModule_AddIntConstant(m, "IO_PREAD", KD_IO_PREAD);
    PyModule_AddIntConstant(m, "IO_MMAP", KD_IO_MMAP);
    PyModule_AddIntConstant(m, "SEC_IDS", KD_SEC_IDS);
    PyModule_AddIntConstant(m, "SEC_CODES", KD_SEC_CODES);
    PyModule_AddIntConstant(m, "SEC_GRAPH_LEVELS", KD_SEC_LEVELS);
    PyModule_AddIntConstant(m, "SEC_GRAPH_LEVEL0", KD_SEC_LEVEL0);
    PyModule_AddIntConstant(m, "SEC_GRAPH_UPPER", KD_SEC_UPPER);
    PyModule_AddIntConstant(m, "SEC_VECTORS", KD_SEC_VECTORS);
    PyModule_AddIntConstant(m, "SEC_DELETED", KD_SEC_DELETED);
    return m;
}

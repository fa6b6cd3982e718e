/* Loading an index from a path, a bytes-like object or a Python binary
 * file-like object. The core reads through a kd_reader with the GIL released;
 * the file-like reader takes the GIL only for each chunk it asks Python for. */
#include "pyext.h"
#include "common.h"

#define CHUNK (8u << 20)

/* Drop our exported view after a call: an object that kept the memoryview
 * can no longer reach memory we are about to reuse. 0, or -1 (with the error
 * cleared) when something still holds an export of it. */
int kd_release_view(PyObject *view)
{
    PyObject *r = PyObject_CallMethod(view, "release", NULL);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static int64_t keep_exception(struct kd_pyreader *r, const char *what)
{
    if (PyErr_Occurred())
        PyErr_Fetch(&r->exc_type, &r->exc_value, &r->exc_tb);
    return kd_fail(-EIO, "the file object's %s raised", what);
}

static int64_t py_read(void *p, void *buf, size_t n)
{
    struct kd_pyreader *r = p;
    if (n > CHUNK)
        n = CHUNK;
    int64_t got;
    PyGILState_STATE g = PyGILState_Ensure();
    if (r->readinto) {
        PyObject *view = PyMemoryView_FromMemory(buf, (Py_ssize_t)n, PyBUF_WRITE);
        PyObject *res = view ? PyObject_CallFunctionObjArgs(r->readinto, view, NULL) : NULL;
        if (!res)
            keep_exception(r, "readinto()");
        int kept = view && kd_release_view(view) != 0;
        Py_XDECREF(view);
        if (!res) {
            got = kd_fail(-EIO, "the file object's readinto() raised");
        } else if (kept) {
            got = kd_fail(-EIO, "the file object kept the buffer given to readinto()");
        } else if (res == Py_None) {
            got = kd_fail(-EAGAIN, "the file object's readinto() returned None (a non-blocking "
                                   "stream with no data ready)");
        } else {
            long long v = PyLong_AsLongLong(res);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                got = kd_fail(-EIO, "the file object's readinto() did not return a count");
            } else if (v < 0 || (unsigned long long)v > n) {
                got = kd_fail(-EIO, "the file object's readinto() returned an invalid count");
            } else {
                got = v;
            }
        }
        Py_XDECREF(res);
    } else {
        PyObject *res = PyObject_CallFunction(r->read, "n", (Py_ssize_t)n);
        Py_buffer b;
        if (!res) {
            got = keep_exception(r, "read()");
        } else if (res == Py_None) {
            got = kd_fail(-EAGAIN, "the file object's read() returned None (a non-blocking "
                                   "stream with no data ready)");
        } else if (PyUnicode_Check(res)) {
            got = kd_fail(-EINVAL, "the file object returned str: open it in binary mode");
        } else if (PyObject_GetBuffer(res, &b, PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            got = kd_fail(-EINVAL, "the file object's read() did not return bytes");
        } else {
            if ((size_t)b.len > n) {
                got = kd_fail(-EIO, "the file object's read() returned more bytes than asked");
            } else {
                memcpy(buf, b.buf, (size_t)b.len);
                got = b.len;
            }
            PyBuffer_Release(&b);
        }
        Py_XDECREF(res);
    }
    PyGILState_Release(g);
    return got;
}

int kd_pyreader_init(struct kd_reader *r, struct kd_pyreader *ctx, PyObject *file, uint64_t size)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->readinto = PyObject_GetAttrString(file, "readinto");
    if (!ctx->readinto) {
        PyErr_Clear();
        ctx->read = PyObject_GetAttrString(file, "read");
        if (!ctx->read) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "source must be a path, a bytes-like object or a binary file-like "
                            "object with readinto() or read()");
            return -1;
        }
    }
    r->read = py_read;
    r->close = NULL;
    r->ctx = ctx;
    r->size = size;
    r->whole = 0;
    return 0;
}

int kd_pyreader_finish(struct kd_pyreader *ctx)
{
    Py_CLEAR(ctx->readinto);
    Py_CLEAR(ctx->read);
    if (!ctx->exc_type)
        return 0;
    PyErr_Restore(ctx->exc_type, ctx->exc_value, ctx->exc_tb);
    ctx->exc_type = ctx->exc_value = ctx->exc_tb = NULL;
    return 1;
}

/* ---- module functions */

PyObject *kd_mod_load_bytes(PyObject *mod, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    struct kd_index *ix = NULL;
    struct kd_reader r;
    struct kd_mem_reader mr;
    int err;
    kd_mem_reader_init(&r, &mr, v.buf, (size_t)v.len);
    Py_BEGIN_ALLOW_THREADS err = kd_index_load(&ix, &r);
    Py_END_ALLOW_THREADS PyBuffer_Release(&v);
    if (err)
        return kd_raise(err);
    return kd_index_wrap(ix);
}

PyObject *kd_mod_load_path(PyObject *mod, PyObject *arg)
{
    PyObject *pathobj;
    if (!PyUnicode_FSConverter(arg, &pathobj))
        return NULL;
    struct kd_index *ix = NULL;
    int err;
    const char *path = PyBytes_AS_STRING(pathobj);
    Py_BEGIN_ALLOW_THREADS err = kd_index_load_path(&ix, path);
    Py_END_ALLOW_THREADS Py_DECREF(pathobj);
    if (err)
        return kd_raise(err);
    return kd_index_wrap(ix);
}

PyObject *kd_mod_load_file(PyObject *mod, PyObject *args)
{
    PyObject *file;
    long long size = -1;
    if (!PyArg_ParseTuple(args, "O|L", &file, &size))
        return NULL;
    struct kd_reader r;
    struct kd_pyreader pr;
    if (kd_pyreader_init(&r, &pr, file, size < 0 ? KD_SIZE_UNKNOWN : (uint64_t)size))
        return NULL;
    struct kd_index *ix = NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS err = kd_index_load(&ix, &r);
    Py_END_ALLOW_THREADS if (kd_pyreader_finish(&pr))
    {
        kd_index_free(ix);
        kd_clear_error();
        return NULL;
    }
    if (err)
        return kd_raise(err);
    return kd_index_wrap(ix);
}

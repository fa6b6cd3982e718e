#include "pyext.h"
#include "common.h"

#define CHUNK (8u << 20)

static int py_write(void *p, const void *buf, size_t n)
{
    struct kd_pywriter *w = p;
    int err = 0;
    PyGILState_STATE g = PyGILState_Ensure();
    while (n > 0 && !err) {
        size_t len = n < CHUNK ? n : CHUNK;
        PyObject *view = PyMemoryView_FromMemory((char *)buf, (Py_ssize_t)len, PyBUF_READ);
        PyObject *r = view ? PyObject_CallMethodObjArgs(w->file, w->name, view, NULL) : NULL;
        if (!r)
            PyErr_Fetch(&w->exc_type, &w->exc_value, &w->exc_tb);
        int kept = view && kd_release_view(view) != 0;
        Py_XDECREF(view);
        if (!r) {
            err = kd_fail(-EIO, "the file object's write() raised");
            break;
        }
        if (kept) {
            Py_DECREF(r);
            err = kd_fail(-EIO, "the file object kept the buffer given to write()");
            break;
        }
        /* Raw streams may write less than asked; buffered ones never do. */
        Py_ssize_t done = (r == Py_None) ? (Py_ssize_t)len : PyLong_AsSsize_t(r);
        Py_DECREF(r);
        if (done < 0 || done > (Py_ssize_t)len) {
            PyErr_Clear();
            err = kd_fail(-EIO, "the file object's write() returned an invalid count");
            break;
        }
        if (done == 0) {
            err = kd_fail(-EIO, "the file object's write() wrote nothing");
            break;
        }
        buf = (const char *)buf + done;
        n -= (size_t)done;
    }
    PyGILState_Release(g);
    return err;
}

int kd_pywriter_init(struct kd_writer *w, struct kd_pywriter *ctx, PyObject *file)
{
    ctx->file = file;
    ctx->exc_type = ctx->exc_value = ctx->exc_tb = NULL;
    ctx->name = PyUnicode_InternFromString("write");
    if (!ctx->name)
        return -1;
    w->write = py_write;
    w->close = NULL;
    w->ctx = ctx;
    return 0;
}

int kd_pywriter_finish(struct kd_pywriter *ctx)
{
    Py_CLEAR(ctx->name);
    if (!ctx->exc_type)
        return 0;
    PyErr_Restore(ctx->exc_type, ctx->exc_value, ctx->exc_tb);
    ctx->exc_type = ctx->exc_value = ctx->exc_tb = NULL;
    return 1;
}

/* The knndirect._core module: loaders, features and error mapping. */
#define KD_PYEXT_MODULE
#include "pyext.h"
#include "buildcode.h"
#include "calibrate.h"
#include "common.h"
#include "distance.h"
#include "exact.h"
#include "format.h"
#include "hnsw.h"
#include "quant.h"
#include "vecio.h"

#include <string.h>

/* knndirect.CorruptIndexError, made once at module init. */
static PyObject *CorruptIndexError;

static const char corrupt_doc[] =
    "The index data is truncated, damaged or not a knndirect index at all.\n\n"
    "Raised by knndirect.load, knndirect.open and Index.verify when a checksum\n"
    "does not match, the data ends early or goes on past its end, or the\n"
    "structure it describes is inconsistent. A subclass of ValueError: a bad\n"
    "argument raises a plain ValueError, and a failing read an OSError.";

PyObject *kd_raise_os(int err)
{
    const char *msg = kd_last_error();
    PyObject *e = Py_BuildValue("(is)", -err, msg[0] ? msg : strerror(-err));
    if (e) {
        PyErr_SetObject(PyExc_OSError, e);
        Py_DECREF(e);
    }
    kd_clear_error();
    return NULL;
}

PyObject *kd_raise(int err)
{
    const char *msg = kd_last_error();
    if (!msg[0])
        msg = strerror(-err);
    switch (-err) {
    case KD_ECORRUPT:
        PyErr_SetString(CorruptIndexError ? CorruptIndexError : PyExc_ValueError, msg);
        break;
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
    default:
        return kd_raise_os(err);
    }
    kd_clear_error();
    return NULL;
}

static PyObject *mod_open(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", "direct_io", "io_backend", "io_depth", "preload", NULL};
    PyObject *pathobj;
    int direct = 1, backend = KD_IO_AUTO;
    unsigned int depth = 128, preload = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|piII", names, PyUnicode_FSConverter, &pathobj,
                                     &direct, &backend, &depth, &preload))
        return NULL;
    struct kd_open_params op = {direct, backend, depth, preload};
    struct kd_index *ix = NULL;
    int err;
    const char *path = PyBytes_AS_STRING(pathobj);
    Py_BEGIN_ALLOW_THREADS err = kd_index_open(&ix, path, &op);
    Py_END_ALLOW_THREADS Py_DECREF(pathobj);
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
#define PUT(key, expr)                                                                             \
    v = (expr);                                                                                    \
    if (!v || PyDict_SetItemString(d, key, v)) {                                                   \
        Py_XDECREF(v);                                                                             \
        Py_DECREF(d);                                                                              \
        return NULL;                                                                               \
    }                                                                                              \
    Py_DECREF(v);
    PUT("io_uring", PyBool_FromLong(kd_vecio_have_uring()));
    PUT("avx2", PyBool_FromLong(kd_cpu_has_avx2()));
    PUT("avx512", PyBool_FromLong(kd_cpu_has_avx512()));
    PUT("simd", PyUnicode_FromString(kd_kernels()->name));
    PUT("estimate", PyUnicode_FromString(
                        kd_estimator_variant(kd_quant_padded_dim(1, 0, 384, KD_FORMAT_VERSION))));
    PUT("refine", PyUnicode_FromString(kd_refiner_variant()));
    PUT("format_version", PyLong_FromLong(KD_FORMAT_VERSION));
    PUT("min_format_version", PyLong_FromLong(KD_FORMAT_MIN_VERSION));
#undef PUT
    return d;
}

/* The panel kernels through the test hook: rows packed, sums returned. */
static PyObject *panel_kernel(const struct kd_kernels *k, const char *which, const float *q,
                              size_t qlen, const float *x, size_t xlen, size_t d)
{
    size_t nq = d ? qlen / (4 * d) : 0;
    int norms = strcmp(which, "panel_norms") == 0;
    if (!norms && strcmp(which, "panel_dot") != 0) {
        PyErr_SetString(PyExc_ValueError, "unknown kernel");
        return NULL;
    }
    if (!d || xlen != 4 * KD_PANEL_ROWS * d ||
        (!norms && (qlen != 4 * nq * d || nq < 1 || nq > KD_PANEL_QUERIES))) {
        PyErr_Format(PyExc_ValueError, "a panel takes %d rows and 1 to %d queries of their length",
                     KD_PANEL_ROWS, KD_PANEL_QUERIES);
        return NULL;
    }
    const float *rows[KD_PANEL_ROWS];
    float *panel = malloc(4 * KD_PANEL_ROWS * d), sums[KD_PANEL_QUERIES * KD_PANEL_ROWS];
    if (!panel)
        return PyErr_NoMemory();
    for (size_t i = 0; i < KD_PANEL_ROWS; i++)
        rows[i] = x + i * d;
    k->panel_pack(rows, KD_PANEL_ROWS, d, panel);
    size_t count = norms ? KD_PANEL_ROWS : nq * KD_PANEL_ROWS;
    if (norms)
        k->panel_norms(panel, d, sums);
    else
        k->panel_dot(q, d, nq, panel, d, sums);
    free(panel);
    PyObject *r = PyTuple_New((Py_ssize_t)count);
    for (size_t i = 0; r && i < count; i++)
        PyTuple_SET_ITEM(r, (Py_ssize_t)i, PyFloat_FromDouble(sums[i]));
    return r;
}

/* Test hook: one kernel variant by name, to check it against the scalar
 * reference. For the block kernels, a holds four queries of len(b) floats;
 * dot4 returns the four products and |b|^2, l2sq4 the four distances; fwht
 * returns the transform of a (b is ignored) as bytes. The panel kernels take
 * KD_PANEL_ROWS rows in b, packed here, and up to KD_PANEL_QUERIES queries of
 * the same length in a: panel_dot returns the inner products query by query
 * (KD_PANEL_ROWS each), panel_norms the rows' |x|^2 (a is ignored). */
static PyObject *mod_kernel(PyObject *mod, PyObject *args)
{
    const char *name, *which;
    Py_buffer a, b;
    if (!PyArg_ParseTuple(args, "ssy*y*", &name, &which, &a, &b))
        return NULL;
    const struct kd_kernels *k = kd_kernels_named(name);
    int block = strcmp(which, "dot4") == 0 || strcmp(which, "l2sq4") == 0;
    int panel = strncmp(which, "panel_", 6) == 0;
    size_t d = (size_t)b.len / (panel ? 4 * KD_PANEL_ROWS : 4);
    size_t n = (size_t)a.len / 4;
    PyObject *r = NULL;
    if (!k) {
        PyErr_Format(PyExc_ValueError, "kernel set %s is unavailable", name);
    } else if (strcmp(which, "fwht") == 0) {
        if (a.len % 4 || !n || (n & (n - 1))) {
            PyErr_SetString(PyExc_ValueError, "fwht needs a power of two floats");
        } else if ((r = PyBytes_FromStringAndSize(a.buf, a.len))) {
            k->fwht((float *)PyBytes_AS_STRING(r), n);
        }
    } else if (panel) {
        r = panel_kernel(k, which, a.buf, (size_t)a.len, b.buf, (size_t)b.len, d);
    } else if (b.len % 4 || a.len != (block ? 4 : 1) * b.len) {
        PyErr_SetString(PyExc_ValueError, "operands differ in length");
    } else if (block) {
        const float *q[4];
        float out[4], xx = 0;
        for (int j = 0; j < 4; j++)
            q[j] = (const float *)a.buf + j * d;
        if (which[0] == 'd')
            k->dot4(q, b.buf, d, out, &xx);
        else
            k->l2sq4(q, b.buf, d, out);
        r = Py_BuildValue("(ddddd)", out[0], out[1], out[2], out[3], xx);
    } else if (strcmp(which, "l2sq") == 0) {
        r = PyFloat_FromDouble(k->l2sq(a.buf, b.buf, d));
    } else if (strcmp(which, "dot") == 0) {
        r = PyFloat_FromDouble(k->dot(a.buf, b.buf, d));
    } else {
        PyErr_SetString(PyExc_ValueError, "unknown kernel");
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return r;
}

static PyObject *mod_quantizer_centres(PyObject *mod, PyObject *args)
{
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "K", &n))
        return NULL;
    return PyLong_FromUnsignedLong(kd_quant_centres_for((size_t)n));
}

/* in_half(ids, salt) -> bool array: which of the int64 ids kd_in_half puts
 * in salt's half (the calibration's random half, read by id). */
static PyObject *mod_in_half(PyObject *mod, PyObject *args)
{
    PyObject *ids_obj, *salt_obj;
    if (!PyArg_ParseTuple(args, "OO!", &ids_obj, &PyLong_Type, &salt_obj))
        return NULL;
    /* Checked, as recall_sweep's salt: "K" would take -1 as 2^64 - 1. */
    unsigned long long salt = PyLong_AsUnsignedLongLong(salt_obj);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer v = {0};
    const int64_t *ids = NULL;
    size_t n = 0;
    if (kd_take_ids(ids_obj, &v, &ids, &n))
        return NULL;
    npy_intp dims = (npy_intp)n;
    PyObject *out = PyArray_SimpleNew(1, &dims, NPY_BOOL);
    if (out) {
        npy_bool *in = PyArray_DATA((PyArrayObject *)out);
        Py_BEGIN_ALLOW_THREADS for (size_t i = 0; i < n; i++)
            in[i] = (npy_bool)kd_in_half(ids[i], (uint64_t)salt);
        Py_END_ALLOW_THREADS
    }
    kd_release_buffer(&v);
    return out;
}

static PyObject *mod_build_code_row_bytes(PyObject *mod, PyObject *args)
{
    unsigned int dim;
    if (!PyArg_ParseTuple(args, "I", &dim))
        return NULL;
    return PyLong_FromUnsignedLongLong(kd_bcode_row_bytes(dim));
}

/* Test hook: _build_code_dists(x bytes, n, dim, l2, tier) -> (bytes of n x n
 * float32 distances, step), for buildcode.h's loops against each other and
 * against exact distances. */
static PyObject *mod_build_code_dists(PyObject *mod, PyObject *args)
{
    Py_buffer x;
    unsigned int n, dim;
    int l2, tier;
    if (!PyArg_ParseTuple(args, "y*IIpi", &x, &n, &dim, &l2, &tier))
        return NULL;
    PyObject *r = NULL, *out = NULL;
    float step = 0;
    if (!n || !dim || (size_t)x.len != (size_t)n * dim * sizeof(float) || n > 4096) {
        PyErr_SetString(PyExc_ValueError, "x must hold n x dim float32 values, 1 <= n <= 4096");
    } else if ((out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n * n * sizeof(float)))) {
        int err = kd_bcode_pairwise(x.buf, n, dim, l2, tier, (float *)PyBytes_AS_STRING(out),
                                    &step);
        r = err ? kd_raise(err) : Py_BuildValue("(Od)", out, (double)step);
        Py_DECREF(out);
    }
    PyBuffer_Release(&x);
    return r;
}

/* Squared l2 distances among float32 rows, by the core's kernel: an oracle
 * for the hook below (integer coordinates keep them exact in any order). */
struct float_rows {
    const float *x;
    uint32_t dim;
};

static void float_rows_from(void *ctx, uint32_t a, const uint32_t *rows, size_t n, float *out)
{
    const struct float_rows *f = ctx;
    for (size_t i = 0; i < n; i++)
        out[i] = kd_kernels()->l2sq(f->x + (size_t)a * f->dim, f->x + (size_t)rows[i] * f->dim,
                                    f->dim);
}

/* Test hook: _select_diverse(x, dim, node, candidates, cap) -> bytes of
 * uint32 rows: insertion's diversity rule (kd_graph_select) over the
 * candidates, nearest to node first, by squared l2 among x's rows. */
static PyObject *mod_select_diverse(PyObject *mod, PyObject *args)
{
    Py_buffer x, cand;
    unsigned int dim, node, cap;
    if (!PyArg_ParseTuple(args, "y*IIy*I", &x, &dim, &node, &cand, &cap))
        return NULL;
    PyObject *r = NULL;
    size_t rows = dim ? (size_t)x.len / sizeof(float) / dim : 0, n = (size_t)cand.len / 4;
    struct kd_heap_item *c = malloc((n ? n : 1) * sizeof *c);
    uint32_t *out = malloc((cap ? cap : 1) * sizeof *out);
    const uint32_t *ids = cand.buf;
    int ok = rows && node < rows && (size_t)x.len == rows * dim * sizeof(float);
    for (size_t i = 0; ok && i < n; i++)
        ok = ids[i] < rows;
    if (!c || !out) {
        PyErr_NoMemory();
    } else if (!ok) {
        PyErr_SetString(PyExc_ValueError, "x must be rows x dim float32, the rows in range");
    } else {
        struct float_rows f = {x.buf, dim};
        struct kd_build_oracle o = {float_rows_from, &f, NULL, NULL};
        for (size_t i = 0; i < n; i++) {
            c[i].row = ids[i];
            float_rows_from(&f, node, &ids[i], 1, &c[i].dist);
        }
        size_t kept = kd_graph_select(&o, c, n, cap, out);
        r = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)(kept * sizeof *out));
    }
    free(c);
    free(out);
    PyBuffer_Release(&x);
    PyBuffer_Release(&cand);
    return r;
}

/* Test hook: _set_cache_bytes(n) has the core take the last-level cache to
 * hold n bytes (0: ask the system), which decides insertion's beam codes. */
static PyObject *mod_set_cache_bytes(PyObject *mod, PyObject *args)
{
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "K", &n))
        return NULL;
    kd_set_llc_bytes(n);
    Py_RETURN_NONE;
}

/* Test hook: _set_beam_rule(r): insertion's beam reads the 1-bit search
 * codes (1), the build codes (-1), or what the core decides (0). */
static PyObject *mod_set_beam_rule(PyObject *mod, PyObject *args)
{
    int rule;
    if (!PyArg_ParseTuple(args, "i", &rule))
        return NULL;
    if (rule < -1 || rule > 1) {
        PyErr_SetString(PyExc_ValueError, "beam rule must be -1, 0 or 1");
        return NULL;
    }
    kd_set_beam_rule(rule);
    Py_RETURN_NONE;
}

static PyObject *mod_read_probe(PyObject *mod, PyObject *args)
{
    Py_buffer b;
    unsigned int threads = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &threads))
        return NULL;
    double secs;
    Py_BEGIN_ALLOW_THREADS secs = kd_exact_read_probe(b.buf, (size_t)b.len / 4,
                                                      threads ? threads : kd_cpu_count());
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    return PyFloat_FromDouble(secs);
}

/* Test hook: arm a fault in the I/O layer (see common.h). kind is one of
 * "none", "eio", "short", "eof" (vector reads), "enospc", "write_eio",
 * "slow_write" (writes of a save); after matching operations pass, then
 * count fail (count < 0: all). Returns (faults injected, matching operations seen) under the
 * previous arming. */
static PyObject *mod_inject_fault(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"kind", "after", "count", NULL};
    static const char *kinds[] = {"none",   "eio",       "short",     "eof",
                                  "enospc", "write_eio", "slow_write"};
    const char *kind;
    unsigned long long after = 0;
    long long count = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|KL", names, &kind, &after, &count))
        return NULL;
    int k = -1;
    for (int i = 0; i < (int)(sizeof kinds / sizeof *kinds); i++)
        if (strcmp(kind, kinds[i]) == 0)
            k = i;
    if (k < 0)
        return PyErr_Format(PyExc_ValueError, "unknown fault kind %s", kind);
    uint64_t fired = kd_fault_fired(), seen = kd_fault_seen();
    kd_fault_arm(k, after, count);
    return Py_BuildValue("(KK)", (unsigned long long)fired, (unsigned long long)seen);
}

static PyMethodDef mod_methods[] = {
    {"load_bytes", kd_mod_load_bytes, METH_O, "Load an index held in a bytes-like object."},
    {"load_path", kd_mod_load_path, METH_O, "Load an index file into memory."},
    {"load_file", kd_mod_load_file, METH_VARARGS,
     "load_file(file, size=-1): load from a binary file-like object."},
    {"open", (PyCFunction)(void (*)(void))mod_open, METH_VARARGS | METH_KEYWORDS,
     "open(path, direct_io=True, io_backend=0, io_depth=128, preload=0)"},
    {"search_many", (PyCFunction)(void (*)(void))kd_mod_search_many, METH_VARARGS | METH_KEYWORDS,
     "search_many(indexes, queries, k, ef=0, oversample=0, rerank=True, exact=False, threads=0, "
     "filter=None): one search over several indexes (segments)."},
    {"merge", (PyCFunction)(void (*)(void))kd_mod_merge, METH_VARARGS | METH_KEYWORDS,
     "merge(path, indexes, threads=0, memory_budget=0, seed=0, progress=None) -> dict: write "
     "the live vectors of several indexes as one index file. progress(done, total) returning "
     "False cancels (RuntimeError, no file); it runs with the indexes locked and must not "
     "modify, search or close them."},
    {"in_half", mod_in_half, METH_VARARGS,
     "in_half(ids, salt) -> bool array: the ids in salt's half of any id set."},
    {"quantizer_centres", mod_quantizer_centres, METH_VARARGS,
     "quantizer_centres(n): the centres a 1-bit quantizer fitted on n vectors gets."},
    {"build_code_row_bytes", mod_build_code_row_bytes, METH_VARARGS,
     "build_code_row_bytes(dim): RAM a row's build code takes while an index grows."},
    {"merge_row_bytes", kd_mod_merge_row_bytes, METH_VARARGS,
     "merge_row_bytes(bits, dim): memory_budget bytes a merged row's build code takes."},
    {"_merge_kernel_gap", kd_mod_merge_kernel_gap, METH_VARARGS,
     "_merge_kernel_gap(bits, dim, metric, seed=0): error of merge's distance loops (tests)."},
    {"features", mod_features, METH_NOARGS, "What this build and CPU offer."},
    {"_build_code_dists", mod_build_code_dists, METH_VARARGS,
     "_build_code_dists(x, n, dim, l2, tier): build-code distances at a SIMD tier (tests)."},
    {"_select_diverse", mod_select_diverse, METH_VARARGS,
     "_select_diverse(x, dim, node, candidates, cap): the neighbour-choice rule (tests)."},
    {"_set_cache_bytes", mod_set_cache_bytes, METH_VARARGS,
     "_set_cache_bytes(n): the last-level cache size the build assumes, 0 to detect (tests)."},
    {"_set_beam_rule", mod_set_beam_rule, METH_VARARGS,
     "_set_beam_rule(r): insertion's beam over 1-bit codes (1), build codes (-1), or the "
     "core's choice (0) (tests, benchmarks)."},
    {"_kernel", mod_kernel, METH_VARARGS, "Run one distance kernel variant (tests)."},
    {"_read_probe", mod_read_probe, METH_VARARGS, "Seconds to stream a float32 buffer."},
    {"_inject_fault", (PyCFunction)(void (*)(void))mod_inject_fault, METH_VARARGS | METH_KEYWORDS,
     "_inject_fault(kind, after=0, count=1): arm a test fault in the I/O layer."},
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
    PyObject *metrics = kd_metrics_table();
    if (!metrics || PyModule_AddObject(m, "METRICS", metrics) < 0) {
        Py_XDECREF(metrics);
        Py_DECREF(m);
        return NULL;
    }
    /* Named for where users meet it (knndirect re-exports it), so that its
     * instances pickle by reference to knndirect.CorruptIndexError. */
    if (!CorruptIndexError)
        CorruptIndexError = PyErr_NewExceptionWithDoc("knndirect.CorruptIndexError", corrupt_doc,
                                                      PyExc_ValueError, NULL);
    if (!CorruptIndexError) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(CorruptIndexError);
    if (PyModule_AddObject(m, "CorruptIndexError", CorruptIndexError) < 0) {
        Py_DECREF(CorruptIndexError);
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
    PyModule_AddIntConstant(m, "SEC_REFINE", KD_SEC_REFINE);
    PyModule_AddIntConstant(m, "SEC_GRAPH_LEVELS", KD_SEC_LEVELS);
    PyModule_AddIntConstant(m, "SEC_GRAPH_LEVEL0", KD_SEC_LEVEL0);
    PyModule_AddIntConstant(m, "SEC_GRAPH_UPPER", KD_SEC_UPPER);
    PyModule_AddIntConstant(m, "SEC_VECTORS", KD_SEC_VECTORS);
    PyModule_AddIntConstant(m, "SEC_DELETED", KD_SEC_DELETED);
    PyModule_AddIntConstant(m, "SEC_META", KD_SEC_META);
    return m;
}

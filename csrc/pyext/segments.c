/* knndirect._core.search_many (to be written). */
#include "pyext.h"

PyObject *kd_mod_search_many(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    (void)args;
    (void)kw;
    PyErr_SetString(PyExc_NotImplementedError, "search_many");
    return NULL;
}

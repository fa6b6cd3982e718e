/* knndirect._core.merge (to be written). */
#include "pyext.h"

PyObject *kd_mod_merge(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    (void)args;
    (void)kw;
    PyErr_SetString(PyExc_NotImplementedError, "merge");
    return NULL;
}

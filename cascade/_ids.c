/* The block-id check of cascade.identity, compiled: every put checks its id, and the
 * Python check (str.strip over the hex digits) took about a tenth of a hot 4 KiB put.
 *
 * check_id(block_id) returns block_id itself when it is a str of ID_HEX_CHARS characters,
 * each one of 0-9 and a-f; otherwise it raises cascade.errors.InvalidBlock with the same
 * message as the Python version in identity.py (which runs where this was not built).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define ID_HEX_CHARS 32

static PyObject *
refuse(PyObject *block_id)
{
    PyObject *errors = PyImport_ImportModule("cascade.errors");
    if (errors == NULL)
        return NULL;
    PyObject *invalid = PyObject_GetAttrString(errors, "InvalidBlock");
    Py_DECREF(errors);
    if (invalid == NULL)
        return NULL;
    PyErr_Format(invalid, "malformed block id %R: expected %d lowercase hex characters", block_id, ID_HEX_CHARS);
    Py_DECREF(invalid);
    return NULL;
}

static PyObject *
check_id(PyObject *module, PyObject *block_id)
{
    (void)module;
    if (!PyUnicode_Check(block_id) || PyUnicode_GET_LENGTH(block_id) != ID_HEX_CHARS || !PyUnicode_IS_ASCII(block_id))
        return refuse(block_id);
    const Py_UCS1 *c = PyUnicode_1BYTE_DATA(block_id);
    for (int i = 0; i < ID_HEX_CHARS; i++) {
        if (!((c[i] >= '0' && c[i] <= '9') || (c[i] >= 'a' && c[i] <= 'f')))
            return refuse(block_id);
    }
    Py_INCREF(block_id);
    return block_id;
}

static PyMethodDef methods[] = {
    {"check_id", check_id, METH_O,
     "check_id(block_id) -> block_id if it is 32 lowercase hex characters, else InvalidBlock."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_ids", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__ids(void)
{
    return PyModule_Create(&module);
}

/* The embedded server's DataRow encoding (executor.data_rows) in C.
 *
 * encode_rows(rows, kinds, encoders) -> list of DataRow messages, one bytes object per row.
 * rows: a list of tuples (what DuckDB's fetchmany gives); kinds: per column, 1 for an integer
 * column in text format, 2 for a string column in text format, 0 for anything else;
 * encoders: per column, the Python function that encodes one value of it (value -> bytes).
 * Integers and strings of the right Python type are written here; every other value, and
 * every value of a kind-0 column, is given to its column's encoder. None is SQL NULL.
 *
 * Same bytes as the Python loop in executor.data_rows, which stays the reference and the
 * fallback when this module is not built: a property test compares the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Buffer;

static int
reserve(Buffer *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 256;
    while (capacity < b->size + more)
        capacity *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static void
put32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

/* one value, length-prefixed */
static int
put_value(Buffer *b, const char *data, Py_ssize_t size)
{
    if (size > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a value of more than 2 GB");
        return -1;
    }
    if (reserve(b, 4 + size) < 0)
        return -1;
    put32(b->data + b->size, (uint32_t)size);
    memcpy(b->data + b->size + 4, data, (size_t)size);
    b->size += 4 + size;
    return 0;
}

/* the value through its column's Python encoder, which must give bytes */
static int
put_encoded(Buffer *b, PyObject *encoder, PyObject *value)
{
    PyObject *encoded = PyObject_CallOneArg(encoder, value);
    if (encoded == NULL)
        return -1;
    if (!PyBytes_Check(encoded)) {
        PyErr_Format(PyExc_TypeError, "an encoder gave %.50s, not bytes",
                     Py_TYPE(encoded)->tp_name);
        Py_DECREF(encoded);
        return -1;
    }
    int result = put_value(b, PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded));
    Py_DECREF(encoded);
    return result;
}

static PyObject *
encode_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_rows(list, tuple, tuple)");
        return NULL;
    }
    PyObject *rows = args[0], *kinds_in = args[1], *encoders = args[2];
    Py_ssize_t columns = PyTuple_GET_SIZE(kinds_in);
    if (PyTuple_GET_SIZE(encoders) != columns || columns > 0x7fff) {
        PyErr_SetString(PyExc_ValueError, "one kind and one encoder per column, at most 32767");
        return NULL;
    }
    int *kinds = PyMem_Malloc(sizeof(int) * (size_t)(columns ? columns : 1));
    if (kinds == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < columns; i++) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds_in, i));
        if (kind == -1 && PyErr_Occurred()) {
            PyMem_Free(kinds);
            return NULL;
        }
        kinds[i] = (int)kind;
    }
    Py_ssize_t count = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        PyMem_Free(kinds);
        return NULL;
    }
    Buffer b = {NULL, 0, 0};
    char digits[32];
    for (Py_ssize_t r = 0; r < count; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != columns) {
            PyErr_SetString(PyExc_ValueError, "a row is not a tuple of one value per column");
            goto fail;
        }
        b.size = 0;
        if (reserve(&b, 7) < 0)
            goto fail;
        b.data[0] = 'D';
        b.data[5] = (char)(columns >> 8);
        b.data[6] = (char)columns;
        b.size = 7;
        for (Py_ssize_t c = 0; c < columns; c++) {
            PyObject *value = PyTuple_GET_ITEM(row, c);
            int done = -1;
            if (value == Py_None) {
                if (reserve(&b, 4) < 0)
                    goto fail;
                put32(b.data + b.size, 0xffffffffu);
                b.size += 4;
                continue;
            }
            if (kinds[c] == 1 && PyLong_CheckExact(value)) {
                int overflow;
                long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
                if (v == -1 && PyErr_Occurred())
                    goto fail;
                if (!overflow) {
                    int n = snprintf(digits, sizeof digits, "%lld", v);
                    done = put_value(&b, digits, n);
                }
            }
            else if (kinds[c] == 2 && PyUnicode_CheckExact(value)) {
                Py_ssize_t size;
                const char *utf8 = PyUnicode_AsUTF8AndSize(value, &size);
                if (utf8 == NULL)
                    goto fail;
                done = put_value(&b, utf8, size);
                if (done < 0)
                    goto fail;
                continue;
            }
            if (done == -1) {
                if (PyErr_Occurred())
                    goto fail;
                if (put_encoded(&b, PyTuple_GET_ITEM(encoders, c), value) < 0)
                    goto fail;
            }
        }
        put32(b.data + 1, (uint32_t)(b.size - 1));
        PyObject *message = PyBytes_FromStringAndSize(b.data, b.size);
        if (message == NULL)
            goto fail;
        PyList_SET_ITEM(out, r, message);
    }
    PyMem_Free(b.data);
    PyMem_Free(kinds);
    return out;
fail:
    PyMem_Free(b.data);
    PyMem_Free(kinds);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_rows", (PyCFunction)(void (*)(void))encode_rows, METH_FASTCALL,
     "encode_rows(rows, kinds, encoders): DataRow messages (see the module's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "proxy.backends.embedded._rows",
    "The embedded server's DataRow encoding in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module_def);
}

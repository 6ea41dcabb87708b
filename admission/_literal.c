/* admission.classify.literal_key in C: the cache key of a text sent with its numbers inline;
 * and classify_sql's cache hits, so that a statement whose class is known costs no Python call.
 *
 * Same result as the Python function in classify.py, which stays the reference and the
 * fallback when this module is not built; a property test holds the two to the same keys.
 * The Python version spends most of the classifier's time per simple-protocol statement in
 * two regular expressions; this is one pass over the text.
 *
 * The key is the text with every numeric literal replaced by "0", when that is safe: one
 * data-manipulation statement (it starts, after whitespace, with one of the DML keywords),
 * no quoted identifier, no class hint. A numeric literal is read as PostgreSQL's lexer reads
 * one: ASCII digits, with a dot or a dot and digits, and an exponent, not glued to a name, a
 * parameter or another number (ASCII letters and digits, _, $, a dot, any non-ASCII
 * character) — so "t1", "$1", "€1" and "٣" are left alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *HINT; /* "admission:class" */

/* classify.py's caches, handed over by setup(): recent texts → class, literal key → (class,
 * texts that agreed), how many must agree, and the Python function for everything else. */
static PyObject *TEXTS, *BY_KEY, *MISSED;
static Py_ssize_t CHECKS;

static const char *const DML[] = {"select", "with", "insert", "update", "delete", "values", "table"};

static inline int
is_space(Py_UCS4 c) /* the lexer's whitespace */
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static inline int
is_digit(Py_UCS4 c)
{
    return c >= '0' && c <= '9';
}

static inline int
continues_name(Py_UCS4 c)
{
    return c >= 0x80 || is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '_' || c == '$';
}

static int
starts_with_dml(int kind, const void *data, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && is_space(PyUnicode_READ(kind, data, i)))
        i++;
    for (size_t w = 0; w < sizeof(DML) / sizeof(DML[0]); w++) {
        const char *word = DML[w];
        Py_ssize_t len = (Py_ssize_t)strlen(word), k = 0;
        if (n - i < len)
            continue;
        for (; k < len; k++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i + k);
            if (c >= 'A' && c <= 'Z')
                c += 'a' - 'A';
            if (c != (Py_UCS4)word[k])
                break;
        }
        if (k == len && (i + len == n || !continues_name(PyUnicode_READ(kind, data, i + len))))
            return 1;
    }
    return 0;
}

static PyObject *
literal_key(PyObject *module, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "literal_key() needs a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t at = PyUnicode_FindChar(text, '"', 0, n, 1);
    if (at == -2)
        return NULL;
    if (at >= 0)
        Py_RETURN_NONE; /* a number inside a quoted name is part of the name */
    int hinted = PyUnicode_Contains(text, HINT);
    if (hinted < 0)
        return NULL;
    if (hinted || !starts_with_dml(kind, data, n))
        Py_RETURN_NONE;
    at = PyUnicode_FindChar(text, ';', 0, n, 1);
    if (at == -2)
        return NULL;
    if (at >= 0) {
        for (Py_ssize_t i = at + 1; i < n; i++)
            if (!is_space(PyUnicode_READ(kind, data, i)))
                Py_RETURN_NONE; /* several statements */
    }

    Py_UCS4 small[512];
    Py_UCS4 *out = n <= 512 ? small : PyMem_New(Py_UCS4, n);
    if (out == NULL)
        return PyErr_NoMemory();
    Py_ssize_t len = 0, i = 0;
    while (i < n) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        Py_ssize_t j = i;
        if ((is_digit(c) || c == '.') &&
            (i == 0 || !(continues_name(PyUnicode_READ(kind, data, i - 1)) ||
                         PyUnicode_READ(kind, data, i - 1) == '.'))) {
            if (is_digit(c)) { /* digits [. [digits]] */
                while (j < n && is_digit(PyUnicode_READ(kind, data, j)))
                    j++;
                if (j < n && PyUnicode_READ(kind, data, j) == '.')
                    j++;
                while (j < n && is_digit(PyUnicode_READ(kind, data, j)))
                    j++;
            }
            else if (i + 1 < n && is_digit(PyUnicode_READ(kind, data, i + 1))) { /* .digits */
                j = i + 1;
                while (j < n && is_digit(PyUnicode_READ(kind, data, j)))
                    j++;
            }
        }
        if (j == i) { /* no number starts here */
            out[len++] = c;
            i++;
            continue;
        }
        if (j < n && (PyUnicode_READ(kind, data, j) | 0x20) == 'e') { /* an exponent? */
            Py_ssize_t k = j + 1;
            if (k < n && (PyUnicode_READ(kind, data, k) == '+' ||
                          PyUnicode_READ(kind, data, k) == '-'))
                k++;
            if (k < n && is_digit(PyUnicode_READ(kind, data, k))) {
                while (k < n && is_digit(PyUnicode_READ(kind, data, k)))
                    k++;
                j = k;
            }
        }
        out[len++] = '0';
        i = j;
    }
    PyObject *key = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, len);
    if (out != small)
        PyMem_Free(out);
    return key;
}

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *texts, *by_key, *missed;
    Py_ssize_t checks;
    if (!PyArg_ParseTuple(args, "O!O!nO:setup", &PyDict_Type, &texts, &PyDict_Type, &by_key,
                          &checks, &missed))
        return NULL;
    if (!PyCallable_Check(missed)) {
        PyErr_SetString(PyExc_TypeError, "setup: the fallback must be callable");
        return NULL;
    }
    Py_XSETREF(TEXTS, Py_NewRef(texts));
    Py_XSETREF(BY_KEY, Py_NewRef(by_key));
    Py_XSETREF(MISSED, Py_NewRef(missed));
    CHECKS = checks;
    Py_RETURN_NONE;
}

/* classify.classify_sql: the class of a recent text, or of a text whose literal key enough
 * texts agreed on; anything else goes to the Python fallback (missed(text, key)). */
static PyObject *
classify_sql(PyObject *self, PyObject *text)
{
    if (TEXTS == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "classify_sql: setup() was not called");
        return NULL;
    }
    PyObject *found = PyDict_GetItemWithError(TEXTS, text); /* borrowed */
    if (found != NULL)
        return Py_NewRef(found);
    if (PyErr_Occurred())
        return NULL;
    PyObject *key = literal_key(self, text);
    if (key == NULL)
        return NULL;
    if (key != Py_None) {
        PyObject *entry = PyDict_GetItemWithError(BY_KEY, key); /* borrowed */
        if (entry == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
        if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 &&
            PyTuple_GET_ITEM(entry, 0) != Py_None) {
            Py_ssize_t agreed = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 1));
            if (agreed == -1 && PyErr_Occurred()) {
                Py_DECREF(key);
                return NULL;
            }
            if (agreed >= CHECKS) {
                found = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
                Py_DECREF(key);
                return found;
            }
        }
    }
    found = PyObject_CallFunctionObjArgs(MISSED, text, key, NULL);
    Py_DECREF(key);
    return found;
}

static PyMethodDef methods[] = {
    {"literal_key", literal_key, METH_O, "admission.classify.literal_key(text), in C."},
    {"setup", setup, METH_VARARGS, "setup(texts, by_key, checks, missed): classify.py's caches."},
    {"classify_sql", classify_sql, METH_O,
     "admission.classify.classify_sql(text), in C for cache hits (see classify.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "admission._literal", "literal_key and classify_sql's cache hits in C (see classify.py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__literal(void)
{
    HINT = PyUnicode_InternFromString("admission:class");
    if (HINT == NULL)
        return NULL;
    return PyModule_Create(&module);
}

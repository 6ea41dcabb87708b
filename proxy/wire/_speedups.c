/* The session's fast path (ProxySession.fast_client and ProxySession.fast_server) in C.
 *
 * Same semantics as the Python methods in session.py, which stay the reference and the
 * fallback when this module is not built: a property test drives both (and the general path)
 * through the real connection and requires the same bytes and the same state. These functions
 * read and write the session's attributes exactly as the Python methods do; they only save
 * the interpreter's work of walking the messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *READY; /* State.READY */
static PyObject *EMPTY_BYTES;

/* The attribute names these functions use, interned by setup() from the session module's
 * FAST_PATH_FIELDS (the contract lives there, in Python), in this order. */
static PyObject *s_fast_job, *s_state, *s_jobs, *s_queue, *s_replies, *s_client,
    *s_discarding, *s_buffer, *s_fast_path, *s_max_message, *s_statements, *s_portals,
    *s_classify, *s_control, *s_transaction_status, *s_fast_data, *s_fast_sql, *s_fast_sent,
    *s_server_buf, *s_job_ids;
static PyObject **const FIELDS[] = {
    &s_fast_job, &s_state, &s_jobs, &s_queue, &s_replies, &s_client,
    &s_discarding, &s_buffer, &s_fast_path, &s_max_message, &s_statements, &s_portals,
    &s_classify, &s_control, &s_transaction_status, &s_fast_data, &s_fast_sql, &s_fast_sent,
    &s_server_buf, &s_job_ids,
};
#define N_FIELDS ((Py_ssize_t)(sizeof(FIELDS) / sizeof(FIELDS[0])))

static uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* 1 if the attribute is truthy, 0 if not, -1 on error */
static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* 1 if the attribute is the given object, 0 if not, -1 on error */
static int
attr_is(PyObject *obj, PyObject *name, PyObject *what)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    int same = value == what;
    Py_DECREF(value);
    return same;
}

/* mapping.get(key) as a new reference: None when the key is missing */
static PyObject *
get_or_none(PyObject *mapping, PyObject *key)
{
    if (PyDict_CheckExact(mapping)) {
        PyObject *value = PyDict_GetItemWithError(mapping, key);
        if (value != NULL)
            return Py_NewRef(value);
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    return PyObject_CallMethod(mapping, "get", "O", key);
}

/* session.<attr>.get(buf[start:end]) as a new reference: a statement's or a portal's SQL, None
 * for a name the session does not know (the general path decides what that runs) */
static PyObject *
sql_named(PyObject *session, PyObject *attr, const char *buf, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *mapping = PyObject_GetAttr(session, attr);
    if (mapping == NULL)
        return NULL;
    PyObject *name = PyBytes_FromStringAndSize(buf + start, end - start);
    PyObject *value = name == NULL ? NULL : get_or_none(mapping, name);
    Py_XDECREF(name);
    Py_DECREF(mapping);
    return value;
}

static Py_ssize_t
find_nul(const char *buf, Py_ssize_t start, Py_ssize_t end)
{
    if (start >= end)
        return -1;
    const char *hit = memchr(buf + start, 0, (size_t)(end - start));
    return hit == NULL ? -1 : hit - buf;
}

/* Parse (statement name, SQL) or Bind (portal name, statement name) in buf[start:end]:
 * note the name it sets. 1 done, 0 not for the fast path (a field is not NUL-terminated, or
 * a Bind names a statement the session does not know), -1 error. */
static int
track(PyObject *session, char kind, const char *buf, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t first = find_nul(buf, start, end);
    Py_ssize_t second = first >= 0 ? find_nul(buf, first + 1, end) : -1;
    if (second < 0)
        return 0;
    PyObject *names = PyObject_GetAttr(session, kind == 'P' ? s_statements : s_portals);
    if (names == NULL)
        return -1;
    PyObject *name = PyBytes_FromStringAndSize(buf + start, first - start);
    PyObject *value = NULL;
    int rc = -1;
    if (name == NULL)
        goto done;
    value = kind == 'P' ? PyUnicode_DecodeUTF8(buf + first + 1, second - first - 1, "replace")
                        : sql_named(session, s_statements, buf, first + 1, second);
    if (value == NULL)
        goto done;
    if (value == Py_None) { /* a statement with no Parse seen: the general path */
        rc = 0;
        goto done;
    }
    rc = PyObject_SetItem(names, name, value) < 0 ? -1 : 1;
done:
    Py_XDECREF(value);
    Py_XDECREF(name);
    Py_DECREF(names);
    return rc;
}

static PyObject *
fast_client(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fast_client(session, data)");
        return NULL;
    }
    PyObject *session = args[0], *data = args[1];
    int r;
    if ((r = attr_is(session, s_fast_job, Py_None)) != 1)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if ((r = attr_is(session, s_state, READY)) != 1)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if ((r = attr_true(session, s_jobs)) != 0 || (r = attr_true(session, s_queue)) != 0 ||
        (r = attr_true(session, s_replies)) != 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *client = PyObject_GetAttr(session, s_client); /* its FrontendCore */
    if (client == NULL)
        return NULL;
    if ((r = attr_true(client, s_discarding)) == 0)
        r = attr_true(client, s_buffer);
    Py_DECREF(client);
    if (r != 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if ((r = attr_true(session, s_fast_path)) != 1)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if (!PyBytes_CheckExact(data))
        Py_RETURN_NONE;
    PyObject *limit = PyObject_GetAttr(session, s_max_message);
    if (limit == NULL)
        return NULL;
    long long max_message = PyLong_AsLongLong(limit);
    Py_DECREF(limit);
    if (max_message == -1 && PyErr_Occurred())
        return NULL;

    const char *buf = PyBytes_AS_STRING(data);
    const unsigned char *ubuf = (const unsigned char *)buf;
    Py_ssize_t end = PyBytes_GET_SIZE(data), pos = 0;
    Py_ssize_t parse_at = -1, bind_at = -1, execute_at = -1;
    Py_ssize_t parse_end = 0, bind_end = 0, execute_end = 0;
    unsigned char kind;
    for (;;) {
        if (end - pos < 5)
            Py_RETURN_NONE;
        kind = ubuf[pos];
        long long length = be32(ubuf + pos + 1);
        Py_ssize_t nxt = pos + 1 + (Py_ssize_t)length;
        if (length < 4 || nxt > end || length > max_message)
            Py_RETURN_NONE;
        if (kind == 'S' || kind == 'Q') {
            if (nxt != end || (kind == 'Q' && pos != 0))
                Py_RETURN_NONE;
            break;
        }
        if (kind == 'E') {
            if (execute_at < 0) {
                execute_at = pos;
                execute_end = nxt;
            }
        }
        else if (kind == 'B') {
            if (bind_at >= 0 || execute_at >= 0)
                Py_RETURN_NONE;
            bind_at = pos;
            bind_end = nxt;
        }
        else if (kind == 'P') {
            if (parse_at >= 0 || bind_at >= 0 || execute_at >= 0)
                Py_RETURN_NONE;
            parse_at = pos;
            parse_end = nxt;
        }
        else if (kind != 'D') {
            Py_RETURN_NONE;
        }
        pos = nxt;
    }

    PyObject *sql;
    if (kind == 'Q') {
        if (buf[end - 1] != 0)
            Py_RETURN_NONE;
        sql = PyUnicode_DecodeUTF8(buf + 5, end - 6, "replace");
        if (sql == NULL)
            return NULL;
    }
    else if (execute_at < 0) {
        Py_RETURN_NONE;
    }
    else {
        if (parse_at >= 0 && (r = track(session, 'P', buf, parse_at + 5, parse_end)) != 1)
            return r < 0 ? NULL : Py_NewRef(Py_None);
        if (bind_at >= 0 && (r = track(session, 'B', buf, bind_at + 5, bind_end)) != 1)
            return r < 0 ? NULL : Py_NewRef(Py_None);
        Py_ssize_t stop = find_nul(buf, execute_at + 5, execute_end);
        if (stop < 0)
            Py_RETURN_NONE;
        sql = sql_named(session, s_portals, buf, execute_at + 5, stop);
        if (sql == NULL)
            return NULL;
        if (sql == Py_None) /* a portal with no Bind seen: the general path */
            return sql;
    }

    PyObject *classify = NULL, *query_class = NULL, *job = NULL, *status = NULL;
    PyObject *job_ids = NULL, *result = NULL;
    int bypass;
    classify = PyObject_GetAttr(session, s_classify);
    if (classify == NULL)
        goto done;
    query_class = PyObject_CallOneArg(classify, sql);
    if (query_class == NULL)
        goto done;
    job_ids = PyObject_GetAttr(session, s_job_ids);
    if (job_ids == NULL)
        goto done;
    job = PyIter_Next(job_ids);
    if (job == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "job ids ran out");
        goto done;
    }
    if (PyObject_SetAttr(session, s_fast_job, job) < 0 ||
        PyObject_SetAttr(session, s_fast_data, data) < 0 ||
        PyObject_SetAttr(session, s_fast_sql, sql) < 0 ||
        PyObject_SetAttr(session, s_fast_sent, Py_False) < 0)
        goto done;
    bypass = attr_true(query_class, s_control);
    if (bypass < 0)
        goto done;
    if (!bypass) {
        status = PyObject_GetAttr(session, s_transaction_status);
        if (status == NULL)
            goto done;
        if (PyBytes_CheckExact(status))
            bypass = !(PyBytes_GET_SIZE(status) == 1 && PyBytes_AS_STRING(status)[0] == 'I');
        else
            bypass = 1; /* not b"I" */
    }
    result = PyTuple_Pack(4, job, query_class, bypass ? Py_True : Py_False, sql);
done:
    Py_XDECREF(status);
    Py_XDECREF(job);
    Py_XDECREF(job_ids);
    Py_XDECREF(query_class);
    Py_XDECREF(classify);
    Py_DECREF(sql);
    return result;
}

static PyObject *
fast_server(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fast_server(session, data)");
        return NULL;
    }
    PyObject *session = args[0], *data = args[1];
    PyObject *job = PyObject_GetAttr(session, s_fast_job);
    if (job == NULL)
        return NULL;
    int r = 0;
    if (job == Py_None || (r = attr_true(session, s_fast_sent)) != 1 ||
        (r = attr_true(session, s_server_buf)) != 0 || !PyBytes_CheckExact(data)) {
        int failed = job != Py_None && r < 0;
        Py_DECREF(job);
        return failed ? NULL : Py_NewRef(Py_None);
    }
    const unsigned char *ubuf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data), pos = 0;
    while (end - pos >= 5) {
        unsigned char kind = ubuf[pos];
        long long length = be32(ubuf + pos + 1);
        Py_ssize_t nxt = pos + 1 + (Py_ssize_t)length;
        if (length < 4 || nxt > end || kind == 'K' || kind == 'E')
            break; /* an error: the general path notes whether it is FATAL */
        if (kind == 'Z') {
            if (nxt != end)
                break;
            Py_ssize_t size = end - (pos + 5) < 1 ? end - (pos + 5) : 1;
            PyObject *status =
                PyBytes_FromStringAndSize((const char *)ubuf + pos + 5, size);
            if (status == NULL || PyObject_SetAttr(session, s_transaction_status, status) < 0 ||
                PyObject_SetAttr(session, s_fast_job, Py_None) < 0 ||
                PyObject_SetAttr(session, s_fast_data, EMPTY_BYTES) < 0) {
                Py_XDECREF(status);
                Py_DECREF(job);
                return NULL;
            }
            Py_DECREF(status);
            return job;
        }
        pos = nxt;
    }
    Py_DECREF(job);
    if (pos == end)
        return PyLong_FromLong(0);
    Py_RETURN_NONE;
}

static PyObject *
setup(PyObject *module, PyObject *args)
{
    PyObject *ready, *names;
    if (!PyArg_ParseTuple(args, "OO!", &ready, &PyTuple_Type, &names))
        return NULL;
    if (PyTuple_GET_SIZE(names) != N_FIELDS) {
        PyErr_Format(PyExc_ValueError, "setup() needs %zd field names, not %zd", N_FIELDS,
                     PyTuple_GET_SIZE(names));
        return NULL;
    }
    for (Py_ssize_t i = 0; i < N_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name)) {
            PyErr_SetString(PyExc_TypeError, "setup() takes field names as str");
            return NULL;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        Py_XSETREF(*FIELDS[i], name);
    }
    Py_XSETREF(READY, Py_NewRef(ready));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fast_client", (PyCFunction)(void (*)(void))fast_client, METH_FASTCALL,
     "ProxySession.fast_client(session, data), in C."},
    {"fast_server", (PyCFunction)(void (*)(void))fast_server, METH_FASTCALL,
     "ProxySession.fast_server(session, data), in C."},
    {"setup", setup, METH_VARARGS,
     "setup(State.READY, FAST_PATH_FIELDS): the state and attribute names these use."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "proxy.wire._speedups", "The session's fast path in C.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if ((EMPTY_BYTES = PyBytes_FromStringAndSize(NULL, 0)) == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}

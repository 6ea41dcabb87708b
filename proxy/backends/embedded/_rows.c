/* The embedded server's DataRow encoding in C: row by row from Python tuples (encode_rows, the
 * row path) and column by column from DuckDB's Arrow batches (ArrowRows, further down).
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
#include <math.h>
#include <stdint.h>
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


/* -- The columnar path: DataRow messages straight from DuckDB's Arrow stream -------------
 *
 * ArrowRows(capsule, encoders) takes the "arrow_array_stream" capsule of a DuckDB relation
 * (the Arrow PyCapsule interface; no pyarrow needed) and gives its rows as DataRow messages
 * in PostgreSQL's text format, chunk by chunk: fetch(n) -> list of at most n messages, [] at
 * the end. Values are read from the Arrow buffers and written as text here, with no Python
 * object per value; a double outside [1e-4, 1e15) goes to its column's Python encoder. A
 * column of a type not written here makes the constructor raise Unsupported before anything
 * has run: the caller then takes the row path. DuckDB runs the statement inside get_next,
 * with the GIL released. Same bytes as executor.data_rows over fetchmany for every value the
 * row path represents (a property test compares them); infinite and BC dates, which the row
 * path cannot represent, are written the way PostgreSQL writes them.
 */

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

enum {
    K_NULL, K_BOOL, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_UTF8, K_LUTF8,
    K_DATE, K_TS, K_TSTZ, K_F64, K_DEC, K_DEC32, K_DEC64,
};

static PyObject *Unsupported;

typedef struct {
    PyObject_HEAD
    struct ArrowArrayStream stream;
    struct ArrowArray batch;
    int64_t position; /* next row of batch */
    int open, has_batch;
    int busy, close_pending; /* a fetch runs (perhaps in DuckDB, without the GIL); close waits */
    Py_ssize_t columns;
    int *kinds;
    int *scales;
    PyObject *encoders; /* tuple */
    Buffer out;
} ArrowRows;

static void
arrow_close(ArrowRows *self)
{
    if (self->has_batch && self->batch.release != NULL)
        self->batch.release(&self->batch);
    self->has_batch = 0;
    if (self->open && self->stream.release != NULL)
        self->stream.release(&self->stream);
    self->open = 0;
}

static int
column_kind(const struct ArrowSchema *s, int *scale)
{
    const char *f = s->format;
    if (s->dictionary != NULL || f == NULL || s->n_children != 0)
        return -1;
    *scale = 0;
    if (f[0] != '\0' && f[1] == '\0') {
        switch (f[0]) {
        case 'n': return K_NULL;
        case 'b': return K_BOOL;
        case 'c': return K_I8;
        case 's': return K_I16;
        case 'i': return K_I32;
        case 'l': return K_I64;
        case 'C': return K_U8;
        case 'S': return K_U16;
        case 'I': return K_U32;
        case 'u': return K_UTF8;
        case 'U': return K_LUTF8;
        case 'g': return K_F64;
        }
        return -1;
    }
    if (strcmp(f, "tdD") == 0)
        return K_DATE;
    if (strcmp(f, "tsu:") == 0)
        return K_TS;
    if (strcmp(f, "tsu:UTC") == 0 || strcmp(f, "tsu:+00:00") == 0 || strcmp(f, "tsu:Etc/UTC") == 0)
        return K_TSTZ;
    if (f[0] == 'd' && f[1] == ':') {
        int precision, sc, bits = 128, used = 0, more = 0;
        if (sscanf(f + 2, "%d,%d%n", &precision, &sc, &used) != 2)
            return -1;
        if (f[2 + used] == ',' && (sscanf(f + 3 + used, "%d%n", &bits, &more) != 1 ||
                                   f[3 + used + more] != '\0'))
            return -1;
        if ((f[2 + used] == '\0' || f[2 + used] == ',') && precision <= 38 && sc >= 0 &&
            sc <= precision && (bits == 32 || bits == 64 || bits == 128)) {
            /* PostgreSQL's unconstrained numeric (pgtypes.unbounded_decimal): written
             * without the fixed scale's trailing zeros, told by a negative scale */
            *scale = precision == 38 && sc > 0 && sc % 9 == 0 ? -sc : sc;
            return bits == 32 ? K_DEC32 : bits == 64 ? K_DEC64 : K_DEC;
        }
    }
    return -1;
}

static void ArrowRows_dealloc(ArrowRows *self);

static PyObject *
ArrowRows_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *capsule, *encoders;
    if (!PyArg_ParseTuple(args, "OO!", &capsule, &PyTuple_Type, &encoders))
        return NULL;
    struct ArrowArrayStream *source = PyCapsule_GetPointer(capsule, "arrow_array_stream");
    if (source == NULL)
        return NULL;
    if (source->release == NULL) {
        PyErr_SetString(PyExc_ValueError, "the Arrow stream was already taken");
        return NULL;
    }
    ArrowRows *self = (ArrowRows *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->stream = *source; /* moved: the capsule no longer releases it */
    source->release = NULL;
    self->open = 1;
    Py_INCREF(encoders);
    self->encoders = encoders;
    struct ArrowSchema schema;
    memset(&schema, 0, sizeof schema);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = self->stream.get_schema(&self->stream, &schema);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        const char *message = self->stream.get_last_error(&self->stream);
        PyErr_SetString(PyExc_RuntimeError, message ? message : "the Arrow stream failed");
        Py_DECREF(self);
        return NULL;
    }
    int ok = schema.format != NULL && strcmp(schema.format, "+s") == 0 &&
             schema.n_children == PyTuple_GET_SIZE(encoders) && schema.n_children <= 0x7fff;
    self->columns = ok ? (Py_ssize_t)schema.n_children : 0;
    self->kinds = PyMem_Calloc((size_t)(self->columns + 1), sizeof(int));
    self->scales = PyMem_Calloc((size_t)(self->columns + 1), sizeof(int));
    if (self->kinds == NULL || self->scales == NULL) {
        schema.release(&schema);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    char why[96] = "not one struct of the statement's columns";
    for (Py_ssize_t c = 0; ok && c < self->columns; c++) {
        self->kinds[c] = column_kind(schema.children[c], &self->scales[c]);
        ok = self->kinds[c] >= 0;
        if (!ok)
            snprintf(why, sizeof why, "column %zd has the Arrow format \"%.40s\"", c + 1,
                     schema.children[c]->format ? schema.children[c]->format : "");
    }
    if (schema.release != NULL)
        schema.release(&schema);
    if (!ok) {
        Py_DECREF(self);
        PyErr_Format(Unsupported, "not written by the columnar path: %s", why);
        return NULL;
    }
    return (PyObject *)self;
}

static void
ArrowRows_dealloc(ArrowRows *self)
{
    arrow_close(self);
    Py_XDECREF(self->encoders);
    PyMem_Free(self->kinds);
    PyMem_Free(self->scales);
    PyMem_Free(self->out.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
valid(const struct ArrowArray *a, int64_t i)
{
    const uint8_t *bits = a->n_buffers > 0 ? (const uint8_t *)a->buffers[0] : NULL;
    return bits == NULL || (bits[i >> 3] >> (i & 7)) & 1;
}

static int
put_text(Buffer *b, const char *text, Py_ssize_t size)
{
    return put_value(b, text, size);
}

static int
put_int(Buffer *b, long long v)
{
    char digits[24];
    char *end = digits + sizeof digits, *p = end;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return put_value(b, p, end - p);
}

/* proleptic Gregorian civil date from days since 1970-01-01 (H. Hinnant's algorithm) */
static void
civil(int64_t z, int64_t *year, int *month, int *day)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t y = yoe + era * 400;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *day = (int)(doy - (153 * mp + 2) / 5 + 1);
    *month = (int)(mp < 10 ? mp + 3 : mp - 9);
    *year = y + (*month <= 2);
}

/* "YYYY-MM-DD" (BC years as PostgreSQL: the year 1 - y, " BC" added by the caller) */
static int
date_text(char *out, int64_t days, int *bc)
{
    int64_t year;
    int month, day;
    civil(days, &year, &month, &day);
    *bc = year <= 0;
    if (*bc)
        year = 1 - year;
    return sprintf(out, "%04lld-%02d-%02d", (long long)year, month, day);
}

static int
put_date(Buffer *b, int32_t days)
{
    if (days == INT32_MAX)
        return put_text(b, "infinity", 8);
    if (days == -INT32_MAX)
        return put_text(b, "-infinity", 9);
    char text[48];
    int bc, n = date_text(text, days, &bc);
    if (bc)
        n += sprintf(text + n, " BC");
    return put_text(b, text, n);
}

static int
put_timestamp(Buffer *b, int64_t micros, int tz)
{
    if (micros == INT64_MAX)
        return put_text(b, "infinity", 8);
    if (micros == -INT64_MAX)
        return put_text(b, "-infinity", 9);
    int64_t days = micros / 86400000000LL, rest = micros % 86400000000LL;
    if (rest < 0) {
        rest += 86400000000LL;
        days -= 1;
    }
    char text[80];
    int bc, n = date_text(text, days, &bc);
    int64_t seconds = rest / 1000000, fraction = rest % 1000000;
    n += sprintf(text + n, " %02d:%02d:%02d", (int)(seconds / 3600), (int)(seconds / 60 % 60),
                 (int)(seconds % 60));
    if (fraction) {
        int width = 6;
        while (fraction % 10 == 0) {
            fraction /= 10;
            width--;
        }
        n += sprintf(text + n, ".%0*lld", width, (long long)fraction);
    }
    if (tz)
        n += sprintf(text + n, "+00");
    if (bc)
        n += sprintf(text + n, " BC");
    return put_text(b, text, n);
}

static int
put_decimal(Buffer *b, __int128 v, int scale)
{
    int trim = scale < 0;
    if (trim)
        scale = -scale;
    int negative = v < 0;
    unsigned __int128 u = negative ? (unsigned __int128)0 - (unsigned __int128)v : (unsigned __int128)v;
    char digits[64];
    char *end = digits + sizeof digits, *p = end;
    int count = 0;
    do {
        *--p = (char)('0' + (int)(u % 10));
        u /= 10;
        count++;
    } while (u);
    while (count <= scale) { /* a leading 0 before the point */
        *--p = '0';
        count++;
    }
    char text[80];
    int n = 0;
    if (negative)
        text[n++] = '-';
    int whole = count - scale;
    memcpy(text + n, p, (size_t)whole);
    n += whole;
    if (scale > 0) {
        text[n++] = '.';
        memcpy(text + n, p + whole, (size_t)scale);
        n += scale;
        if (trim) { /* 1.500000000 is 1.5, 2.000000000 is 2 */
            while (text[n - 1] == '0')
                n--;
            if (text[n - 1] == '.')
                n--;
            if (n == 2 && text[0] == '-' && text[1] == '0')
                text[0] = '0', n = 1; /* (-0.000000000 is 0) */
        }
    }
    return put_text(b, text, n);
}

static int
put_double(Buffer *b, double x, PyObject *encoder)
{
    if (x == 0.0)
        return signbit(x) ? put_text(b, "-0", 2) : put_text(b, "0", 1);
    double a = x < 0 ? -x : x;
    if (a >= 1e-4 && a < 1e15) { /* Python's repr is fixed there, with PostgreSQL's digits */
        char *text = PyOS_double_to_string(x, 'r', 0, 0, NULL);
        if (text == NULL)
            return -1;
        size_t n = strlen(text);
        if (n >= 2 && text[n - 2] == '.' && text[n - 1] == '0')
            n -= 2;
        int rc = put_text(b, text, (Py_ssize_t)n);
        PyMem_Free(text);
        return rc;
    }
    PyObject *value = PyFloat_FromDouble(x);
    if (value == NULL)
        return -1;
    int rc = put_encoded(b, encoder, value);
    Py_DECREF(value);
    return rc;
}

static int
put_cell(ArrowRows *self, Buffer *b, Py_ssize_t c, const struct ArrowArray *a, int64_t i)
{
    int kind = self->kinds[c];
    if (kind == K_NULL || !valid(a, i)) {
        if (reserve(b, 4) < 0)
            return -1;
        put32(b->data + b->size, 0xffffffffu);
        b->size += 4;
        return 0;
    }
    const void *data = a->buffers[1];
    switch (kind) {
    case K_BOOL:
        return put_text(b, ((const uint8_t *)data)[i >> 3] >> (i & 7) & 1 ? "t" : "f", 1);
    case K_I8: return put_int(b, ((const int8_t *)data)[i]);
    case K_I16: return put_int(b, ((const int16_t *)data)[i]);
    case K_I32: return put_int(b, ((const int32_t *)data)[i]);
    case K_I64: return put_int(b, ((const int64_t *)data)[i]);
    case K_U8: return put_int(b, ((const uint8_t *)data)[i]);
    case K_U16: return put_int(b, ((const uint16_t *)data)[i]);
    case K_U32: return put_int(b, ((const uint32_t *)data)[i]);
    case K_UTF8: {
        const int32_t *offsets = data;
        return put_text(b, (const char *)a->buffers[2] + offsets[i], offsets[i + 1] - offsets[i]);
    }
    case K_LUTF8: {
        const int64_t *offsets = data;
        return put_text(b, (const char *)a->buffers[2] + offsets[i],
                        (Py_ssize_t)(offsets[i + 1] - offsets[i]));
    }
    case K_DATE: return put_date(b, ((const int32_t *)data)[i]);
    case K_TS: return put_timestamp(b, ((const int64_t *)data)[i], 0);
    case K_TSTZ: return put_timestamp(b, ((const int64_t *)data)[i], 1);
    case K_F64:
        return put_double(b, ((const double *)data)[i], PyTuple_GET_ITEM(self->encoders, c));
    case K_DEC: {
        __int128 v; /* little-endian, as this host (the Arrow C interface is host-endian) */
        memcpy(&v, (const uint8_t *)data + 16 * i, 16);
        return put_decimal(b, v, self->scales[c]);
    }
    case K_DEC32: return put_decimal(b, ((const int32_t *)data)[i], self->scales[c]);
    case K_DEC64: return put_decimal(b, ((const int64_t *)data)[i], self->scales[c]);
    }
    PyErr_SetString(PyExc_SystemError, "unknown column kind");
    return -1;
}

/* the next batch from DuckDB (it runs the statement meanwhile, without the GIL); 0 at the end */
static int
next_batch(ArrowRows *self)
{
    if (self->has_batch) {
        self->batch.release(&self->batch);
        self->has_batch = 0;
    }
    for (;;) {
        memset(&self->batch, 0, sizeof self->batch);
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = self->stream.get_next(&self->stream, &self->batch);
        Py_END_ALLOW_THREADS
        if (rc != 0) {
            const char *message = self->stream.get_last_error(&self->stream);
            PyErr_SetString(PyExc_RuntimeError, message ? message : "the Arrow stream failed");
            arrow_close(self);
            return -1;
        }
        if (self->batch.release == NULL) { /* the end */
            arrow_close(self);
            return 0;
        }
        self->has_batch = 1;
        self->position = 0;
        if (self->batch.n_children != self->columns) {
            PyErr_SetString(PyExc_RuntimeError, "an Arrow batch does not match its schema");
            arrow_close(self);
            return -1;
        }
        if (self->batch.length > 0)
            return 1;
        self->batch.release(&self->batch);
        self->has_batch = 0;
    }
}

static PyObject *ArrowRows_fetch_rows(ArrowRows *self, Py_ssize_t limit);

/* fetch(n): one thread at a time; a close() from another thread meanwhile (a client gone while
 * DuckDB makes the next batch) is done when the fetch returns, never under it */
static PyObject *
ArrowRows_fetch(ArrowRows *self, PyObject *arg)
{
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "another fetch of this stream is running");
        return NULL;
    }
    self->busy = 1;
    PyObject *out = ArrowRows_fetch_rows(self, limit);
    self->busy = 0;
    if (self->close_pending) {
        self->close_pending = 0;
        arrow_close(self);
    }
    return out;
}

static PyObject *
ArrowRows_fetch_rows(ArrowRows *self, Py_ssize_t limit)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Buffer *b = &self->out;
    while (PyList_GET_SIZE(out) < limit && self->open) {
        if (!self->has_batch || self->position >= self->batch.length) {
            int rc = next_batch(self);
            if (rc < 0)
                goto fail;
            if (rc == 0)
                break;
        }
        const struct ArrowArray *root = &self->batch;
        while (self->position < root->length && PyList_GET_SIZE(out) < limit) {
            int64_t row = root->offset + self->position++;
            b->size = 0;
            if (reserve(b, 7) < 0)
                goto fail;
            b->data[0] = 'D';
            b->data[5] = (char)(self->columns >> 8);
            b->data[6] = (char)self->columns;
            b->size = 7;
            for (Py_ssize_t c = 0; c < self->columns; c++) {
                const struct ArrowArray *a = root->children[c];
                if (put_cell(self, b, c, a, a->offset + row) < 0)
                    goto fail;
            }
            put32(b->data + 1, (uint32_t)(b->size - 1));
            PyObject *message = PyBytes_FromStringAndSize(b->data, b->size);
            if (message == NULL)
                goto fail;
            int rc = PyList_Append(out, message);
            Py_DECREF(message);
            if (rc < 0)
                goto fail;
        }
    }
    if (self->has_batch && self->position >= self->batch.length) {
        /* the batch is used up: give its memory back now, and at the very end the stream's
         * (so that the cursor is free for the session's next statement) */
        int rc = next_batch(self);
        if (rc < 0)
            goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *
ArrowRows_close(ArrowRows *self, PyObject *Py_UNUSED(ignored))
{
    if (self->busy)
        self->close_pending = 1; /* the running fetch closes it as it returns */
    else
        arrow_close(self);
    Py_RETURN_NONE;
}

static PyObject *
ArrowRows_done(ArrowRows *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(!self->open);
}

static PyMethodDef arrow_rows_methods[] = {
    {"fetch", (PyCFunction)ArrowRows_fetch, METH_O,
     "fetch(n): at most n DataRow messages, [] at the end (the stream is then closed)."},
    {"close", (PyCFunction)ArrowRows_close, METH_NOARGS,
     "close(): give the stream back to DuckDB now (the rest of the rows are not read)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef arrow_rows_getset[] = {
    {"done", (getter)ArrowRows_done, NULL, "whether the stream is used up or closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ArrowRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.backends.embedded._rows.ArrowRows",
    .tp_basicsize = sizeof(ArrowRows),
    .tp_dealloc = (destructor)ArrowRows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DataRow messages from a DuckDB relation's Arrow stream (see the module).",
    .tp_methods = arrow_rows_methods,
    .tp_getset = arrow_rows_getset,
    .tp_new = ArrowRows_new,
};

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
    if (PyType_Ready(&ArrowRowsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Unsupported = PyErr_NewException("proxy.backends.embedded._rows.Unsupported", NULL, NULL);
    if (Unsupported == NULL || PyModule_AddObjectRef(module, "Unsupported", Unsupported) < 0 ||
        PyModule_AddObjectRef(module, "ArrowRows", (PyObject *)&ArrowRowsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

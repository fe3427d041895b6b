/* The relay of a chunked SSE body in its common case, in C: router.upstream.relay.

One call per socket read from the engine, made by router.upstream.client.Connection while the
proxy relays a stream straight to its client. ``Relay.raw(data)`` takes the read's bytes,
exactly as they came from the engine, and either writes them all, as they are, to the client's
transport and returns True, or writes nothing and returns False, and then the Python path
(httptools, the SSE tap, the sink) handles those bytes the slow way.

It takes them only when all of this holds (else False):
  - the client can take them now: ``flow.write_paused`` and ``cycle.disconnected`` false and
    ``transport.is_closing()`` false;
  - the tap (an ``SseTap``, or None for no tap) holds nothing: no carried part of an event, no
    held finish event, no rename;
  - ``data`` is one or more whole chunks of a chunked body (hex size, CRLF, that many bytes,
    CRLF), none of them the last chunk, with no chunk extension, and the caller knows the
    engine's body is at a chunk boundary where ``data`` starts;
  - each chunk's payload is whole SSE events (it ends with "\n\n") in which the tap would see
    nothing: no ``"usage":{`` (or with one space), and when it strips the usage event no
    ``"finish_reason":"`` (or with one space). Its ``_gave_up`` skips these checks, as it skips
    its own.

The bytes go out with the engine's own chunk framing: the same chunked body the Python path
would send, which frames each read as one chunk. tests/upstream/test_relay.py holds this to a
reference written in Python, over generated inputs.
*/
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static unsigned long long relayed_reads; /* reads written by raw(), for /router/status */
static PyObject *s_write_paused, *s_disconnected, *s_carry, *s_held, *s_rename, *s_gave_up;

#define MAX_DIGITS (sizeof(Py_ssize_t) > 4 ? 8 : 7)

static const char USAGE_KEY[] = "\"usage\":";         /* 8 bytes */
static const char FINISH_KEY[] = "\"finish_reason\":"; /* 16 bytes */

typedef struct {
    PyObject_HEAD
    PyObject *write;   /* the client transport's write */
    PyObject *closing; /* its is_closing */
    PyObject *flow;
    PyObject *cycle;
    PyObject *tap; /* an SseTap, or Py_None */
    int strip;
} Relay;

/* 1 when the attribute is true, 0 when false, -1 on an error. */
static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* Whether ``payload`` (whose last bytes are "\n\n") holds ``key`` followed, right after its
   colon or one space, by the byte ``opening``. */
static int
member_starts(const char *payload, Py_ssize_t size, const char *key, Py_ssize_t klen,
              char opening)
{
    const char *p = payload, *end = payload + size;
    while (p < end) {
        const char *at = memmem(p, (size_t)(end - p), key, (size_t)klen);
        if (at == NULL)
            return 0;
        const char *after = at + klen; /* the payload ends in "\n\n": after < end - 1 */
        if (*after == ' ')
            after++;
        if (*after == opening)
            return 1;
        p = at + klen;
    }
    return 0;
}

/* 0: the tap would return the payload unchanged; 1: it would not (or might not). */
static int
tap_would_look(const char *payload, Py_ssize_t size, int strip)
{
    if (size < 2 || payload[size - 2] != '\n' || payload[size - 1] != '\n')
        return 1;
    if (member_starts(payload, size, USAGE_KEY, 8, '{'))
        return 1;
    if (strip && member_starts(payload, size, FINISH_KEY, 16, '"'))
        return 1;
    return 0;
}

/* 1 when ``data`` is whole non-final chunks whose payloads the tap would pass unchanged
   (``check``: the tap looks at all), else 0. */
static int
plain_chunks(const char *data, Py_ssize_t len, int check, int strip)
{
    Py_ssize_t pos = 0;
    if (len == 0)
        return 0;
    while (pos < len) {
        Py_ssize_t size = 0, digits = 0;
        while (pos < len) {
            char c = data[pos];
            int v;
            if (c >= '0' && c <= '9')
                v = c - '0';
            else if (c >= 'a' && c <= 'f')
                v = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                v = c - 'A' + 10;
            else
                break;
            if (++digits > MAX_DIGITS) /* past 4 GiB (2 GiB on 32 bits): not ours to judge */
                return 0;
            size = size * 16 + v;
            pos++;
        }
        if (digits == 0 || size == 0) /* not a size, or the last chunk */
            return 0;
        if (pos + 2 > len || data[pos] != '\r' || data[pos + 1] != '\n')
            return 0; /* an extension, or a size line cut short */
        pos += 2;
        if (size > len - pos - 2) /* the chunk, or its CRLF, is still to come */
            return 0;
        if (data[pos + size] != '\r' || data[pos + size + 1] != '\n')
            return 0;
        if (check && tap_would_look(data + pos, size, strip))
            return 0;
        pos += size + 2;
    }
    return 1;
}

/* 1: the tap holds nothing (or has given up: *check = 0); 0: it holds something, or is not
   the SseTap this was written against (an attribute renamed: the Python path takes every read,
   and /router/status shows no raw reads); -1: error */
static int
tap_idle_(PyObject *tap, int *check)
{
    *check = 0;
    if (tap == Py_None)
        return 1;
    int r = attr_true(tap, s_gave_up);
    if (r != 0)
        return r < 0 ? -1 : 1;
    if ((r = attr_true(tap, s_carry)) != 0 || (r = attr_true(tap, s_held)) != 0)
        return r < 0 ? -1 : 0;
    PyObject *rename = PyObject_GetAttr(tap, s_rename);
    if (rename == NULL)
        return -1;
    r = rename == Py_None;
    Py_DECREF(rename);
    *check = 1;
    return r;
}

static int
tap_idle(PyObject *tap, int *check)
{
    int r = tap_idle_(tap, check);
    if (r < 0 && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* 1: the client can take bytes now; 0: it cannot; -1: an error */
static int
client_ready(Relay *self)
{
    int r;
    if ((r = attr_true(self->flow, s_write_paused)) != 0 ||
        (r = attr_true(self->cycle, s_disconnected)) != 0)
        return r < 0 ? -1 : 0;
    PyObject *closing = PyObject_CallNoArgs(self->closing);
    if (closing == NULL)
        return -1;
    r = PyObject_IsTrue(closing);
    Py_DECREF(closing);
    return r < 0 ? -1 : !r;
}

static PyObject *
Relay_raw(Relay *self, PyObject *data)
{
    int r, check;
    if (self->write == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Relay.__init__ was not called");
        return NULL;
    }
    if (!PyBytes_CheckExact(data)) /* (transports give bytes) the Python path takes the rest */
        Py_RETURN_FALSE;
    if ((r = client_ready(self)) != 1 || (r = tap_idle(self->tap, &check)) != 1) {
        if (r < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    if (!plain_chunks(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), check, self->strip))
        Py_RETURN_FALSE;
    PyObject *res = PyObject_CallOneArg(self->write, data);
    if (res == NULL)
        return NULL;
    Py_DECREF(res);
    relayed_reads++;
    Py_RETURN_TRUE;
}

static int
Relay_init(Relay *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"flow", "cycle", "transport", "tap", "strip", NULL};
    PyObject *flow, *cycle, *transport, *tap;
    int strip = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO|p", kwlist, &flow, &cycle, &transport,
                                     &tap, &strip))
        return -1;
    PyObject *write = PyObject_GetAttrString(transport, "write");
    if (write == NULL)
        return -1;
    PyObject *closing = PyObject_GetAttrString(transport, "is_closing");
    if (closing == NULL) {
        Py_DECREF(write);
        return -1;
    }
    Py_XSETREF(self->write, write);
    Py_XSETREF(self->closing, closing);
    Py_XSETREF(self->flow, Py_NewRef(flow));
    Py_XSETREF(self->cycle, Py_NewRef(cycle));
    Py_XSETREF(self->tap, Py_NewRef(tap));
    self->strip = strip;
    return 0;
}

static int
Relay_traverse(Relay *self, visitproc visit, void *arg)
{
    Py_VISIT(self->write);
    Py_VISIT(self->closing);
    Py_VISIT(self->flow);
    Py_VISIT(self->cycle);
    Py_VISIT(self->tap);
    return 0;
}

static int
Relay_clear(Relay *self)
{
    Py_CLEAR(self->write);
    Py_CLEAR(self->closing);
    Py_CLEAR(self->flow);
    Py_CLEAR(self->cycle);
    Py_CLEAR(self->tap);
    return 0;
}

static void
Relay_dealloc(Relay *self)
{
    PyObject_GC_UnTrack(self);
    Relay_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Relay_methods[] = {
    {"raw", (PyCFunction)Relay_raw, METH_O,
     "raw(data) -> bool: write a read of whole plain chunks to the client as is, or nothing"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "router.upstream._relay.Relay",
    .tp_basicsize = sizeof(Relay),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Relay(flow, cycle, transport, tap, strip=False): see the module's source",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Relay_init,
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_traverse = (traverseproc)Relay_traverse,
    .tp_clear = (inquiry)Relay_clear,
    .tp_methods = Relay_methods,
};

static PyObject *
py_plain_chunks(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer buf;
    int check, strip;
    if (!PyArg_ParseTuple(args, "y*pp", &buf, &check, &strip))
        return NULL;
    int r = plain_chunks(buf.buf, buf.len, check, strip);
    PyBuffer_Release(&buf);
    return PyBool_FromLong(r);
}

static PyObject *
py_relayed(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(relayed_reads);
}

static PyMethodDef module_methods[] = {
    {"relayed", py_relayed, METH_NOARGS, "relayed() -> int: reads raw() wrote, in this process"},
    {"plain_chunks", py_plain_chunks, METH_VARARGS,
     "plain_chunks(data, check, strip) -> bool: Relay.raw's test of the bytes (for tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef relay_module = {
    PyModuleDef_HEAD_INIT, "router.upstream._relay", NULL, -1, module_methods,
};

PyMODINIT_FUNC
PyInit__relay(void)
{
    if (PyType_Ready(&RelayType) < 0)
        return NULL;
#define INTERN(var, text)                                 \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(s_write_paused, "write_paused");
    INTERN(s_disconnected, "disconnected");
    INTERN(s_carry, "_carry");
    INTERN(s_held, "_held");
    INTERN(s_rename, "_rename");
    INTERN(s_gave_up, "_gave_up");
    PyObject *m = PyModule_Create(&relay_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Relay", (PyObject *)&RelayType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

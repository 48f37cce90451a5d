/* The current span, read and switched in C: _sdk_compat.span_switch()'s current() and attach(span).
 *
 * Why: every span the events API begins reads the current span, and every span begun with ``with`` makes itself
 * current; in Python each is a frame of ours (``get().get(key, invalid)``; a copy of the context with the span
 * under its key, set as the current one), and a cold Python frame costs about a microsecond in a training loop.
 * These are the same two operations on the same objects, as C calls: no Python frame, no Python code run.
 * The Python closures in _sdk_compat.py stay the fallback (no extension, OTEL_TRAINING_NATIVE=off) and the
 * route for any runtime context other than the SDK's default one (a ContextVar holding a Context, a dict).
 *
 * CurrentSpan(variable, key, default)() -> variable.get()[key], or default where the context has none (or no
 * context is set yet).
 * AttachSpan(variable, key, context_type)(span) -> the token of variable.set(context_type({**current, key: span})).
 * The current context is read as a dict when it is one (the API's Context subclasses dict, without overriding
 * lookups); anything else is asked through its own methods, as the Python closures do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "binding.h"

typedef struct {
    PyObject_HEAD
    PyObject *variable, *key, *other; /* other: CurrentSpan's default, AttachSpan's context type */
    vectorcallfunc vectorcall;        /* what CPython calls: the type's own call */
} ContextCall;

static int context_call_traverse(ContextCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->variable);
    Py_VISIT(self->key);
    Py_VISIT(self->other);
    return 0;
}

static int context_call_clear(ContextCall *self) {
    Py_CLEAR(self->variable);
    Py_CLEAR(self->key);
    Py_CLEAR(self->other);
    return 0;
}

static void context_call_dealloc(ContextCall *self) {
    PyObject_GC_UnTrack(self);
    context_call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Its fields from (variable, key, third): all given in the constructor, so no instance is ever callable half
 * made (no __init__ to skip). */
static int context_call_fill(ContextCall *self, PyObject *args, PyObject *kwargs, const char *what, char *third) {
    char *names[] = {"variable", "key", third, NULL};
    PyObject *variable, *key, *other;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUO", names, &variable, &key, &other)) return -1;
    if (!PyContextVar_CheckExact(variable)) {
        PyErr_Format(PyExc_TypeError, "%s: variable must be a contextvars.ContextVar", what);
        return -1;
    }
    self->variable = Py_NewRef(variable), self->key = Py_NewRef(key), self->other = Py_NewRef(other);
    return 0;
}

static int current_span_fill(ContextCall *self, PyObject *args, PyObject *kwargs) {
    return context_call_fill(self, args, kwargs, "CurrentSpan", "default");
}

static int attach_span_fill(ContextCall *self, PyObject *args, PyObject *kwargs) {
    if (context_call_fill(self, args, kwargs, "AttachSpan", "context_type") < 0) return -1;
    if (!PyType_Check(self->other)) {
        PyErr_SetString(PyExc_TypeError, "AttachSpan: context_type must be a type");
        return -1;
    }
    return 0;
}

static int enabled_fill(ContextCall *self, PyObject *args, PyObject *kwargs) {
    if (context_call_fill(self, args, kwargs, "InstrumentationEnabled", "plain") < 0) return -1;
    if (!PyUnicode_Check(self->other)) {
        PyErr_SetString(PyExc_TypeError, "InstrumentationEnabled: plain must be a str");
        return -1;
    }
    return 0;
}

/* The current context (a new reference), or NULL with no exception where none is set yet. */
static int current_context(ContextCall *self, PyObject **context) {
    *context = NULL;
    return PyContextVar_Get(self->variable, NULL, context);
}

static PyObject *current_span_call(ContextCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    (void)args;
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "current() takes no arguments");
        return NULL;
    }
    PyObject *context;
    if (current_context(self, &context) < 0) return NULL;
    if (context == NULL) return Py_NewRef(self->other);
    PyObject *span;
    if (PyDict_Check(context)) {
        span = PyDict_GetItemWithError(context, self->key);
        if (span == NULL && PyErr_Occurred()) {
            Py_DECREF(context);
            return NULL;
        }
        span = Py_NewRef(span == NULL ? self->other : span);
    } else {
        span = PyObject_CallMethod(context, "get", "OO", self->key, self->other);
    }
    Py_DECREF(context);
    return span;
}

static PyObject *attach_span_call(ContextCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "attach() takes one argument, the span");
        return NULL;
    }
    PyObject *context;
    if (current_context(self, &context) < 0) return NULL;
    /* dict(current): a copy whatever the current context's type, as the Python closure makes it */
    PyObject *values = context == NULL        ? PyDict_New()
                       : PyDict_Check(context) ? PyDict_Copy(context)
                                               : PyObject_CallOneArg((PyObject *)&PyDict_Type, context);
    Py_XDECREF(context);
    if (values == NULL) return NULL;
    if (PyDict_SetItem(values, self->key, args[0]) < 0) {
        Py_DECREF(values);
        return NULL;
    }
    PyObject *fresh = PyObject_CallOneArg(self->other, values);
    Py_DECREF(values);
    if (fresh == NULL) return NULL;
    PyObject *token = PyContextVar_Set(self->variable, fresh);
    Py_DECREF(fresh);
    return token;
}

/* InstrumentationEnabled(variable, key, plain)(): not inside suppress_instrumentation(), gate.c's check as a call
 * (the step tracker's optimizer hooks ask it on every step; in Python it is a frame of ours). */
static PyObject *enabled_call(ContextCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    (void)args;
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "enabled() takes no arguments");
        return NULL;
    }
    int off = ot_suppressed(self->variable, self->key, self->other);
    if (off < 0) return NULL;
    return PyBool_FromLong(!off);
}

#define CONTEXT_CALL_TYPE(c_name, python_name, fill, call, doc)                                              \
    static PyObject *c_name##_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {                     \
        ContextCall *self = (ContextCall *)type->tp_alloc(type, 0);                                           \
        if (self == NULL) return NULL;                                                                        \
        self->vectorcall = call;                                                                              \
        if (fill(self, args, kwargs) < 0) {                                                                   \
            Py_DECREF(self);                                                                                  \
            return NULL;                                                                                      \
        }                                                                                                     \
        return (PyObject *)self;                                                                              \
    }                                                                                                         \
    PyTypeObject c_name = {                                                                                   \
        PyVarObject_HEAD_INIT(NULL, 0)                                                                        \
        .tp_name = "otel_training._native." python_name,                                                      \
        .tp_basicsize = sizeof(ContextCall),                                                                 \
        .tp_vectorcall_offset = offsetof(ContextCall, vectorcall),                                           \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,                     \
        .tp_doc = doc,                                                                                        \
        .tp_new = c_name##_new,                                                                               \
        .tp_dealloc = (destructor)context_call_dealloc,                                                       \
        .tp_traverse = (traverseproc)context_call_traverse,                                                   \
        .tp_clear = (inquiry)context_call_clear,                                                              \
        .tp_call = PyVectorcall_Call,                                                                          \
    };

CONTEXT_CALL_TYPE(CurrentSpanType, "CurrentSpan", current_span_fill, (vectorcallfunc)current_span_call,
                  "CurrentSpan(variable, key, default)(): the current context's span, or default (in C).")
CONTEXT_CALL_TYPE(AttachSpanType, "AttachSpan", attach_span_fill, (vectorcallfunc)attach_span_call,
                  "AttachSpan(variable, key, context_type)(span): make span current; returns the token (in C).")
CONTEXT_CALL_TYPE(EnabledType, "InstrumentationEnabled", enabled_fill, (vectorcallfunc)enabled_call,
                  "InstrumentationEnabled(variable, key, plain)(): True outside suppress_instrumentation() (in C).")

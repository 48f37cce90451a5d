/* The torch instrumentor's per-step wrappers in C: the DataLoader fetch and the backward pass.
 *
 * Why: each is a wrapt wrapper called on every training step, and each was two Python frames before the
 * step tracker saw it (the wrapper, then the suppression check). In a real loop torch has evicted our code
 * from the caches by the time the next step comes, and a cold Python frame costs about a microsecond; these
 * cost none. The Python fallback (integrations/torch/instrumentor.py's _fetch_wrapper and _backward_wrapper)
 * does the same, and is what runs without the extension or with OTEL_TRAINING_NATIVE=off.
 *
 * Gate(begin, end, variable, key, plain, fetch) is called by wrapt as gate(wrapped, instance, args, kwargs):
 * - inside suppress_instrumentation() (the current context, the ContextVar ``variable``, holds a true value
 *   under ``key`` or ``plain``), it only calls wrapped(*args, **kwargs);
 * - fetch: started = begin(instance); the call; end(started) or, when it raised, end(started, error) and the
 *   error goes on as it was;
 * - backward: begin(); the call; end() (not when it raised, as the Python wrapper).
 * The tracker's begin and end contain their own errors; an error from them goes up as from the Python wrapper.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "binding.h"

typedef struct {
    PyObject_HEAD
    PyObject *begin, *end, *variable, *key, *plain;
    int fetch;
} Gate;

static int gate_traverse(Gate *self, visitproc visit, void *arg) {
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->variable);
    Py_VISIT(self->key);
    Py_VISIT(self->plain);
    return 0;
}

static int gate_clear(Gate *self) {
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->variable);
    Py_CLEAR(self->key);
    Py_CLEAR(self->plain);
    return 0;
}

static void gate_dealloc(Gate *self) {
    PyObject_GC_UnTrack(self);
    gate_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int gate_init(Gate *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"begin", "end", "variable", "key", "plain", "fetch", NULL};
    PyObject *begin, *end, *variable, *key, *plain;
    int fetch;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOp", names, &begin, &end, &variable, &key, &plain, &fetch))
        return -1;
    if (!PyContextVar_CheckExact(variable)) {
        PyErr_SetString(PyExc_TypeError, "Gate: variable must be a contextvars.ContextVar");
        return -1;
    }
    if (!PyCallable_Check(begin) || !PyCallable_Check(end)) {
        PyErr_SetString(PyExc_TypeError, "Gate: begin and end must be callable");
        return -1;
    }
    Py_XSETREF(self->begin, Py_NewRef(begin));
    Py_XSETREF(self->end, Py_NewRef(end));
    Py_XSETREF(self->variable, Py_NewRef(variable));
    Py_XSETREF(self->key, Py_NewRef(key));
    Py_XSETREF(self->plain, Py_NewRef(plain));
    self->fetch = fetch;
    return 0;
}

/* 1 inside suppress_instrumentation() (the current context, in ``variable``, holds a true value under ``key`` or
 * ``plain``), 0 outside, -1 with an exception. */
int ot_suppressed(PyObject *variable, PyObject *key, PyObject *plain) {
    PyObject *current = NULL;
    if (PyContextVar_Get(variable, NULL, &current) < 0) return -1;
    if (current == NULL) return 0; /* no context set yet: nothing suppressed */
    int result = 0;
    PyObject *keys[2] = {key, plain};
    for (int index = 0; index < 2 && result == 0; index++) {
        /* The context is a dict (the API's Context subclasses it); anything else is asked as a mapping. */
        PyObject *value = PyDict_Check(current) ? Py_XNewRef(PyDict_GetItemWithError(current, keys[index]))
                                                : PyObject_CallMethod(current, "get", "O", keys[index]);
        if (value == NULL) {
            if (PyErr_Occurred()) result = -1;
            continue;
        }
        result = PyObject_IsTrue(value);
        Py_DECREF(value);
    }
    Py_DECREF(current);
    return result;
}

static PyObject *gate_call(Gate *self, PyObject *args, PyObject *kwargs) {
    PyObject *wrapped, *instance, *call_args, *call_kwargs;
    if (self->variable == NULL) { /* made by Gate.__new__ alone, never initialised */
        PyErr_SetString(PyExc_TypeError, "Gate: not initialised");
        return NULL;
    }
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "Gate takes (wrapped, instance, args, kwargs)");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Gate", 4, 4, &wrapped, &instance, &call_args, &call_kwargs)) return NULL;
    if (!PyTuple_Check(call_args) || (call_kwargs != Py_None && !PyDict_Check(call_kwargs))) {
        PyErr_SetString(PyExc_TypeError, "Gate: args must be a tuple and kwargs a dict");
        return NULL;
    }
    PyObject *passed = call_kwargs == Py_None ? NULL : call_kwargs;
    int off = ot_suppressed(self->variable, self->key, self->plain);
    if (off < 0) return NULL;
    if (off) return PyObject_Call(wrapped, call_args, passed);
    if (!self->fetch) {
        PyObject *began = PyObject_CallNoArgs(self->begin);
        if (began == NULL) return NULL;
        Py_DECREF(began);
        PyObject *result = PyObject_Call(wrapped, call_args, passed);
        if (result == NULL) return NULL;
        PyObject *ended = PyObject_CallNoArgs(self->end);
        if (ended == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(ended);
        return result;
    }
    PyObject *started = PyObject_CallOneArg(self->begin, instance);
    if (started == NULL) return NULL;
    PyObject *batch = PyObject_Call(wrapped, call_args, passed);
    PyObject *ended;
    if (batch == NULL) {
        /* end(started, error), then the error goes on: StopIteration included (the end of an epoch). */
        PyObject *type, *error, *traceback;
        PyErr_Fetch(&type, &error, &traceback);
        PyErr_NormalizeException(&type, &error, &traceback);
        if (traceback != NULL && error != NULL) PyException_SetTraceback(error, traceback);
        ended = PyObject_CallFunctionObjArgs(self->end, started, error == NULL ? Py_None : error, NULL);
        Py_DECREF(started);
        if (ended == NULL) { /* the tracker's end raised (it contains its errors): that one goes up */
            Py_XDECREF(type);
            Py_XDECREF(error);
            Py_XDECREF(traceback);
            return NULL;
        }
        Py_DECREF(ended);
        PyErr_Restore(type, error, traceback);
        return NULL;
    }
    ended = PyObject_CallOneArg(self->end, started);
    Py_DECREF(started);
    if (ended == NULL) {
        Py_DECREF(batch);
        return NULL;
    }
    Py_DECREF(ended);
    return batch;
}

PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.Gate",
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Gate(begin, end, variable, key, plain, fetch): the torch instrumentor's fetch or backward wrapper "
              "(wrapt's signature), in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)gate_init,
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_call = (ternaryfunc)gate_call,
};

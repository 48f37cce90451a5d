/* The torch instrumentor's per-step wrappers in C: the DataLoader fetch and the backward pass.
 *
 * Why: each is called on every training step. In a real loop torch has evicted our code from the caches by
 * the time the next step comes, and a cold Python frame costs about a microsecond; these cost none. They are
 * installed in place of the function they wrap (``_BaseDataLoaderIter.__next__``, ``torch.autograd.backward``),
 * not through wrapt: a wrapt proxy cost 0.7-1.0 us a call in a tight loop (a bound proxy made per fetch, the
 * arguments packed into a tuple and a dict), more than the gate's own work. The Python fallback
 * (integrations/torch/instrumentor.py's _fetch_wrapper and _backward_wrapper) does the same, and is what runs
 * without the extension or with OTEL_TRAINING_NATIVE=off.
 *
 * Gate(begin, end, variable, key, plain, fetch, wrapped) is called as ``wrapped`` is, arguments passed on as
 * they came (vectorcall, no tuple or dict made):
 * - inside suppress_instrumentation() (the current context, the ContextVar ``variable``, holds a true value
 *   under ``key`` or ``plain``), or once closed (``close()``: uninstrumented while somebody else's wrapper
 *   still holds this one), it only calls wrapped;
 * - fetch: started = begin(iterator), the iterator being the first argument; the call; end(started) or, when
 *   it raised, end(started, error) and the error goes on as it was;
 * - backward: begin(); the call; end() (not when it raised, as the Python wrapper).
 * It binds as a method (a class attribute: ``iterator.__next__``), and the interpreter's ``next()`` calls it
 * with the iterator first and no bound object made (Py_TPFLAGS_METHOD_DESCRIPTOR). Attributes it does not
 * have are the wrapped function's (``__name__``, ``__qualname__``), and ``__wrapped__`` is that function.
 * The tracker's begin and end contain their own errors; an error from them goes up as from the Python wrapper.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "binding.h"

typedef struct {
    PyObject_HEAD
    PyObject *begin, *end, *variable, *key, *plain, *wrapped;
    int fetch, closed;
    vectorcallfunc vectorcall;
} Gate;

static int gate_traverse(Gate *self, visitproc visit, void *arg) {
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->variable);
    Py_VISIT(self->key);
    Py_VISIT(self->plain);
    Py_VISIT(self->wrapped);
    return 0;
}

static int gate_clear(Gate *self) {
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->variable);
    Py_CLEAR(self->key);
    Py_CLEAR(self->plain);
    Py_CLEAR(self->wrapped);
    return 0;
}

static void gate_dealloc(Gate *self) {
    PyObject_GC_UnTrack(self);
    gate_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int gate_init(Gate *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"begin", "end", "variable", "key", "plain", "fetch", "wrapped", NULL};
    PyObject *begin, *end, *variable, *key, *plain, *wrapped;
    int fetch;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOpO", names, &begin, &end, &variable, &key, &plain, &fetch,
                                     &wrapped))
        return -1;
    if (!PyContextVar_CheckExact(variable)) {
        PyErr_SetString(PyExc_TypeError, "Gate: variable must be a contextvars.ContextVar");
        return -1;
    }
    if (!PyCallable_Check(begin) || !PyCallable_Check(end) || !PyCallable_Check(wrapped)) {
        PyErr_SetString(PyExc_TypeError, "Gate: begin, end and wrapped must be callable");
        return -1;
    }
    Py_XSETREF(self->begin, Py_NewRef(begin));
    Py_XSETREF(self->end, Py_NewRef(end));
    Py_XSETREF(self->variable, Py_NewRef(variable));
    Py_XSETREF(self->key, Py_NewRef(key));
    Py_XSETREF(self->plain, Py_NewRef(plain));
    Py_XSETREF(self->wrapped, Py_NewRef(wrapped));
    self->fetch = fetch;
    self->closed = 0;
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

static PyObject *gate_vectorcall(Gate *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (self->wrapped == NULL) { /* made by Gate.__new__ alone, never initialised */
        PyErr_SetString(PyExc_TypeError, "Gate: not initialised");
        return NULL;
    }
    PyObject *wrapped = self->wrapped;
    if (self->closed) return PyObject_Vectorcall(wrapped, args, nargsf, kwnames);
    int off = ot_suppressed(self->variable, self->key, self->plain);
    if (off < 0) return NULL;
    if (off) return PyObject_Vectorcall(wrapped, args, nargsf, kwnames);
    if (!self->fetch) {
        PyObject *began = PyObject_CallNoArgs(self->begin);
        if (began == NULL) return NULL;
        Py_DECREF(began);
        PyObject *result = PyObject_Vectorcall(wrapped, args, nargsf, kwnames);
        if (result == NULL) return NULL;
        PyObject *ended = PyObject_CallNoArgs(self->end);
        if (ended == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(ended);
        return result;
    }
    if (PyVectorcall_NARGS(nargsf) < 1) {
        PyErr_SetString(PyExc_TypeError, "Gate: a fetch is called with its iterator first");
        return NULL;
    }
    PyObject *started = PyObject_CallOneArg(self->begin, args[0]);
    if (started == NULL) return NULL;
    PyObject *batch = PyObject_Vectorcall(wrapped, args, nargsf, kwnames);
    PyObject *ended;
    if (batch == NULL) {
        /* end(started, error), then the error goes on: StopIteration included (the end of an epoch). */
        PyObject *type, *error, *traceback;
        PyErr_Fetch(&type, &error, &traceback);
        PyErr_NormalizeException(&type, &error, &traceback);
        if (traceback != NULL && error != NULL) PyException_SetTraceback(error, traceback);
        PyObject *pair[2] = {started, error == NULL ? Py_None : error};
        ended = PyObject_Vectorcall(self->end, pair, 2, NULL);
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

/* As a class attribute: bound to the instance, a method (the interpreter's own calls skip this, see above). */
static PyObject *gate_descr_get(PyObject *self, PyObject *instance, PyObject *owner) {
    (void)owner;
    if (instance == NULL || instance == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, instance);
}

/* What the gate lacks is the wrapped function's: __name__, __qualname__, __module__ as code reads them. */
static PyObject *gate_getattro(Gate *self, PyObject *name) {
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || self->wrapped == NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return found;
    PyErr_Clear();
    return PyObject_GetAttr(self->wrapped, name);
}

static PyObject *gate_close(Gate *self, PyObject *unused) {
    (void)unused;
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *gate_wrapped(Gate *self, void *unused) {
    (void)unused;
    if (self->wrapped == NULL) {
        PyErr_SetString(PyExc_AttributeError, "__wrapped__");
        return NULL;
    }
    return Py_NewRef(self->wrapped);
}

static PyObject *gate_is_closed(Gate *self, void *unused) {
    (void)unused;
    return PyBool_FromLong(self->closed);
}

static PyMethodDef gate_methods[] = {
    {"close", (PyCFunction)gate_close, METH_NOARGS,
     "From now on only call the wrapped function (uninstrumented while another wrapper still holds this one)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef gate_getset[] = {
    {"__wrapped__", (getter)gate_wrapped, NULL, "The function this gate stands in for.", NULL},
    {"closed", (getter)gate_is_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *gate_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Gate *self = (Gate *)PyType_GenericNew(type, args, kwargs);
    if (self != NULL) self->vectorcall = (vectorcallfunc)gate_vectorcall;
    return (PyObject *)self;
}

PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.Gate",
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Gate(begin, end, variable, key, plain, fetch, wrapped): the torch instrumentor's fetch or backward "
              "wrapper, in C, called as wrapped is.",
    .tp_new = gate_new,
    .tp_vectorcall_offset = offsetof(Gate, vectorcall),
    .tp_descr_get = gate_descr_get,
    .tp_getattro = (getattrofunc)gate_getattro,
    .tp_methods = gate_methods,
    .tp_getset = gate_getset,
    .tp_init = (initproc)gate_init,
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_call = PyVectorcall_Call,
};

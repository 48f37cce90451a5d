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

#include <time.h>

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

/* 1 inside suppress_instrumentation(), 0 outside, -1 with an exception. */
static int gate_suppressed(Gate *self) {
    PyObject *current = NULL;
    if (PyContextVar_Get(self->variable, NULL, &current) < 0) return -1;
    if (current == NULL) return 0; /* no context set yet: nothing suppressed */
    int result = 0;
    PyObject *keys[2] = {self->key, self->plain};
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
    int suppressed = gate_suppressed(self);
    if (suppressed < 0) return NULL;
    if (suppressed) return PyObject_Call(wrapped, call_args, passed);
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

/* StepHooks(tracker, variable, key, plain): the step tracker's three simplest hooks in C, as bound methods
 * (torch and the backward gate call them without a Python frame): backward_end(), optimizer_pre(optimizer,
 * args, kwargs), optimizer_post(optimizer, args, kwargs). Each does what the tracker's Python method does
 * (integrations/torch/steps.py, the fallback) on the tracker's own attributes, and hands everything but the
 * usual case to a Python method of the tracker: _optimizer_pre_opening() when no step is open,
 * _stepped_once(optimizer, False) and _optimizer_post_rest(optimizer). Contained as the Python hooks are:
 * an error is given to tracker._hook_failed(name, error) and never raised into the loop. */
typedef struct {
    PyObject_HEAD
    PyObject *tracker, *variable, *key, *plain;
} StepHooks;

static PyObject *one;
static PyObject *s_step, *s_owner, *s_backward_ends, *s_optimizer_calls, *s_nested, *s_claim, *s_claim_if_dormant,
    *s_pre_opening, *s_stepped_once, *s_post_rest, *s_hook_failed;

static int hooks_names(void) {
    if (s_step != NULL) return 0;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return -1;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    INTERN(s_step, "_step")
    INTERN(s_owner, "_owner")
    INTERN(s_backward_ends, "_backward_ends")
    INTERN(s_optimizer_calls, "optimizer_calls")
    INTERN(s_nested, "_nested")
    INTERN(s_claim, "_claim")
    INTERN(s_claim_if_dormant, "claim_if_dormant")
    INTERN(s_pre_opening, "_optimizer_pre_opening")
    INTERN(s_stepped_once, "_stepped_once")
    INTERN(s_post_rest, "_optimizer_post_rest")
    INTERN(s_hook_failed, "_hook_failed")
#undef INTERN
    return 0;
}

static int hooks_traverse(StepHooks *self, visitproc visit, void *arg) {
    Py_VISIT(self->tracker);
    Py_VISIT(self->variable);
    Py_VISIT(self->key);
    Py_VISIT(self->plain);
    return 0;
}

static int hooks_clear(StepHooks *self) {
    Py_CLEAR(self->tracker);
    Py_CLEAR(self->variable);
    Py_CLEAR(self->key);
    Py_CLEAR(self->plain);
    return 0;
}

static void hooks_dealloc(StepHooks *self) {
    PyObject_GC_UnTrack(self);
    hooks_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int hooks_init(StepHooks *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"tracker", "variable", "key", "plain", NULL};
    PyObject *tracker, *variable, *key, *plain;
    if (hooks_names() < 0) return -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO", names, &tracker, &variable, &key, &plain)) return -1;
    if (!PyContextVar_CheckExact(variable)) {
        PyErr_SetString(PyExc_TypeError, "StepHooks: variable must be a contextvars.ContextVar");
        return -1;
    }
    Py_XSETREF(self->tracker, Py_NewRef(tracker));
    Py_XSETREF(self->variable, Py_NewRef(variable));
    Py_XSETREF(self->key, Py_NewRef(key));
    Py_XSETREF(self->plain, Py_NewRef(plain));
    return 0;
}

/* The error in flight goes to tracker._hook_failed(name, error); nothing is raised. Returns None. */
static PyObject *hooks_failed(StepHooks *self, const char *hook) {
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    PyErr_NormalizeException(&type, &error, &traceback);
    if (traceback != NULL && error != NULL) PyException_SetTraceback(error, traceback);
    PyObject *name = PyUnicode_FromString(hook);
    PyObject *result = name == NULL ? NULL : PyObject_CallMethodObjArgs(self->tracker, s_hook_failed, name,
                                                                         error == NULL ? Py_None : error, NULL);
    Py_XDECREF(name);
    Py_XDECREF(result);
    PyErr_Clear(); /* even the report failing must not reach the loop */
    Py_XDECREF(type);
    Py_XDECREF(error);
    Py_XDECREF(traceback);
    Py_RETURN_NONE;
}

/* 1 when a step is open and this thread owns it, 0 when not, -1 with an exception. */
static int hooks_step_here(StepHooks *self) {
    PyObject *step = PyObject_GetAttr(self->tracker, s_step);
    if (step == NULL) return -1;
    int open = step != Py_None;
    Py_DECREF(step);
    if (!open) return 0;
    PyObject *owner = PyObject_GetAttr(self->tracker, s_owner);
    if (owner == NULL) return -1;
    int here = 0;
    if (PyLong_CheckExact(owner)) {
        unsigned long value = PyLong_AsUnsignedLong(owner);
        if (value == (unsigned long)-1 && PyErr_Occurred()) PyErr_Clear();
        else here = value == PyThread_get_thread_ident();
    }
    Py_DECREF(owner);
    return here;
}

static int hooks_suppressed(StepHooks *self) {
    Gate probe; /* gate_suppressed reads these three fields only */
    probe.variable = self->variable, probe.key = self->key, probe.plain = self->plain;
    return gate_suppressed(&probe);
}

static PyObject *hooks_backward_end(StepHooks *self, PyObject *unused) {
    (void)unused;
    int here = hooks_step_here(self);
    if (here < 0) return hooks_failed(self, "backward_end");
    if (!here) Py_RETURN_NONE;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    PyObject *when = PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    PyObject *ends = when == NULL ? NULL : PyObject_GetAttr(self->tracker, s_backward_ends);
    int failed = ends == NULL;
    if (!failed && PyList_CheckExact(ends)) {
        failed = PyList_Append(ends, when) < 0;
    } else if (!failed) {
        PyObject *appended = PyObject_CallMethod(ends, "append", "O", when);
        failed = appended == NULL;
        Py_XDECREF(appended);
    }
    Py_XDECREF(ends);
    Py_XDECREF(when);
    if (failed) return hooks_failed(self, "backward_end");
    Py_RETURN_NONE;
}

static PyObject *hooks_optimizer_pre(StepHooks *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1) return hooks_failed(self, "optimizer_pre");
    PyObject *calls = NULL, *more = NULL, *key = NULL, *nested = NULL, *depth = NULL, *deeper = NULL;
    PyObject *claim = NULL, *step = NULL, *result = NULL;
    int ok = 0;
    /* self.optimizer_calls += 1 */
    if ((calls = PyObject_GetAttr(self->tracker, s_optimizer_calls)) == NULL) goto done;
    if ((more = PyNumber_Add(calls, one)) == NULL) goto done;
    if (PyObject_SetAttr(self->tracker, s_optimizer_calls, more) < 0) goto done;
    /* self._nested[id(optimizer)] = self._nested.get(key, 0) + 1: only the outermost of nested step()s counts */
    if ((key = PyLong_FromVoidPtr(args[0])) == NULL) goto done;
    if ((nested = PyObject_GetAttr(self->tracker, s_nested)) == NULL || !PyDict_CheckExact(nested)) {
        if (nested != NULL) PyErr_SetString(PyExc_TypeError, "_nested is not a dict");
        goto done;
    }
    depth = Py_XNewRef(PyDict_GetItemWithError(nested, key));
    if (depth == NULL && PyErr_Occurred()) goto done;
    if ((deeper = depth == NULL ? PyLong_FromLong(1) : PyNumber_Add(depth, one)) == NULL) goto done;
    if (PyDict_SetItem(nested, key, deeper) < 0) goto done;
    if ((claim = PyObject_GetAttr(self->tracker, s_claim)) == NULL) goto done;
    if (claim != Py_None) {
        if ((result = PyObject_CallMethodNoArgs(self->tracker, s_claim_if_dormant)) == NULL) goto done;
        Py_CLEAR(result);
    }
    if ((step = PyObject_GetAttr(self->tracker, s_step)) == NULL) goto done;
    if (step == Py_None) { /* no step open: the rest is Python's (suppression, ownership, opening one) */
        if ((result = PyObject_CallMethodNoArgs(self->tracker, s_pre_opening)) == NULL) goto done;
        Py_CLEAR(result);
    }
    ok = 1;
done:
    Py_XDECREF(calls), Py_XDECREF(more), Py_XDECREF(key), Py_XDECREF(nested), Py_XDECREF(depth);
    Py_XDECREF(deeper), Py_XDECREF(claim), Py_XDECREF(step);
    if (!ok) return hooks_failed(self, "optimizer_pre");
    Py_RETURN_NONE;
}

static PyObject *hooks_optimizer_post(StepHooks *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1) return hooks_failed(self, "optimizer_post");
    PyObject *key = NULL, *nested = NULL, *depth = NULL, *result = NULL;
    int ok = 0;
    if ((key = PyLong_FromVoidPtr(args[0])) == NULL) goto done;
    if ((nested = PyObject_GetAttr(self->tracker, s_nested)) == NULL || !PyDict_CheckExact(nested)) {
        if (nested != NULL) PyErr_SetString(PyExc_TypeError, "_nested is not a dict");
        goto done;
    }
    /* depth = self._nested.pop(key, 1) - 1; deeper: the inner step() of a subclass's super().step() */
    depth = Py_XNewRef(PyDict_GetItemWithError(nested, key));
    if (depth == NULL && PyErr_Occurred()) goto done;
    if (depth != NULL) {
        if (PyDict_DelItem(nested, key) < 0) goto done;
        long value = PyLong_AsLong(depth);
        if (value == -1 && PyErr_Occurred()) goto done;
        if (value - 1 > 0) {
            PyObject *less = PyLong_FromLong(value - 1);
            if (less == NULL || PyDict_SetItem(nested, key, less) < 0) {
                Py_XDECREF(less);
                goto done;
            }
            Py_DECREF(less);
            ok = 1;
            goto done;
        }
    }
    int here = hooks_step_here(self);
    if (here < 0) goto done;
    if (here) { /* the usual case: the step this thread has open */
        int suppressed = hooks_suppressed(self);
        if (suppressed < 0) goto done;
        if (!suppressed) {
            result = PyObject_CallMethodObjArgs(self->tracker, s_stepped_once, args[0], Py_False, NULL);
            if (result == NULL) goto done;
        }
    } else if ((result = PyObject_CallMethodOneArg(self->tracker, s_post_rest, args[0])) == NULL) {
        goto done;
    }
    ok = 1;
done:
    Py_XDECREF(key), Py_XDECREF(nested), Py_XDECREF(depth), Py_XDECREF(result);
    if (!ok) return hooks_failed(self, "optimizer_post");
    Py_RETURN_NONE;
}

static PyMethodDef hooks_methods[] = {
    {"backward_end", (PyCFunction)hooks_backward_end, METH_NOARGS, "After the backward pass: its end time."},
    {"optimizer_pre", (PyCFunction)(void (*)(void))hooks_optimizer_pre, METH_FASTCALL,
     "torch's optimizer step pre-hook: (optimizer, args, kwargs)"},
    {"optimizer_post", (PyCFunction)(void (*)(void))hooks_optimizer_post, METH_FASTCALL,
     "torch's optimizer step post-hook: (optimizer, args, kwargs)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject StepHooksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.StepHooks",
    .tp_basicsize = sizeof(StepHooks),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "StepHooks(tracker, variable, key, plain): the step tracker's backward_end, optimizer_pre and "
              "optimizer_post in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)hooks_init,
    .tp_dealloc = (destructor)hooks_dealloc,
    .tp_traverse = (traverseproc)hooks_traverse,
    .tp_clear = (inquiry)hooks_clear,
    .tp_methods = hooks_methods,
};

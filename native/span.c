/* The offloaded span in C: its storage, its begin (RingCore.begin_span) and its end (SpanCore.end).
 *
 * Why: in the training process an offloaded span was a Python object of fourteen slots, a SpanContext made by
 * its Python __new__, a tracer method that took the parent apart attribute by attribute, and an end() that
 * took a lock and looked the ring up: about 3 µs a span before its two record writes (bench/bench_events.py).
 * Here begin_span() writes the begin record and builds the context and the span in one call, and end() writes
 * the end record when nothing but attributes was added since (the common case: a step, a data wait).
 * Everything else stays in Python (pipeline/record_tracer.py): the span class is a Python subclass of SpanCore
 * and the API's Span, whose methods read and write these fields as they read slots; an end that carries
 * events, a status, links or a new name is handed to its Python method _end_record (the marshal record).
 *
 * Nothing here runs Python code between the checks and the ring write (exact types only, no __index__, no
 * __len__), so the values cannot change under it; anything not exactly what the tracer passes returns None,
 * and the caller takes its Python path, which carries anything.
 */
#include "binding.h"

#include <stddef.h>
#include <structmember.h>

/* The Python class's fields, by the names its methods use (record_span.RecordSpan): one list, which the struct,
 * the member table, tp_traverse and tp_clear all expand, so none of them can miss a field.
 * X(member, Python name, doc) */
#define SPAN_FIELDS(X)                                                                                        \
    X(provider, "_provider", "The RecordTracerProvider (its emit() writes a refused record).")              \
    X(context, "_context", "The span's SpanContext.")                                                       \
    X(parent, "parent", "The parent's SpanContext, or None for a root.")                                    \
    X(name, "name", NULL)                                                                                   \
    X(start_time, "start_time", NULL)                                                                       \
    X(end_time, "end_time", "None while recording.")                                                        \
    X(kind, "kind", NULL)                                                                                   \
    X(attributes, "_attributes", "As begun.")                                                               \
    X(updates, "_updates", "Attributes set since (None: none).")                                            \
    X(events, "_events", NULL)                                                                              \
    X(status, "_status", NULL)                                                                              \
    X(renamed, "_renamed", NULL)                                                                            \
    X(links, "_links", NULL)                                                                                \
    X(on_exception, "_on_exception", "(record_exception, set_status_on_exception).")

typedef struct {
    PyObject_HEAD
#define DECLARE(member, python_name, doc) PyObject *member;
    SPAN_FIELDS(DECLARE)
#undef DECLARE
    RingCore *core;   /* the ring its fast end record goes to; NULL when made in Python (then _end_record) */
    uint64_t span_id; /* valid with core */
} SpanCore;

static PyMemberDef span_members[] = {
#define MEMBER(member, python_name, doc) {python_name, T_OBJECT, offsetof(SpanCore, member), 0, doc},
    SPAN_FIELDS(MEMBER)
#undef MEMBER
    {NULL, 0, 0, 0, NULL},
};

static int span_traverse(SpanCore *self, visitproc visit, void *arg) {
#define VISIT(member, python_name, doc) Py_VISIT(self->member);
    SPAN_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int span_clear(SpanCore *self) {
#define CLEAR(member, python_name, doc) Py_CLEAR(self->member);
    SPAN_FIELDS(CLEAR)
#undef CLEAR
    Py_CLEAR(self->core);
    return 0;
}

static void span_dealloc(SpanCore *self) {
    PyObject_GC_UnTrack(self);
    span_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int absent(PyObject *value) { return value == NULL || value == Py_None; }

/* end(end_time=None): as RecordSpan.end. Once: the first end sets end_time, later ones do nothing. */
static PyObject *span_end(SpanCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + keywords > 1 ||
        (keywords == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "end_time") != 0)) {
        PyErr_SetString(PyExc_TypeError, "end() takes one optional argument, end_time");
        return NULL;
    }
    PyObject *given = nargs + keywords == 1 ? args[0] : Py_None;
    if (!absent(self->end_time)) Py_RETURN_NONE;
    int64_t when = 0;
    int fast = self->core != NULL;
    PyObject *when_object;
    if (given == Py_None) {
        when = ot_now_ns();
        when_object = PyLong_FromLongLong(when);
        if (when_object == NULL) return NULL;
    } else {
        when_object = Py_NewRef(given);
        int overflow = 0;
        when = PyLong_CheckExact(given) ? PyLong_AsLongLongAndOverflow(given, &overflow) : -1;
        if (when < 0 || overflow) fast = 0; /* not a plain time: the marshal record carries it as it is */
        PyErr_Clear();
    }
    Py_XSETREF(self->end_time, when_object);
    if (fast && absent(self->events) && absent(self->status) && absent(self->links) && self->renamed != Py_True) {
        ot_record record;
        record.type = OT_RECORD_END;
        record.span_id = self->span_id;
        record.time = when;
        if (ot_py_attributes_of(self->updates == NULL ? Py_None : self->updates, &record) == 0 &&
            ot_py_fast_allowed(self->core)) {
            PyObject *refused = ot_py_write_record(self->core, &record);
            if (refused == Py_None) return refused;
            if (refused != NULL) { /* the ring was full: the provider waits or drops, as for any record */
                PyObject *result = PyObject_CallMethod(self->provider, "emit", "OO", refused, Py_False);
                Py_DECREF(refused);
                if (result == NULL) return NULL;
                Py_DECREF(result);
                Py_RETURN_NONE;
            }
            if (PyErr_Occurred()) return NULL;
        }
    }
    return PyObject_CallMethod((PyObject *)self, "_end_record", "O", self->end_time);
}

/* set_attributes(attributes): as RecordSpan.set_attributes (kept in ``_updates`` while recording; the drain
 * checks the values). In C because a step sets its counts on every span it ends. */
static PyObject *span_set_attributes(SpanCore *self, PyObject *attributes) {
    if (!absent(self->end_time) || attributes == Py_None) Py_RETURN_NONE;
    int truth = PyObject_IsTrue(attributes);
    if (truth < 0) return NULL;
    if (truth == 0) Py_RETURN_NONE;
    if (self->updates == NULL || self->updates == Py_None) {
        PyObject *fresh = PyDict_New();
        if (fresh == NULL) return NULL;
        Py_XSETREF(self->updates, fresh);
    }
    if (!PyDict_CheckExact(self->updates)) return PyObject_CallMethod(self->updates, "update", "O", attributes);
    if (PyDict_CheckExact(attributes)) {
        if (PyDict_Update(self->updates, attributes) < 0) return NULL;
        Py_RETURN_NONE;
    }
    return PyObject_CallMethod(self->updates, "update", "O", attributes); /* a Mapping, or pairs: dict.update's */
}

static PyObject *span_get_span_context(SpanCore *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self->context == NULL ? Py_None : self->context);
}

static PyObject *span_is_recording(SpanCore *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(absent(self->end_time));
}

static PyMethodDef span_methods[] = {
    {"end", (PyCFunction)(void (*)(void))span_end, METH_FASTCALL | METH_KEYWORDS,
     "end(end_time=None): end the span (once); its end record goes to the ring"},
    {"get_span_context", (PyCFunction)span_get_span_context, METH_NOARGS, NULL},
    {"set_attributes", (PyCFunction)span_set_attributes, METH_O, "set_attributes(attributes): kept while recording"},
    {"is_recording", (PyCFunction)span_is_recording, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SpanCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.SpanCore",
    .tp_basicsize = sizeof(SpanCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The storage and hot calls of an offloaded span (record_tracer.py subclasses it).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)span_traverse,
    .tp_clear = (inquiry)span_clear,
    .tp_dealloc = (destructor)span_dealloc,
    .tp_methods = span_methods,
    .tp_members = span_members,
};

/* The class begin_span() makes (the latest span_setup's: one per SpanCore, record_span.native_span_class), held:
 * step_span.c ends spans of exactly this class in C. */
static PyObject *made_type;

int ot_span_native(PyObject *span) {
    /* the class's end and set_attributes still the C core's (a wrapper put on one is honoured: the Python path),
     * checked once per version of the class */
    static PyTypeObject *checked;
    static unsigned int tag;
    static int verdict;
    PyTypeObject *type = Py_TYPE(span);
    if (made_type == NULL || (PyObject *)type != made_type) return 0;
    if (type == checked && tag != 0 && ot_version_tag(type) == tag) return verdict;
    static PyObject *end_name, *set_name;
    if (end_name == NULL && (end_name = PyUnicode_InternFromString("end")) == NULL) return PyErr_Clear(), 0;
    if (set_name == NULL && (set_name = PyUnicode_InternFromString("set_attributes")) == NULL) return PyErr_Clear(), 0;
    PyObject *own_end = PyDict_GetItemWithError(SpanCoreType.tp_dict, end_name);
    PyObject *own_set = own_end == NULL ? NULL : PyDict_GetItemWithError(SpanCoreType.tp_dict, set_name);
    PyErr_Clear();
    verdict = own_set != NULL && _PyType_Lookup(type, end_name) == own_end && _PyType_Lookup(type, set_name) == own_set;
    Py_INCREF(type);
    Py_XSETREF(checked, type);
    tag = ot_version_tag(type);
    return verdict;
}

PyObject *ot_span_context_of(PyObject *span) { return ((SpanCore *)span)->context; }

PyObject *ot_span_parent_of(PyObject *span) { return ((SpanCore *)span)->parent; }

int ot_span_finish(PyObject *span, PyObject *attributes) {
    int truth = attributes == NULL ? 0 : PyObject_IsTrue(attributes);
    if (truth < 0) return -1;
    PyObject *result = truth ? span_set_attributes((SpanCore *)span, attributes) : Py_NewRef(Py_None);
    if (result == NULL) return -1;
    Py_DECREF(result);
    if ((result = span_end((SpanCore *)span, NULL, 0, NULL)) == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

/* span_setup(span_type, context_type, trace_state, root_flags, child_flags) */
PyObject *ot_py_span_setup(RingCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &SpanCoreType) ||
        !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "span_setup(span_type, context_type, trace_state, root_flags, child_flags): a SpanCore "
                        "subclass and a tuple subclass first");
        return NULL;
    }
    Py_XSETREF(self->span_type, Py_NewRef(args[0]));
    Py_XSETREF(made_type, Py_NewRef(args[0]));
    Py_XSETREF(self->context_type, Py_NewRef(args[1]));
    Py_XSETREF(self->trace_state, Py_NewRef(args[2]));
    Py_XSETREF(self->root_flags, Py_NewRef(args[3]));
    Py_XSETREF(self->child_flags, Py_NewRef(args[4]));
    Py_RETURN_NONE;
}

void ot_py_span_release(RingCore *self) {
    Py_CLEAR(self->span_type);
    Py_CLEAR(self->context_type);
    Py_CLEAR(self->trace_state);
    Py_CLEAR(self->root_flags);
    Py_CLEAR(self->child_flags);
}

/* A SpanContext(trace_id, span_id, False, flags, trace_state), valid by construction, made as its __new__
 * makes it (tuple.__new__ of the class), without its range checks. */
static PyObject *make_context(RingCore *self, PyObject *trace_id, uint64_t span_id, PyObject *flags) {
    PyObject *span_id_object = PyLong_FromUnsignedLongLong(span_id);
    if (span_id_object == NULL) return NULL;
    PyObject *items = PyTuple_Pack(6, trace_id, span_id_object, Py_False, flags, self->trace_state, Py_True);
    Py_DECREF(span_id_object);
    if (items == NULL) return NULL;
    PyObject *wrapped = PyTuple_Pack(1, items);
    Py_DECREF(items);
    if (wrapped == NULL) return NULL;
    PyObject *context = PyTuple_Type.tp_new((PyTypeObject *)self->context_type, wrapped, NULL);
    Py_DECREF(wrapped);
    return context;
}

/* begin_span(provider, name, kind, kind_value, attributes, scope, parent, start, on_exception) -> the span,
 * its begin record written (or handed to provider.emit when the ring is full), or None when it cannot be a
 * fast record: no span_setup yet, the drain does not read them, the ring is closed, a parent with a trace state
 * or not sampled, a value not exactly what the tracer passes. parent: the parent's SpanContext (an invalid one
 * or None: a new root); start: None for now. */
PyObject *ot_py_begin_span(RingCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "begin_span() takes nine arguments");
        return NULL;
    }
    if (self->span_type == NULL) Py_RETURN_NONE;
    ot_record record;
    record.type = OT_RECORD_BEGIN;
    uint64_t kind, scope, parent_flags = 0;
    int64_t start;
    if (ot_py_exact_u64(args[3], 0, 255, &kind) || ot_py_exact_u64(args[5], 0, UINT32_MAX, &scope) ||
        ot_py_utf8_of(args[1], &record.name))
        Py_RETURN_NONE;
    if (args[7] == Py_None)
        start = ot_now_ns();
    else if (ot_py_exact_time(args[7], &start) || start < 0)
        Py_RETURN_NONE;
    PyObject *parent = args[6], *trace_id = NULL;
    if (parent != Py_None) {
        if (Py_TYPE(parent) != (PyTypeObject *)self->context_type || PyTuple_GET_SIZE(parent) != 6)
            Py_RETURN_NONE;
        if (PyTuple_GET_ITEM(parent, 5) != Py_True) parent = Py_None; /* invalid: a new root, as the SDK's */
    }
    record.parent_id = 0, record.remote = 0;
    if (parent != Py_None) {
        PyObject *remote = PyTuple_GET_ITEM(parent, 2);
        if (PyTuple_GET_ITEM(parent, 4) != self->trace_state || (remote != Py_True && remote != Py_False) ||
            ot_py_exact_u64(PyTuple_GET_ITEM(parent, 3), 0, 255, &parent_flags) || !(parent_flags & 1) ||
            ot_py_exact_u64(PyTuple_GET_ITEM(parent, 1), 1, UINT64_MAX, &record.parent_id))
            Py_RETURN_NONE; /* a trace state, or an unsampled parent (a non-recording span): the Python path */
        trace_id = PyTuple_GET_ITEM(parent, 0);
        if (ot_py_split_trace_id(self, trace_id, &record)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        record.remote = remote == Py_True;
    }
    if (ot_py_attributes_of(args[4], &record) || !ot_py_fast_allowed(self)) Py_RETURN_NONE;
    /* A root's flags: sampled, random trace id (ours are); a child keeps its parent's random-trace-id bit. */
    int random_trace = parent == Py_None || (parent_flags & 2);
    record.kind = (uint8_t)kind, record.scope = (uint32_t)scope;
    record.flags = random_trace ? 3 : 1, record.parent_flags = (uint8_t)parent_flags;
    if (parent == Py_None) record.trace_id_high = ot_random_id(), record.trace_id_low = ot_random_id();
    record.span_id = ot_random_id();
    record.time = start;
    PyObject *refused = ot_py_write_record(self, &record);
    if (refused == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE; /* not encodable (too big): the marshal record */
    }
    PyObject *trace_id_value =
        parent == Py_None ? ot_py_trace_id_object(record.trace_id_high, record.trace_id_low) : Py_NewRef(trace_id);
    PyObject *context = NULL, *start_object = NULL;
    SpanCore *span = NULL;
    if (trace_id_value == NULL ||
        (context = make_context(self, trace_id_value, record.span_id,
                                random_trace ? self->root_flags : self->child_flags)) == NULL ||
        (start_object = PyLong_FromLongLong(start)) == NULL ||
        (span = (SpanCore *)((PyTypeObject *)self->span_type)->tp_alloc((PyTypeObject *)self->span_type, 0)) ==
            NULL)
        goto failed;
    span->provider = Py_NewRef(args[0]), span->context = context, span->parent = Py_NewRef(parent);
    span->name = Py_NewRef(args[1]), span->start_time = start_object, span->end_time = Py_NewRef(Py_None);
    span->kind = Py_NewRef(args[2]), span->attributes = Py_NewRef(args[4]), span->updates = Py_NewRef(Py_None);
    span->events = Py_NewRef(Py_None), span->status = Py_NewRef(Py_None), span->renamed = Py_NewRef(Py_False);
    span->links = Py_NewRef(Py_None), span->on_exception = Py_NewRef(args[8]);
    span->core = (RingCore *)Py_NewRef((PyObject *)self), span->span_id = record.span_id;
    Py_DECREF(trace_id_value);
    if (refused != Py_None) { /* the ring was full: the provider waits or drops, as for any record */
        PyObject *result = PyObject_CallMethod(args[0], "emit", "OO", refused, Py_True);
        Py_DECREF(refused);
        if (result == NULL) {
            Py_DECREF(span);
            return NULL;
        }
        Py_DECREF(result);
    } else {
        Py_DECREF(refused);
    }
    return (PyObject *)span;
failed:
    Py_XDECREF(trace_id_value), Py_XDECREF(context), Py_XDECREF(start_object), Py_DECREF(refused);
    return NULL;
}

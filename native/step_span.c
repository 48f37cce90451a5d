/* The torch tracker's step span begun and ended in C: the usual case of StepDuration.begin_detached (with
 * Duration._begin and EventsRuntime.admit inline) and of Duration.end, for the steps StepCore's _open and _close
 * make (steps.c).
 *
 * Why: once the tracker's hooks, the step's making and its close were C, a step's remaining Python was these four
 * methods, about 230 bytecodes in four frames around the C span's begin and end (docs/offload.md). What they read
 * is the step's, the loop span's, the runtime's and the pending values' own fields; read through PyObject_GetAttr
 * from C they would cost what the bytecode does, so every class involved keeps them in __slots__ and slots.c
 * reads them at a field's cost.
 *
 * Only the usual case is here: no device timeline (none in use, or turned off, and no probe due), a parent span
 * of the C core's class with no trace segment, its trace within budget and already counted, the offloaded
 * tracer, no device values waiting, a step never begun or never made current, and classes that still resolve the
 * Python methods this shortcuts (a user's wrapper is honoured). Anything else returns 0 before any change, and
 * the caller runs the Python method, which is also the pure-Python fallback: one behaviour, written once in
 * Python; C is its shortcut. What C holds while Python code may run (a finaliser, a property, the tracer's own
 * start_child where C cannot take it) it holds by a reference of its own; what it reads after such code it reads
 * again.
 */
#include "binding.h"

#include <time.h>

#define STEP_SPAN_NAMES(X)                                                                                    \
    X(SPAN, "_span") X(LATE, "_late") X(RUNTIME, "_runtime") X(ATTRIBUTES, "_attributes") X(NAME, "name")     \
    X(SEGMENT, "_segment") X(DEVICE_STEP, "device_step") X(ENDED, "_ended") X(DEVICE, "device")               \
    X(PROBE_AT, "device_probe_at") X(TRACES, "_traces") X(MAX_SPANS, "max_spans") X(MAX_AGE, "max_age_s")    \
    X(START_CHILD, "start_child") X(VALUES, "values") X(ITEMS, "items") X(CONVERTING, "converting")          \
    X(FORGET, "forget") X(PROVIDER, "_provider") X(SCOPE, "_scope") X(BEGIN_SPAN, "begin_span")                  \
    X(LINEAGE, "lineage") X(STAMP, "stamp") X(BEGIN_DETACHED, "begin_detached") X(BEGIN, "_begin") X(END, "end")   \
    X(ADMIT, "admit")

enum {
#define ENUMERATE(symbol, text) symbol,
    STEP_SPAN_NAMES(ENUMERATE)
#undef ENUMERATE
    NAME_COUNT
};
static PyObject *names[NAME_COUNT];
static PyObject *one; /* the int 1 (a trace's count) */

/* A name and its cache in one of the arrays below: a cache serves one name (slots.c looks a name it was not
 * filled for up again). */
#define AT(caches, name) names[name], &(caches)[name]

/* One cache per name and role: the step (a StepDuration), the loop's span it begins under (a Duration), the
 * runtime (EventsRuntime) and its pending values (PendingValues). */
static ot_slot step_slots[NAME_COUNT], under_slots[NAME_COUNT], runtime_slots[NAME_COUNT], values_slots[NAME_COUNT];
/* ...and the offloaded tracer (RecordTracer), its provider and the provider's lineage. */
static ot_slot tracer_slots[NAME_COUNT], provider_slots[NAME_COUNT], lineage_slots[NAME_COUNT];

/* record_tracer.RecordTracer.start_child (the function), SpanKind.INTERNAL and the usual on_exception, held
 * (child_setup()); NULL until then: the tracer's start_child is called. */
static PyObject *child_function, *internal_kind, *on_exception, *zero;

/* What span_kinds.py registers (step_span_setup()), held; NULL until then: every begin and end is Python's.
 * current: duration.py's ContextVar of the current Duration (a step ended while current is Python's to end);
 * the Python methods this file shortcuts, each compared with what the object's class resolves now (a wrapper a
 * user put on one, or a subclass's override, is honoured: the Python path runs); and the two functions that
 * log a contained error as the Python methods log it (one message, one log_once key, either path). */
static PyObject *current_duration, *begin_detached_function, *begin_function, *end_function, *admit_function,
    *begin_failed, *end_failed;

/* The steps begun and ended here, and the errors contained here (the tests' view: _step_span_counts()). */
static unsigned long long begun_here, ended_here, contained_here;

int ot_step_span_init(void) {
    static const char *const texts[NAME_COUNT] = {
#define TEXT(symbol, text) text,
        STEP_SPAN_NAMES(TEXT)
#undef TEXT
    };
    if (ot_intern_names(texts, names, NAME_COUNT) < 0) return -1;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return -1;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) return -1;
    return 0;
}

/* step_span_setup(current, begin_detached, begin, end, admit, begin_failed, end_failed): see above. */
PyObject *ot_py_step_span_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7 || !PyContextVar_CheckExact(args[0]) || !PyFunction_Check(args[1]) || !PyFunction_Check(args[2]) ||
        !PyFunction_Check(args[3]) || !PyFunction_Check(args[4]) || !PyCallable_Check(args[5]) ||
        !PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "step_span_setup(current, begin_detached, begin, end, admit, begin_failed, "
                                         "end_failed): a ContextVar, four functions, two callables");
        return NULL;
    }
    PyObject **fields[7] = {&current_duration, &begin_detached_function, &begin_function, &end_function,
                            &admit_function, &begin_failed, &end_failed};
    for (int index = 0; index < 7; index++) Py_XSETREF(*fields[index], Py_NewRef(args[index]));
    Py_RETURN_NONE;
}

/* _step_span_counts() -> (begun, ended, contained): the steps this file began and ended itself, and the errors
 * it contained, for the tests. */
PyObject *ot_py_step_span_counts(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return Py_BuildValue("(KKK)", begun_here, ended_here, contained_here);
}

/* Whether object's class resolves each name to the function registered for it: checked once per class and
 * version (a class changed since, a method wrapped or restored, is checked again). The cache holds the class. */
typedef struct {
    PyTypeObject *type;
    unsigned int tag;
    int verdict;
} ot_checked;

static int resolves_to(PyObject *object, ot_checked *cache, int count, const int *which, PyObject *const *expected) {
    PyTypeObject *type = Py_TYPE(object);
    if (type == cache->type && cache->tag != 0 && ot_version_tag(type) == cache->tag) return cache->verdict;
    int verdict = 1;
    for (int index = 0; index < count && verdict; index++)
        verdict = expected[index] != NULL && _PyType_Lookup(type, names[which[index]]) == expected[index];
    Py_INCREF(type);
    Py_XSETREF(cache->type, type);
    cache->tag = ot_version_tag(type); /* after the lookups, which give the class a tag */
    cache->verdict = verdict;
    return verdict;
}

/* A contained error (an Exception) logged by ``logger`` as the Python method logs it, with its traceback
 * (helpers.c); 0, or -1 with anything else (KeyboardInterrupt) still set. */
static int contain(PyObject *logger) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    contained_here++;
    return ot_log_handled(logger, NULL, 0);
}

/* child_setup(start_child, kind, on_exception): record_tracer.py's RecordTracer.start_child, the SpanKind its
 * spans are begun with and their on_exception, as that method passes them to the C core's begin_span. */
PyObject *ot_py_child_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyFunction_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "child_setup(start_child, kind, on_exception): a function first");
        return NULL;
    }
    Py_XSETREF(child_function, Py_NewRef(args[0]));
    Py_XSETREF(internal_kind, Py_NewRef(args[1]));
    Py_XSETREF(on_exception, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* time.monotonic() (CLOCK_MONOTONIC on Linux, where this runs; elsewhere the Python path), in seconds. */
static int monotonic(double *now) {
#ifdef __linux__
    struct timespec spec;
    if (clock_gettime(CLOCK_MONOTONIC, &spec) != 0) return -1;
    *now = (double)spec.tv_sec + (double)spec.tv_nsec * 1e-9;
    return 0;
#else
    (void)now;
    return -1;
#endif
}

/* A number as a double: exact floats and ints only (no Python code). */
static int number_of(PyObject *value, double *out) {
    if (value == NULL) return -1;
    if (PyFloat_CheckExact(value)) {
        *out = PyFloat_AS_DOUBLE(value);
        return 0;
    }
    if (PyLong_CheckExact(value)) {
        *out = PyLong_AsDouble(value);
        if (*out == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        return 0;
    }
    return -1;
}

/* An emptiness C can tell without Python code: 1 empty, 0 not, -1 not a tuple, list or dict. */
static int empty(PyObject *value) {
    if (value == NULL) return -1;
    if (PyTuple_CheckExact(value)) return PyTuple_GET_SIZE(value) == 0;
    if (PyList_CheckExact(value)) return PyList_GET_SIZE(value) == 0;
    if (PyDict_CheckExact(value)) return PyDict_GET_SIZE(value) == 0;
    return -1;
}

/* Whether a runtime's pending values wait for nothing a step's begin (items) or end (and converting) must see:
 * 1 nothing (or no values), 0 something, or not a plain container (the Python path). */
static int values_idle(PyObject *rt, int at_end) {
    PyObject *values = ot_slot_read(rt, AT(runtime_slots, VALUES));
    if (values == NULL) return 0;
    int idle = values == Py_None;
    if (!idle) {
        PyObject *items = ot_slot_read(values, AT(values_slots, ITEMS));
        idle = empty(items) == 1;
        Py_XDECREF(items);
        if (idle && at_end) {
            PyObject *converting = ot_slot_read(values, AT(values_slots, CONVERTING));
            idle = empty(converting) == 1;
            Py_XDECREF(converting);
        }
    }
    Py_DECREF(values);
    return idle;
}

/* RecordTracer.start_child(name, current, attributes) for a C span parent (its context, held, given), in C: 1 with the span in *made, 0 when
 * it is not that method or not its usual case (no lineage stamp; the begin record written: begin_span did not
 * decline), nothing written; -1 with an exception. */
static int child_here(PyObject *starter, PyObject *name, PyObject *attributes, PyObject *context, PyObject **made) {
    if (child_function == NULL || !PyMethod_Check(starter) || PyMethod_GET_FUNCTION(starter) != child_function ||
        !PyDict_CheckExact(attributes))
        return 0;
    PyObject *tracer = PyMethod_GET_SELF(starter);
    PyObject *provider = ot_slot_read(tracer, AT(tracer_slots, PROVIDER));
    PyObject *scope = provider == NULL ? NULL : ot_slot_read(tracer, AT(tracer_slots, SCOPE));
    PyObject *begin = scope == NULL ? NULL : ot_slot_read(provider, AT(provider_slots, BEGIN_SPAN));
    PyObject *lineage = begin == NULL ? NULL : ot_slot_read(provider, AT(provider_slots, LINEAGE));
    PyObject *stamp = lineage == NULL || lineage == Py_None ? NULL : ot_slot_read(lineage, AT(lineage_slots, STAMP));
    int result = 0;
    if (lineage == NULL || (lineage != Py_None && empty(stamp) != 1) || !PyCFunction_Check(begin) ||
        PyCFunction_GET_FUNCTION(begin) != (PyCFunction)(void (*)(void))ot_py_begin_span ||
        PyErr_Occurred())
        goto out;
    PyObject *call[9] = {provider, name, internal_kind, zero, PyDict_GET_SIZE(attributes) ? attributes : Py_None,
                         scope, context, Py_None, on_exception}; /* context: the parent's, held by the caller */
    PyObject *span = ot_py_begin_span((RingCore *)PyCFunction_GET_SELF(begin), call, 9);
    if (span == NULL) {
        result = -1;
    } else if (span == Py_None) {
        Py_DECREF(span); /* declined, nothing written: the tracer's own method takes its other paths */
    } else {
        *made = span;
        result = 1;
    }
out:
    Py_XDECREF(provider), Py_XDECREF(scope), Py_XDECREF(begin), Py_XDECREF(lineage), Py_XDECREF(stamp);
    if (result == 0 && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    if (result == 0 && PyErr_Occurred()) result = -1;
    return result;
}

#define READS 16 /* at most this many reads a call (begin: 12, end: 6) */

int ot_step_begin(PyObject *step, PyObject *rt, PyObject *under) {
    if (under == NULL || under == Py_None || rt == NULL || rt == Py_None) return 0;
    PyObject *held[READS] = {NULL};
    int result = 0, taken = 0;
    double now, probe_at, started, max_age;
#define READ(into, object, name, caches) (held[taken++] = (into) = ot_slot_read((object), AT(caches, name)))
    PyObject *span, *late, *device, *probe, *current, *segment, *traces, *max_spans, *age, *starter, *attributes,
        *name;
    PyObject *context = NULL, *old_runtime = NULL, *old_span = NULL;
    static ot_checked step_checked, runtime_checked;
    static const int step_methods[3] = {BEGIN_DETACHED, BEGIN, END}, runtime_methods[1] = {ADMIT};
    PyObject *const step_functions[3] = {begin_detached_function, begin_function, end_function};
    Py_ssize_t span_at = ot_slot_offset(step, AT(step_slots, SPAN));
    Py_ssize_t runtime_at = ot_slot_offset(step, AT(step_slots, RUNTIME));
    if (span_at == 0 || runtime_at == 0 || monotonic(&now) < 0 ||
        !resolves_to(step, &step_checked, 3, step_methods, step_functions) ||
        !resolves_to(rt, &runtime_checked, 1, runtime_methods, &admit_function))
        goto out;
    /* Every read first (a class without slots is read through PyObject_GetAttr, which may run Python code)... */
    if (READ(span, step, SPAN, step_slots) != Py_None || READ(late, step, LATE, step_slots) != Py_None ||
        READ(attributes, step, ATTRIBUTES, step_slots) == NULL || READ(name, step, NAME, step_slots) == NULL)
        goto out;
    /* begin_detached's device check: none in use and no probe due, or turned off (False) */
    if (READ(device, rt, DEVICE, runtime_slots) == Py_None) {
        if (number_of(READ(probe, rt, PROBE_AT, runtime_slots), &probe_at) < 0 || now >= probe_at) goto out;
    } else if (device != Py_False) {
        goto out;
    }
    if (READ(traces, rt, TRACES, runtime_slots) == NULL || !PyDict_CheckExact(traces) ||
        READ(max_spans, rt, MAX_SPANS, runtime_slots) == NULL || !PyLong_CheckExact(max_spans) ||
        number_of(READ(age, rt, MAX_AGE, runtime_slots), &max_age) < 0 ||
        READ(starter, rt, START_CHILD, runtime_slots) == NULL || starter == Py_None || values_idle(rt, 0) != 1)
        goto out;
    /* _begin under the loop's span: its span, no trace segment (a rolled trace is Python's) */
    if ((READ(current, under, SPAN, under_slots)) == NULL || !ot_span_native(current) ||
        READ(segment, under, SEGMENT, under_slots) != Py_None)
        goto out;
    /* ...then what no Python code may change in between: the parent's trace and its budget (admit()). The trace
     * is counted before (its first span is Python's) and within budget. */
    context = ot_span_context_of(current);
    if (context == NULL || !PyTuple_Check(context) || PyTuple_GET_SIZE(context) < 1 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(context, 0))) {
        context = NULL;
        goto out;
    }
    Py_INCREF(context); /* held: Python code below (a finaliser, a property) may rebind the parent's */
    PyObject *entry = PyDict_GetItemWithError(traces, PyTuple_GET_ITEM(context, 0)); /* an int key: no Python */
    if (entry == NULL || !PyList_CheckExact(entry) || PyList_GET_SIZE(entry) != 2 ||
        number_of(PyList_GET_ITEM(entry, 1), &started) < 0 || !PyLong_CheckExact(PyList_GET_ITEM(entry, 0)))
        goto out;
    PyObject *spans = PyList_GET_ITEM(entry, 0);
    int over = PyObject_RichCompareBool(spans, max_spans, Py_GE); /* exact ints: no Python code */
    if (over != 0 || now - started >= max_age) goto out;
    /* The begin: the runtime, the count, the span (the tracer's start_child, Python), as _begin does them. */
    PyObject *counted = PyNumber_Add(spans, one);
    if (counted == NULL) goto error;
    PyList_SET_ITEM(entry, 0, counted);
    Py_DECREF(spans); /* the list's old item: an int, no finaliser */
    /* the old runtime let go at the end: its finaliser, if any, runs after the begin */
    old_runtime = *(PyObject **)((char *)step + runtime_at);
    *(PyObject **)((char *)step + runtime_at) = Py_NewRef(rt);
    PyObject *made = NULL;
    int child = child_here(starter, name, attributes, context, &made);
    if (child < 0) goto error;
    if (child == 0) {
        PyObject *call[3] = {name, current, attributes};
        if ((made = PyObject_Vectorcall(starter, call, 3, NULL)) == NULL) goto error;
    }
    /* the step's class is the one checked (its layout cannot change): the slot is where it was */
    old_span = *(PyObject **)((char *)step + span_at);
    *(PyObject **)((char *)step + span_at) = made;
    begun_here++;
    result = 1;
    goto out;
error:
    /* Duration._begin's containment: an Exception is logged as it logs it; the step stays unbegun */
    result = contain(begin_failed) == 0 ? 1 : -1;
out:
    for (int index = 0; index < taken; index++) Py_XDECREF(held[index]);
#undef READ
    Py_XDECREF(context);
    Py_XDECREF(old_runtime);
    Py_XDECREF(old_span);
    if (result == 0 && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    if (result == 0 && PyErr_Occurred()) result = -1; /* KeyboardInterrupt and the like go on up */
    return result;
}

int ot_step_end(PyObject *step, PyObject *attributes) {
    static ot_checked step_checked;
    static const int step_methods[1] = {END};
    if (current_duration == NULL || !resolves_to(step, &step_checked, 1, step_methods, &end_function)) return 0;
    PyObject *trace_id = NULL;
    PyObject *held[READS] = {NULL};
    int result = 0, taken = 0;
#define READ(into, object, name, caches) (held[taken++] = (into) = ot_slot_read((object), AT(caches, name)))
    PyObject *pending, *span, *ended, *segment, *rt, *current = NULL;
    Py_ssize_t ended_at = ot_slot_offset(step, AT(step_slots, ENDED));
    if (ended_at == 0 || READ(pending, step, DEVICE_STEP, step_slots) != Py_None ||
        READ(span, step, SPAN, step_slots) == NULL || !ot_span_native(span) ||
        READ(ended, step, ENDED, step_slots) != Py_False || READ(segment, step, SEGMENT, step_slots) != Py_None ||
        READ(rt, step, RUNTIME, step_slots) == NULL)
        goto out;
    /* a step made current (begun with begin(), or ended inside its own context) is Python's: it restores it */
    if (PyContextVar_Get(current_duration, Py_None, &current) < 0) goto out;
    held[taken++] = current;
    if (current == step || (rt != Py_None && values_idle(rt, 1) != 1)) goto out;
    /* The end: ended, the step's counts set and the span ended (the C span's own calls), as Duration.end does. */
    ot_slot_write(step, ended_at, Py_True); /* its old value was False: no finaliser */
    ended_here++;
    if (ot_span_finish(span, attributes) < 0) goto error;
    PyObject *parent = ot_span_parent_of(span); /* compared only: read after the end's Python code, if any */
    if ((parent == NULL || parent == Py_None) && rt != Py_None) { /* a root: its trace's budget is let go */
        PyObject *context = ot_span_context_of(span);
        if (context == NULL || !PyTuple_Check(context) || PyTuple_GET_SIZE(context) < 1) goto error_type;
        trace_id = Py_NewRef(PyTuple_GET_ITEM(context, 0)); /* held: forget's lookup may run Python code */
        PyObject *forgotten = PyObject_CallMethodOneArg(rt, names[FORGET], trace_id);
        if (forgotten == NULL) goto error;
        Py_DECREF(forgotten);
    }
    result = 1;
    goto out;
error_type:
    PyErr_SetString(PyExc_TypeError, "a span without a SpanContext");
error:
    /* Duration.end's containment: an Exception is logged as it logs it */
    result = contain(end_failed) == 0 ? 1 : -1;
out:
    for (int index = 0; index < taken; index++) Py_XDECREF(held[index]);
    Py_XDECREF(trace_id);
#undef READ
    if (result == 0 && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    if (result == 0 && PyErr_Occurred()) result = -1;
    return result;
}

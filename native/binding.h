/* What the binding's two files (module.c: the ring and its records; span.c: the offloaded span object) share.
 * Python-facing helpers only: ring.c, records.c and device.c know nothing of Python. */
#ifndef OT_BINDING_H
#define OT_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>

#include "records.h"
#include "ring.h"

/* The header word where the drain says what it can read (bit OT_CAP_FAST_RECORDS: the records of records.h).
 * _ring.DRAIN_FIELDS["caps"] names the same word (tests/test_ring.py checks). */
#define OT_F_CAPS 280u
#define OT_CAP_FAST_RECORDS 1u

typedef struct {
    PyObject_HEAD
    Py_buffer view; /* the mapping, held until release() */
    int has_view;
    int closed;
    int has_lock;
    pthread_mutex_t write_lock; /* every append: the device resolver's thread writes without the GIL */
    ot_ring ring;
    unsigned long long ends_written; /* end records written (kind 0) */
    unsigned long long corrupt;      /* takes that found bytes that did not frame as records */
    PyObject *trace_id;              /* the last trace id a child was begun in, and its two halves */
    uint64_t trace_high, trace_low;
    /* begin_span()'s Python types and constants (span_setup(); NULL until then): the span class (a subclass
     * of SpanCore), the API's SpanContext, its empty TraceState, and the flags of a root and of a child
     * whose trace id is not random. */
    PyObject *span_type, *context_type, *trace_state, *root_flags, *child_flags;
} RingCore;

/* module.c's helpers. Each returns 0, or -1 with no exception set when the value is not one a fast record
 * carries (the caller falls back to marshal); none runs Python code. */
int ot_py_utf8_of(PyObject *text, ot_str *out);
int ot_py_attributes_of(PyObject *attributes, ot_record *record);
int ot_py_fast_allowed(RingCore *self);
int ot_py_split_trace_id(RingCore *self, PyObject *trace_id, ot_record *record);
int ot_py_exact_u64(PyObject *value, uint64_t low, uint64_t high, uint64_t *out);
int ot_py_exact_time(PyObject *value, int64_t *out);
/* Encode and append: None (new reference) when written, the payload as bytes when the full ring refused it,
 * NULL with no exception when it cannot be encoded, NULL with an exception on MemoryError. */
PyObject *ot_py_write_record(RingCore *self, const ot_record *record);
PyObject *ot_py_trace_id_object(uint64_t high, uint64_t low);

/* span.c */
extern PyTypeObject SpanCoreType;
PyObject *ot_py_span_setup(RingCore *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *ot_py_begin_span(RingCore *self, PyObject *const *args, Py_ssize_t nargs);
void ot_py_span_release(RingCore *self);
/* For step_span.c: whether span is exactly of begin_span()'s class, whose end and set_attributes are still the C
 * core's; then its context and parent (borrowed, the parent possibly NULL), and its end with attributes set first when there are any (RecordSpan's set_attributes
 * and end, in C): 0, or -1 with an exception. */
int ot_span_native(PyObject *span);
PyObject *ot_span_context_of(PyObject *span);
PyObject *ot_span_parent_of(PyObject *span);
int ot_span_finish(PyObject *span, PyObject *attributes);

/* gate.c */
extern PyTypeObject GateType; /* gate.c */
/* 1 inside suppress_instrumentation() (the context in variable holds a true value under key or plain), 0 outside,
 * -1 with an exception (gate.c). */
int ot_suppressed(PyObject *variable, PyObject *key, PyObject *plain);
extern PyTypeObject CurrentSpanType, AttachSpanType, EnabledType; /* context.c */
extern PyTypeObject PlainAttributesType;            /* attributes.c */
extern PyTypeObject StepCoreType;                  /* steps.c */

/* helpers.c: interned names (each NULL entry of names made from texts; 0, or -1 with an exception), and a pending
 * Exception logged by logger(*args) as the handled exception (its traceback), then cleared: 0; -1 with anything
 * else (KeyboardInterrupt) still pending. A logger that fails is contained. */
int ot_intern_names(const char *const *texts, PyObject **names, int count);
int ot_log_handled(PyObject *logger, PyObject *const *args, size_t nargs);

/* slots.c: another class's __slots__ at the cost of a field access. One cache per call site and class role. */
typedef struct {
    PyTypeObject *type; /* held */
    PyObject *name;     /* held: the name it was looked up for (a cache used for another is looked up again) */
    unsigned int tag;   /* its version tag when looked up (0: none, look up again) */
    Py_ssize_t offset;  /* the slot's, or 0: not a plain object slot of a class read as object reads */
} ot_slot;
/* The lookup behind ot_slot_offset when the cache does not hold this class, version and name. */
Py_ssize_t ot_slot_lookup(PyObject *object, PyObject *name, ot_slot *cache);

/* A class's version tag, 0 where it has none valid (the interpreter's own attribute caches' key). */
static inline unsigned int ot_version_tag(PyTypeObject *type) {
#if PY_VERSION_HEX >= 0x030C0000
    return type->tp_version_tag; /* a changed class's tag is 0 until a new one, never reused; 3.13 no longer sets
                                    the flag below */
#else
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
    return type->tp_version_tag;
#endif
}

/* name's offset in object (0: none), looked up once per class and version. Runs no Python code. Inline: the
 * usual case is three compares. */
static inline Py_ssize_t ot_slot_offset(PyObject *object, PyObject *name, ot_slot *cache) {
    PyTypeObject *type = Py_TYPE(object);
    if (type == cache->type && name == cache->name && cache->tag != 0 && ot_version_tag(type) == cache->tag)
        return cache->offset;
    return ot_slot_lookup(object, name, cache);
}
/* object.name as PyObject_GetAttr answers it (a new reference, or NULL with its exception), from the slot when
 * there is one. */
PyObject *ot_slot_get(PyObject *object, PyObject *name, ot_slot *cache);
/* The same, with an Exception cleared (NULL: unset or unreadable; the caller takes its Python path, which raises
 * it); anything else (KeyboardInterrupt) stays set. */
PyObject *ot_slot_read(PyObject *object, PyObject *name, ot_slot *cache);
PyObject *ot_py_slot_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs); /* the tests' hook */
/* Set the slot at offset (from ot_slot_offset on this object): 0, or -1 without one. */
int ot_slot_write(PyObject *object, Py_ssize_t offset, PyObject *value);
int ot_steps_init(void);                           /* steps.c: its interned names; -1 with an exception */

/* step_span.c: a tracker step's begin (StepDuration.begin_detached under the loop's span) and end (Duration.end,
 * with the step's counts) in C for the usual case. 1: done; 0: not the usual case, nothing changed (the caller
 * runs the Python method); -1: an exception, after the change the Python method would have made before it. */
int ot_step_span_init(void);
PyObject *ot_py_step_span_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *ot_py_step_span_counts(PyObject *module, PyObject *unused);
PyObject *ot_py_child_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int ot_step_begin(PyObject *step, PyObject *rt, PyObject *under);
int ot_step_end(PyObject *step, PyObject *attributes);

#endif

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

/* gate.c */
extern PyTypeObject GateType; /* gate.c */
/* 1 inside suppress_instrumentation() (the context in variable holds a true value under key or plain), 0 outside,
 * -1 with an exception (gate.c). */
int ot_suppressed(PyObject *variable, PyObject *key, PyObject *plain);
extern PyTypeObject CurrentSpanType, AttachSpanType, EnabledType; /* context.c */
extern PyTypeObject PlainAttributesType;            /* attributes.c */
extern PyTypeObject StepCoreType;                  /* steps.c */
int ot_steps_init(void);                           /* steps.c: its interned names; -1 with an exception */

#endif

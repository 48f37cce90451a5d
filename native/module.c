/* otel_training._native: the hot parts of the offload path in C (docs/architecture.md says why C).
 *
 * RingCore wraps ring.c over a writable buffer (the ring's mmap). Writers hold the GIL and the ring's write
 * lock across an append, so no Python code (a signal handler included) runs in the middle of one, and the
 * device resolver's thread (DevicePoller, device.c), which never takes the GIL, writes its device records
 * between them. Everything a caller may get wrong (a closed ring, a payload too big, a header offset) is a
 * return value or a Python exception, never a crash.
 */
#include "binding.h"
#include "device.h"
#include "records.h"
#include "ring.h"


static int ring_core_init(RingCore *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"buffer", "create", NULL};
    PyObject *buffer;
    int create = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p", names, &buffer, &create)) return -1;
    if (self->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "RingCore is already initialised");
        return -1;
    }
    if (!self->has_lock) {
        pthread_mutex_init(&self->write_lock, NULL);
        self->has_lock = 1;
    }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    self->has_view = 1;
    uint8_t *base = (uint8_t *)self->view.buf;
    uint64_t size = (uint64_t)self->view.len;
    if (((uintptr_t)base) % 8 != 0 ||
        (create ? ot_ring_create(&self->ring, base, size) : ot_ring_attach(&self->ring, base, size)) != 0) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        PyErr_SetString(PyExc_ValueError, "the buffer does not hold an otel-training ring");
        return -1;
    }
    return 0;
}

static void ring_core_dealloc(RingCore *self) {
    if (self->has_view) PyBuffer_Release(&self->view);
    if (self->has_lock) pthread_mutex_destroy(&self->write_lock);
    Py_CLEAR(self->trace_id);
    ot_py_span_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int usable(RingCore *self) {
    if (self->has_view) return 1;
    PyErr_SetString(PyExc_ValueError, "the ring was released");
    return 0;
}

/* append(payload, begin) -> 0 written, 1 full, 2 too big, 3 closed. begin is the writer's flag: True a span's
 * begin record, False its end (counted), None a control record. */
static PyObject *ring_core_append(RingCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append(payload, begin) takes two arguments");
        return NULL;
    }
    const char *data;
    Py_ssize_t length;
    Py_buffer other;
    int has_other = 0;
    if (PyBytes_CheckExact(args[0])) {
        data = PyBytes_AS_STRING(args[0]);
        length = PyBytes_GET_SIZE(args[0]);
    } else {
        /* May run Python code (a class's __buffer__), which may release this ring: checked after it. */
        if (PyObject_GetBuffer(args[0], &other, PyBUF_C_CONTIGUOUS) < 0) return NULL;
        has_other = 1;
        data = other.buf;
        length = other.len;
    }
    int status = 3, moved = 0;
    pthread_mutex_lock(&self->write_lock);
    if (!self->closed && self->has_view)
        status = (unsigned long long)length <= UINT32_MAX - 4
                     ? ot_ring_append(&self->ring, (const uint8_t *)data, (uint32_t)length, &moved)
                     : OT_TOO_BIG;
    pthread_mutex_unlock(&self->write_lock);
    if (has_other) PyBuffer_Release(&other);
    if (status == OT_OK && args[1] == Py_False) self->ends_written++;
    return PyLong_FromLong(status);
}

typedef struct {
    PyObject *list;
    int failed;
} TakeContext;

static int take_one(void *context, const uint8_t *first, uint32_t first_length, const uint8_t *second,
                    uint32_t second_length) {
    TakeContext *take = context;
    PyObject *record = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)first_length + second_length);
    if (record == NULL) goto failed;
    memcpy(PyBytes_AS_STRING(record), first, first_length);
    if (second_length) memcpy(PyBytes_AS_STRING(record) + first_length, second, second_length);
    int appended = PyList_Append(take->list, record);
    Py_DECREF(record);
    if (appended == 0) return 0;
failed:
    take->failed = 1; /* out of memory: the record is consumed, the error raised */
    return 1;
}

/* take(max_bytes) -> list of the records published since the last take (consumed). */
static PyObject *ring_core_take(RingCore *self, PyObject *argument) {
    if (!usable(self)) return NULL;
    unsigned long long max_bytes = PyLong_AsUnsignedLongLong(argument);
    if (max_bytes == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    TakeContext take = {PyList_New(0), 0};
    if (take.list == NULL) return NULL;
    ot_take_result result;
    ot_ring_take(&self->ring, max_bytes, take_one, &take, &result);
    self->corrupt += result.corrupt;
    if (take.failed) {
        Py_DECREF(take.list);
        return NULL;
    }
    return take.list;
}

static PyObject *ring_core_load(RingCore *self, PyObject *argument) {
    if (!usable(self)) return NULL;
    unsigned long long offset = PyLong_AsUnsignedLongLong(argument);
    if (offset == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t value;
    if (ot_ring_load(&self->ring, offset, &value) != 0) {
        PyErr_Format(PyExc_ValueError, "header offset %llu is not a word of the header", offset);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(value);
}

static PyObject *ring_core_store(RingCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(offset, value) takes two arguments");
        return NULL;
    }
    if (!usable(self)) return NULL;
    unsigned long long offset = PyLong_AsUnsignedLongLong(args[0]);
    if (offset == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    unsigned long long value = PyLong_AsUnsignedLongLong(args[1]);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (ot_ring_store(&self->ring, offset, value) != 0) {
        PyErr_Format(PyExc_ValueError, "header offset %llu is not a word of the header", offset);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *ring_core_release(RingCore *self, PyObject *unused) {
    (void)unused;
    if (!self->has_lock) Py_RETURN_NONE; /* never initialised */
    pthread_mutex_lock(&self->write_lock); /* no device record is being written into the mapping */
    self->closed = 1;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    pthread_mutex_unlock(&self->write_lock);
    Py_RETURN_NONE;
}

/* -- the fast records (records.h) ------------------------------------------------------------------------- */

/* A text as UTF-8 without copying; 0, or -1 (no exception set) when it is not an exact str that encodes. */
int ot_py_utf8_of(PyObject *text, ot_str *out) {
    if (!PyUnicode_CheckExact(text)) return -1;
    Py_ssize_t length;
    const char *data = PyUnicode_AsUTF8AndSize(text, &length);
    if (data == NULL) {
        PyErr_Clear(); /* lone surrogates: the marshal path carries them */
        return -1;
    }
    if ((unsigned long long)length > UINT32_MAX) return -1;
    out->data = data;
    out->length = (uint32_t)length;
    return 0;
}

/* The attributes of a fast record; 0, or -1 (no exception set) when one is not bool, int64, float or str. */
int ot_py_attributes_of(PyObject *attributes, ot_record *record) {
    record->count = 0;
    if (attributes == Py_None) return 0;
    if (!PyDict_CheckExact(attributes) || PyDict_GET_SIZE(attributes) > OT_MAX_ATTRIBUTES) return -1;
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(attributes, &position, &key, &value)) {
        ot_attribute *attribute = &record->attributes[record->count++];
        if (ot_py_utf8_of(key, &attribute->key)) return -1;
        if (value == Py_True || value == Py_False) {
            attribute->tag = OT_BOOL;
            attribute->value.integer = value == Py_True;
        } else if (PyLong_CheckExact(value)) {
            int overflow;
            attribute->value.integer = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow || (attribute->value.integer == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return -1;
            }
            attribute->tag = OT_INT;
        } else if (PyFloat_CheckExact(value)) {
            attribute->tag = OT_FLOAT;
            attribute->value.number = PyFloat_AS_DOUBLE(value);
        } else if (PyUnicode_CheckExact(value)) {
            attribute->tag = OT_STR;
            if (ot_py_utf8_of(value, &attribute->value.text)) return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

int ot_py_fast_allowed(RingCore *self) {
    uint64_t caps;
    return !self->closed && self->has_view && ot_ring_load(&self->ring, OT_F_CAPS, &caps) == 0 &&
           (caps & OT_CAP_FAST_RECORDS);
}

/* Encode and append; the payload as bytes when the ring refused it (the caller waits or drops), else None. */
PyObject *ot_py_write_record(RingCore *self, const ot_record *record) {
    size_t size = ot_record_size(record);
    if (size == 0) return NULL; /* not encodable: no exception, the caller falls back */
    uint8_t stack[2048];
    uint8_t *buffer = size <= sizeof stack ? stack : PyMem_Malloc(size);
    if (buffer == NULL) return PyErr_NoMemory();
    ot_record_encode(record, buffer);
    int moved;
    pthread_mutex_lock(&self->write_lock);
    int status = ot_ring_append(&self->ring, buffer, (uint32_t)size, &moved);
    pthread_mutex_unlock(&self->write_lock);
    PyObject *result;
    if (status == OT_OK) {
        if (record->type == OT_RECORD_END) self->ends_written++;
        result = Py_NewRef(Py_None);
    } else {
        result = PyBytes_FromStringAndSize((const char *)buffer, (Py_ssize_t)size);
    }
    if (buffer != stack) PyMem_Free(buffer);
    return result;
}

int ot_py_split_trace_id(RingCore *self, PyObject *trace_id, ot_record *record) {
    if (trace_id == self->trace_id) { /* the same trace as the last child: no arithmetic */
        record->trace_id_high = self->trace_high, record->trace_id_low = self->trace_low;
        return 0;
    }
    if (!PyLong_CheckExact(trace_id)) return -1; /* negative or >= 2**128: the conversions below fail */
    PyObject *shift = PyLong_FromLong(64);
    PyObject *high = shift ? PyNumber_Rshift(trace_id, shift) : NULL;
    Py_XDECREF(shift);
    if (high == NULL) return -1;
    unsigned long long high_value = PyLong_AsUnsignedLongLong(high);
    Py_DECREF(high);
    if (high_value == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    record->trace_id_high = high_value;
    record->trace_id_low = PyLong_AsUnsignedLongLongMask(trace_id);
    Py_XSETREF(self->trace_id, Py_NewRef(trace_id));
    self->trace_high = record->trace_id_high, self->trace_low = record->trace_id_low;
    return 0;
}

PyObject *ot_py_trace_id_object(uint64_t high, uint64_t low) {
    PyObject *high_object = PyLong_FromUnsignedLongLong(high), *low_object = PyLong_FromUnsignedLongLong(low);
    PyObject *shift = PyLong_FromLong(64), *shifted = NULL, *result = NULL;
    if (high_object && low_object && shift && (shifted = PyNumber_Lshift(high_object, shift)))
        result = PyNumber_Or(shifted, low_object);
    Py_XDECREF(high_object), Py_XDECREF(low_object), Py_XDECREF(shift), Py_XDECREF(shifted);
    return result;
}

/* An int in [low, high] as a uint64, without running Python code: an int or a subclass (TraceFlags), whose
 * value C reads directly (no __index__); 0, or -1 (no exception set) when it is anything else. */
int ot_py_exact_u64(PyObject *value, uint64_t low, uint64_t high, uint64_t *out) {
    if (!PyLong_Check(value)) return -1;
    unsigned long long result = PyLong_AsUnsignedLongLong(value);
    if (result == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or too big */
        return -1;
    }
    if (result < low || result > high) return -1;
    *out = result;
    return 0;
}

/* A time in ns: an int 0 <= t < 2**63 (read as exact_u64 reads), or -1 for "now". */
int ot_py_exact_time(PyObject *value, int64_t *out) {
    if (PyLong_Check(value)) {
        int overflow;
        long long result = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && result == -1 && !PyErr_Occurred()) {
            *out = ot_now_ns();
            return 0;
        }
        PyErr_Clear();
        if (!overflow && result >= 0) {
            *out = result;
            return 0;
        }
    }
    return -1;
}

/* end(span_id, end, updates) -> (refused payload or None,), or None when this end cannot be a fast record
 * (the caller writes its marshal record). As begin_span() (span.c): exact values only, no Python code, no exception. */
static PyObject *ring_core_end(RingCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "end() takes three arguments");
        return NULL;
    }
    ot_record record;
    record.type = OT_RECORD_END;
    if (ot_py_exact_u64(args[0], 1, UINT64_MAX, &record.span_id) || ot_py_exact_time(args[1], &record.time) ||
        ot_py_attributes_of(args[2], &record) || !ot_py_fast_allowed(self))
        Py_RETURN_NONE;
    PyObject *refused = ot_py_write_record(self, &record);
    if (refused == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(N)", refused);
}

/* decode(payload) -> the record as the tuple its marshal form gives; ValueError when it is not one. */
static PyObject *native_decode(PyObject *module, PyObject *payload) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    ot_record *record = PyMem_Malloc(sizeof *record);
    PyObject *result = NULL, *attributes = NULL;
    if (record == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (ot_record_parse(view.buf, (size_t)view.len, record) != 0) {
        PyErr_SetString(PyExc_ValueError, "not a fast span record");
        goto done;
    }
    if (record->type == OT_RECORD_DEVICE) { /* (7, token, which, ns): records.py's DEVICE */
        result = Py_BuildValue("(iKiL)", 7, (unsigned long long)record->span_id, (int)record->kind,
                               (long long)record->time);
        goto done;
    }
    if (record->count) {
        attributes = PyDict_New();
        if (attributes == NULL) goto done;
        for (uint16_t index = 0; index < record->count; index++) {
            ot_attribute *attribute = &record->attributes[index];
            PyObject *key = PyUnicode_DecodeUTF8(attribute->key.data, attribute->key.length, "strict");
            PyObject *value = NULL;
            switch (attribute->tag) {
            case OT_BOOL: value = PyBool_FromLong((long)attribute->value.integer); break;
            case OT_INT: value = PyLong_FromLongLong(attribute->value.integer); break;
            case OT_FLOAT: value = PyFloat_FromDouble(attribute->value.number); break;
            default: value = PyUnicode_DecodeUTF8(attribute->value.text.data, attribute->value.text.length, "strict");
            }
            int failed = key == NULL || value == NULL || PyDict_SetItem(attributes, key, value) < 0;
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (failed) goto done;
        }
    } else {
        attributes = Py_NewRef(Py_None);
    }
    if (record->type == OT_RECORD_END) {
        result = record->count ? Py_BuildValue("(iKLOOOOO)", 2, (unsigned long long)record->span_id,
                                              (long long)record->time, attributes, Py_None, Py_None, Py_None, Py_None)
                               : Py_BuildValue("(iKL)", 2, (unsigned long long)record->span_id, (long long)record->time);
    } else {
        PyObject *name = PyUnicode_DecodeUTF8(record->name.data, record->name.length, "strict");
        PyObject *trace_id = name ? ot_py_trace_id_object(record->trace_id_high, record->trace_id_low) : NULL;
        if (trace_id != NULL)
            result = Py_BuildValue("(iKNKONLiOOkOii)", 1, (unsigned long long)record->span_id, trace_id,
                                   (unsigned long long)record->parent_id, record->remote ? Py_True : Py_False,
                                   name, (long long)record->time, (int)record->kind, attributes, Py_None,
                                   (unsigned long)record->scope, Py_None, (int)record->flags, (int)record->parent_flags);
        else
            Py_XDECREF(name);
    }
done:
    Py_XDECREF(attributes);
    PyMem_Free(record);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *get_closed(RingCore *self, void *unused) {
    (void)unused;
    return PyBool_FromLong(self->closed);
}

static int set_closed(RingCore *self, PyObject *value, void *unused) {
    (void)unused;
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "closed cannot be deleted");
        return -1;
    }
    int truth = PyObject_IsTrue(value);
    if (truth < 0) return -1;
    self->closed = truth;
    return 0;
}

static PyObject *get_u64(RingCore *self, void *which) {
    switch ((intptr_t)which) {
    case 0: return PyLong_FromUnsignedLongLong(self->ring.capacity);
    case 1: return PyLong_FromUnsignedLongLong(self->ring.read_seen);
    case 2: return PyLong_FromUnsignedLongLong(self->ends_written);
    default: return PyLong_FromUnsignedLongLong(self->corrupt);
    }
}

static PyMethodDef ring_core_methods[] = {
    {"append", (PyCFunction)(void (*)(void))ring_core_append, METH_FASTCALL,
     "append(payload, begin) -> 0 written, 1 full, 2 too big, 3 closed (begin False counts an end record)"},
    {"take", (PyCFunction)ring_core_take, METH_O, "take(max_bytes) -> the records published since the last take"},
    {"load", (PyCFunction)ring_core_load, METH_O, "load(offset) -> the header word at offset (acquire)"},
    {"store", (PyCFunction)(void (*)(void))ring_core_store, METH_FASTCALL,
     "store(offset, value): the header word at offset (release)"},
    {"release", (PyCFunction)ring_core_release, METH_NOARGS, "Close and let go of the buffer."},
    {"span_setup", (PyCFunction)(void (*)(void))ot_py_span_setup, METH_FASTCALL,
     "span_setup(span_type, context_type, trace_state, root_flags, child_flags): what begin_span() builds"},
    {"begin_span", (PyCFunction)(void (*)(void))ot_py_begin_span, METH_FASTCALL,
     "begin_span(provider, name, kind, kind_value, attributes, scope, parent, start, on_exception) -> the span "
     "(its begin record written), or None when it cannot be a fast record (span.c)"},
    {"end", (PyCFunction)(void (*)(void))ring_core_end, METH_FASTCALL,
     "end(span_id, end, updates) -> (refused payload or None,), or None: write the marshal record instead"},
    {NULL, NULL, 0, NULL},
};

static PyObject *get_span_core(RingCore *self, void *unused) {
    (void)self, (void)unused;
    return Py_NewRef((PyObject *)&SpanCoreType);
}

static PyGetSetDef ring_core_getset[] = {
    {"span_core", (getter)get_span_core, NULL, "The C base of begin_span()'s span class (span.c).", NULL},
    {"closed", (getter)get_closed, (setter)set_closed, "Appends are refused (3) once set.", NULL},
    {"capacity", (getter)get_u64, NULL, "Data bytes.", (void *)0},
    {"read_seen", (getter)get_u64, NULL, "The reader's position as the writer last saw it.", (void *)1},
    {"ends_written", (getter)get_u64, NULL, "End records written.", (void *)2},
    {"corrupt", (getter)get_u64, NULL, "Takes that found bytes that did not frame as records.", (void *)3},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.RingCore",
    .tp_basicsize = sizeof(RingCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The offload ring over a writable buffer: RingCore(mmap, create=False).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_core_init,
    .tp_dealloc = (destructor)ring_core_dealloc,
    .tp_methods = ring_core_methods,
    .tp_getset = ring_core_getset,
};


/* -- the device resolver (device.h) ----------------------------------------------------------------------- */

/* The poller thread's sink: a device record into the ring, under the write lock, without the GIL. Refused
 * (counted by the poller as dropped) when the ring is closed or full: the resolver never waits. */
static int device_sink(void *context, uint64_t token, uint8_t which, int64_t ns) {
    RingCore *ring = context;
    ot_record record;
    record.type = OT_RECORD_DEVICE, record.span_id = token, record.kind = which, record.time = ns;
    uint8_t buffer[32];
    size_t size = ot_record_encode(&record, buffer);
    int moved, status = OT_FULL;
    pthread_mutex_lock(&ring->write_lock);
    if (!ring->closed && ring->has_view) status = ot_ring_append(&ring->ring, buffer, (uint32_t)size, &moved);
    pthread_mutex_unlock(&ring->write_lock);
    return status != OT_OK;
}

typedef struct {
    PyObject_HEAD
    ot_poller *poller;
    RingCore *ring; /* kept alive while the thread may write into it */
    int orphaned;   /* close() gave up on the thread: the ring stays referenced for good */
} DevicePoller;


/* DevicePoller(ring, driver, poll_us, idle_us, only_loaded=True): the resolver thread for the CUDA context
 * current on this thread, writing into `ring` (a RingCore). OSError with the reason when it cannot start. */
static int device_poller_init(DevicePoller *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"ring", "driver", "poll_us", "idle_us", "only_loaded", NULL};
    PyObject *ring;
    const char *driver;
    unsigned int poll_us, idle_us;
    int only_loaded = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!sII|p", names, &RingCoreType, &ring, &driver, &poll_us,
                                     &idle_us, &only_loaded))
        return -1;
    if (self->poller != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "DevicePoller is already started");
        return -1;
    }
    if (!((RingCore *)ring)->has_lock) {
        PyErr_SetString(PyExc_ValueError, "the ring was not initialised");
        return -1;
    }
    ot_cuda cuda;
    char why[256];
    if (ot_cuda_load(&cuda, driver, only_loaded, why, sizeof why) != 0) {
        PyErr_SetString(PyExc_OSError, why);
        return -1;
    }
    self->ring = (RingCore *)Py_NewRef(ring);
    self->poller = ot_poller_start(&cuda, device_sink, ring, poll_us, idle_us, why, sizeof why);
    if (self->poller == NULL) {
        Py_CLEAR(self->ring);
        PyErr_SetString(PyExc_OSError, why);
        return -1;
    }
    return 0;
}

static int poller_running(DevicePoller *self) {
    return self->poller != NULL;
}

static int device_args(PyObject *const *args, uint64_t *token, uint64_t *which) {
    return ot_py_exact_u64(args[0], 0, UINT64_MAX, token) || ot_py_exact_u64(args[1], 0, 1, which);
}

/* mark(token, which, stream) -> True queued; False: time this one on the host (a capture, a full queue, a
 * failed or closed resolver, or arguments that are not a u64 token, 0 or 1, and a stream handle). */
static PyObject *device_poller_mark(DevicePoller *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "mark(token, which, stream) takes three arguments");
        return NULL;
    }
    uint64_t token, which, stream;
    if (!poller_running(self) || device_args(args, &token, &which) || ot_py_exact_u64(args[2], 0, UINTPTR_MAX, &stream))
        Py_RETURN_FALSE;
    return PyBool_FromLong(ot_poller_mark(self->poller, token, (uint8_t)which, (void *)(uintptr_t)stream));
}

/* host(token, which, ns) -> True queued: a marker timed by the host (ns since the epoch), in order. */
static PyObject *device_poller_host(DevicePoller *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "host(token, which, ns) takes three arguments");
        return NULL;
    }
    uint64_t token, which, ns;
    if (!poller_running(self) || device_args(args, &token, &which) || ot_py_exact_u64(args[2], 0, INT64_MAX, &ns))
        Py_RETURN_FALSE;
    return PyBool_FromLong(ot_poller_host(self->poller, token, (uint8_t)which, (int64_t)ns));
}

static PyObject *device_poller_capture(DevicePoller *self, PyObject *argument) {
    long delta = PyLong_AsLong(argument);
    if (delta == -1 && PyErr_Occurred()) return NULL;
    if (poller_running(self)) {
        Py_BEGIN_ALLOW_THREADS /* waits for the thread to leave a CUDA call */
        ot_poller_capture(self->poller, delta > 0 ? 1 : -1);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* The counts as the dict stats() and close() return (device_records.STAT_KEYS names the same keys). */
static PyObject *stats_dict(const ot_poller_stats *stats) {
    return Py_BuildValue("{sKsKsKsKsKsK}", "marked", (unsigned long long)stats->marked, "resolved",
                         (unsigned long long)stats->resolved, "dropped", (unsigned long long)stats->dropped,
                         "refused", (unsigned long long)stats->refused, "failed", (unsigned long long)stats->failed,
                         "pending", (unsigned long long)stats->pending);
}

static PyObject *device_poller_stats(DevicePoller *self, PyObject *unused) {
    (void)unused;
    ot_poller_stats stats = {0};
    if (poller_running(self)) ot_poller_stats_get(self->poller, &stats);
    return stats_dict(&stats);
}

/* close(timeout_s) -> (stats, stopped): resolve what completes in time, stop the thread. stopped False: the
 * thread is inside a CUDA call (a hung device) and stops by itself later, writing nothing more. */
static PyObject *device_poller_close(DevicePoller *self, PyObject *argument) {
    double timeout_s = PyFloat_AsDouble(argument);
    if (timeout_s == -1.0 && PyErr_Occurred()) return NULL;
    if (!poller_running(self)) return Py_BuildValue("(NO)", device_poller_stats(self, NULL), Py_True);
    ot_poller *poller = self->poller;
    ot_poller_stats stats;
    int running;
    Py_BEGIN_ALLOW_THREADS
    running = ot_poller_stop(poller, timeout_s, &stats); /* pending: what it could not resolve in time */
    Py_END_ALLOW_THREADS
    self->poller = NULL;
    if (running) self->orphaned = 1; /* the ring stays referenced: no write reaches it after this, by the flag */
    else Py_CLEAR(self->ring);
    return Py_BuildValue("(NO)", stats_dict(&stats), running ? Py_False : Py_True);
}

/* forget(): in a forked child, where the thread does not exist. */
static PyObject *device_poller_forget(DevicePoller *self, PyObject *unused) {
    (void)unused;
    if (self->poller != NULL) {
        ot_poller_forget(self->poller);
        ot_poller_stop(self->poller, 0, NULL); /* frees without joining */
        self->poller = NULL;
    }
    Py_RETURN_NONE;
}

static void device_poller_dealloc(DevicePoller *self) {
    if (self->poller != NULL) {
        int running;
        Py_BEGIN_ALLOW_THREADS
        running = ot_poller_stop(self->poller, 0, NULL);
        Py_END_ALLOW_THREADS
        self->poller = NULL;
        if (running) self->orphaned = 1;
    }
    if (!self->orphaned) Py_CLEAR(self->ring); /* an orphaned thread's ring is leaked with it, never freed under it */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef device_poller_methods[] = {
    {"mark", (PyCFunction)(void (*)(void))device_poller_mark, METH_FASTCALL,
     "mark(token, which, stream) -> True queued, False: time it on the host"},
    {"host", (PyCFunction)(void (*)(void))device_poller_host, METH_FASTCALL,
     "host(token, which, ns) -> True queued: a marker the host timed"},
    {"capture", (PyCFunction)device_poller_capture, METH_O, "capture(+1 or -1): a CUDA graph capture began or ended"},
    {"stats", (PyCFunction)device_poller_stats, METH_NOARGS, "stats() -> the resolver's counts"},
    {"close", (PyCFunction)device_poller_close, METH_O, "close(timeout_s) -> (stats, stopped)"},
    {"forget", (PyCFunction)device_poller_forget, METH_NOARGS, "forget(): after fork, in the child"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DevicePollerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.DevicePoller",
    .tp_basicsize = sizeof(DevicePoller),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The device resolver's thread: DevicePoller(ring, driver, poll_us, idle_us, only_loaded=True).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)device_poller_init,
    .tp_dealloc = (destructor)device_poller_dealloc,
    .tp_methods = device_poller_methods,
};

static PyMethodDef native_functions[] = {
    {"decode", (PyCFunction)native_decode, METH_O,
     "decode(payload) -> a fast span record as the tuple its marshal form gives; ValueError when it is not one"},
    {"_slot_read", (PyCFunction)(void (*)(void))ot_py_slot_read, METH_FASTCALL,
     "_slot_read(object, name) -> (value, from a slot): slots.c's read, for the tests"},
    {"child_setup", (PyCFunction)(void (*)(void))ot_py_child_setup, METH_FASTCALL,
     "child_setup(start_child, kind, on_exception): record_tracer.RecordTracer.start_child and its constants"},
    {"step_span_setup", (PyCFunction)(void (*)(void))ot_py_step_span_setup, METH_FASTCALL,
     "step_span_setup(current, begin_detached, begin, end, admit, begin_failed, end_failed): step_span.c's "
     "Python twins and what it needs of them (events/span_kinds.py)"},
    {"_step_span_counts", (PyCFunction)ot_py_step_span_counts, METH_NOARGS,
     "_step_span_counts() -> (begun, ended, contained): the steps step_span.c began and ended itself, the errors "
     "it contained (the tests' view)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "otel_training._native",
    "The offload path's native core (the ring, the fast span records). The pure-Python fallback is "
    "otel_training/_ring.py with marshal records.", -1, native_functions, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&RingCoreType) < 0 || PyType_Ready(&DevicePollerType) < 0 || PyType_Ready(&SpanCoreType) < 0 ||
        PyType_Ready(&GateType) < 0 || PyType_Ready(&EnabledType) < 0 || PyType_Ready(&CurrentSpanType) < 0 || PyType_Ready(&AttachSpanType) < 0 ||
        PyType_Ready(&PlainAttributesType) < 0 || PyType_Ready(&StepCoreType) < 0 || ot_steps_init() < 0 || ot_step_span_init() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "RingCore", (PyObject *)&RingCoreType) < 0 ||
        PyModule_AddObjectRef(module, "DevicePoller", (PyObject *)&DevicePollerType) < 0 ||
        PyModule_AddObjectRef(module, "SpanCore", (PyObject *)&SpanCoreType) < 0 ||
        PyModule_AddObjectRef(module, "Gate", (PyObject *)&GateType) < 0 ||
        PyModule_AddObjectRef(module, "InstrumentationEnabled", (PyObject *)&EnabledType) < 0 ||
        PyModule_AddObjectRef(module, "CurrentSpan", (PyObject *)&CurrentSpanType) < 0 ||
        PyModule_AddObjectRef(module, "AttachSpan", (PyObject *)&AttachSpanType) < 0 ||
        PyModule_AddObjectRef(module, "PlainAttributes", (PyObject *)&PlainAttributesType) < 0 ||
        PyModule_AddObjectRef(module, "StepCore", (PyObject *)&StepCoreType) < 0 ||
        PyModule_AddIntConstant(module, "HEADER", OT_RING_HEADER) < 0 ||
        PyModule_AddIntConstant(module, "ABI", 10) < 0 || PyModule_AddIntConstant(module, "CAPS_OFFSET", OT_F_CAPS) < 0 ||
        PyModule_AddIntConstant(module, "CAP_FAST_RECORDS", OT_CAP_FAST_RECORDS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

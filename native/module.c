/* otel_training._native: the hot parts of the offload path in C (docs/architecture.md says why C).
 *
 * RingCore wraps ring.c over a writable buffer (the ring's mmap). Writers are serialised by the GIL, held
 * across an append, so no Python code (a signal handler included) runs in the middle of one. Everything a
 * caller may get wrong (a closed ring, a payload too big, a header offset) is a return value or a Python
 * exception, never a crash.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ring.h"

typedef struct {
    PyObject_HEAD
    Py_buffer view; /* the mapping, held until release() */
    int has_view;
    int closed;
    ot_ring ring;
    unsigned long long ends_written; /* end records written (kind 0) */
    unsigned long long corrupt;      /* takes that found bytes that did not frame as records */
} RingCore;

static int ring_core_init(RingCore *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"buffer", "create", NULL};
    PyObject *buffer;
    int create = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p", names, &buffer, &create)) return -1;
    if (self->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "RingCore is already initialised");
        return -1;
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
    if (self->closed || !self->has_view) return PyLong_FromLong(3);
    const char *data;
    Py_ssize_t length;
    Py_buffer other;
    int has_other = 0;
    if (PyBytes_CheckExact(args[0])) {
        data = PyBytes_AS_STRING(args[0]);
        length = PyBytes_GET_SIZE(args[0]);
    } else {
        if (PyObject_GetBuffer(args[0], &other, PyBUF_C_CONTIGUOUS) < 0) return NULL;
        has_other = 1;
        data = other.buf;
        length = other.len;
    }
    int status = OT_TOO_BIG, moved = 0;
    if ((unsigned long long)length <= UINT32_MAX - 4)
        status = ot_ring_append(&self->ring, (const uint8_t *)data, (uint32_t)length, &moved);
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
    self->closed = 1;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_RETURN_NONE;
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
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_core_getset[] = {
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

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "otel_training._native",
    "The offload path's native core (the ring). The pure-Python fallback is otel_training/_ring.py.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&RingCoreType) < 0) return NULL;
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) return NULL;
    Py_INCREF(&RingCoreType);
    if (PyModule_AddObject(module, "RingCore", (PyObject *)&RingCoreType) < 0 ||
        PyModule_AddIntConstant(module, "HEADER", OT_RING_HEADER) < 0 ||
        PyModule_AddIntConstant(module, "ABI", 1) < 0) {
        Py_DECREF(&RingCoreType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* A Duration's attributes from its usual content, in C: events/duration.py's inline path as one call.
 *
 * Why: ``trainer.step(global_step=n, batch_size=32)`` turns its content into attributes on every step; in Python
 * the loop over the content (a key looked up among those already seen, the value's type and range checked) is
 * about as long as the rest of the step's begin. This is the same loop over the same objects, without running
 * any Python code: exact types only, so nothing a user defines (a __hash__, an __eq__, an __index__) runs here.
 *
 * PlainAttributes(target_key, name_key, cached_keys, max_keys)(target, event_name, attributes, content) ->
 *   {target_key: target, name_key: event_name, **attributes, **{cached_keys[key]: value}}, or None when the
 *   content is not plain: not a dict, more than max_keys items, a key not an exact str already in cached_keys,
 *   or a value not an exact bool, float or int in int64's range. The caller then takes its Python path, which
 *   converts anything (events/attributes.py's to_attributes). ``attributes``: None or a dict; ``content``: None,
 *   or anything (only an exact dict can be plain; an empty one adds nothing, as ``if content:`` skips it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

typedef struct {
    PyObject_HEAD
    PyObject *target_key, *name_key, *cached_keys;
    Py_ssize_t max_keys;
    vectorcallfunc vectorcall;
} PlainAttributes;

static int plain_traverse(PlainAttributes *self, visitproc visit, void *arg) {
    Py_VISIT(self->target_key);
    Py_VISIT(self->name_key);
    Py_VISIT(self->cached_keys);
    return 0;
}

static int plain_clear(PlainAttributes *self) {
    Py_CLEAR(self->target_key);
    Py_CLEAR(self->name_key);
    Py_CLEAR(self->cached_keys);
    return 0;
}

static void plain_dealloc(PlainAttributes *self) {
    PyObject_GC_UnTrack(self);
    plain_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1: a plain value (kept as it is), 0: not, -1: an error. */
static int plain_value(PyObject *value) {
    if (PyFloat_CheckExact(value) || PyBool_Check(value)) return 1;
    if (!PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (number == -1 && PyErr_Occurred()) return -1;
    return overflow == 0;
}

static PyObject *plain_call(PlainAttributes *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "PlainAttributes takes (target, event_name, attributes, content)");
        return NULL;
    }
    PyObject *attributes = args[2], *content = args[3];
    if (attributes != Py_None && !PyDict_CheckExact(attributes)) Py_RETURN_NONE;
    if (content != Py_None && !PyDict_CheckExact(content)) Py_RETURN_NONE;
    if (content != Py_None && PyDict_GET_SIZE(content) > self->max_keys) Py_RETURN_NONE;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    if (PyDict_SetItem(out, self->target_key, args[0]) < 0 || PyDict_SetItem(out, self->name_key, args[1]) < 0 ||
        (attributes != Py_None && PyDict_Update(out, attributes) < 0))
        goto failed;
    if (content != Py_None) {
        Py_ssize_t position = 0;
        PyObject *key, *value;
        while (PyDict_Next(content, &position, &key, &value)) {
            /* Held while used: a key of ``attributes`` already in ``out`` could run its own __eq__ on a collision */
            Py_INCREF(key), Py_INCREF(value);
            PyObject *name = PyUnicode_CheckExact(key) ? PyDict_GetItemWithError(self->cached_keys, key) : NULL;
            int plain = name == NULL ? (PyErr_Occurred() ? -1 : 0) : plain_value(value);
            if (plain == 1 && PyDict_SetItem(out, name, value) < 0) plain = -1;
            Py_DECREF(key), Py_DECREF(value);
            if (plain < 0) goto failed;
            if (plain == 0) goto not_plain;
        }
    }
    return out;
not_plain:
    Py_DECREF(out);
    Py_RETURN_NONE;
failed:
    Py_DECREF(out);
    return NULL;
}

static PyObject *plain_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"target_key", "name_key", "cached_keys", "max_keys", NULL};
    PyObject *target_key, *name_key, *cached_keys;
    Py_ssize_t max_keys;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UUO!n", names, &target_key, &name_key, &PyDict_Type, &cached_keys,
                                     &max_keys))
        return NULL;
    if (!PyDict_CheckExact(cached_keys) || max_keys < 0) {
        PyErr_SetString(PyExc_TypeError, "PlainAttributes: cached_keys must be a dict and max_keys at least 0");
        return NULL;
    }
    PlainAttributes *self = (PlainAttributes *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->target_key = Py_NewRef(target_key), self->name_key = Py_NewRef(name_key);
    self->cached_keys = Py_NewRef(cached_keys), self->max_keys = max_keys;
    self->vectorcall = (vectorcallfunc)plain_call;
    return (PyObject *)self;
}

PyTypeObject PlainAttributesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.PlainAttributes",
    .tp_basicsize = sizeof(PlainAttributes),
    .tp_vectorcall_offset = offsetof(PlainAttributes, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PlainAttributes(target_key, name_key, cached_keys, max_keys)(target, event_name, attributes, content): "
              "a Duration's attributes from plain content, or None (in C).",
    .tp_new = plain_new,
    .tp_dealloc = (destructor)plain_dealloc,
    .tp_traverse = (traverseproc)plain_traverse,
    .tp_clear = (inquiry)plain_clear,
    .tp_call = PyVectorcall_Call,
};

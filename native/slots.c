/* Another class's __slots__ read and written from C at the cost of a field access.
 *
 * Why: C that reads a Python object's attribute through PyObject_GetAttr pays the type's lookup and the
 * descriptor's call, about what the interpreter's specialised bytecode pays (a C start_child built on it saved
 * nothing, docs/offload.md). A class made of __slots__ keeps each one at a fixed offset that its member
 * descriptor names. It is found once per class and remembered with the class's version tag, the key of the
 * interpreter's own attribute caches: a class changed since (a descriptor added or rebound anywhere in its MRO)
 * has a new tag, or none, and is looked up again. Only a plain object slot (T_OBJECT_EX, writable) of a class
 * that reads and writes attributes as ``object`` does (no __getattribute__, __getattr__ or __setattr__ of its
 * own) has an offset here; for anything else the caller reads through PyObject_GetAttr, or takes its Python
 * path. Nothing here runs Python code.
 */
#include "binding.h"

#include <structmember.h>

Py_ssize_t ot_slot_lookup(PyObject *object, PyObject *name, ot_slot *cache) {
    PyTypeObject *type = Py_TYPE(object);
    Py_ssize_t offset = 0;
    if (type->tp_getattro == PyObject_GenericGetAttr && type->tp_setattro == PyObject_GenericSetAttr) {
        PyObject *descriptor = _PyType_Lookup(type, name); /* borrowed; gives the class a version tag */
        if (descriptor != NULL && Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY) &&
                member->offset >= (Py_ssize_t)sizeof(PyObject) &&
                member->offset + (Py_ssize_t)sizeof(PyObject *) <= type->tp_basicsize &&
                PyType_IsSubtype(type, PyDescr_TYPE(descriptor)))
                offset = member->offset;
        }
    }
    Py_INCREF(type);
    Py_XSETREF(cache->type, type); /* held: a class freed and another made at its address is never mistaken */
    Py_INCREF(name);
    Py_XSETREF(cache->name, name);
    cache->tag = ot_version_tag(type);  /* 0 (no tag to check): looked up again on every call, never wrong */
    cache->offset = offset;
    return offset;
}

PyObject *ot_slot_get(PyObject *object, PyObject *name, ot_slot *cache) {
    Py_ssize_t offset = ot_slot_offset(object, name, cache);
    if (offset == 0) return PyObject_GetAttr(object, name);
    PyObject *value = *(PyObject **)((char *)object + offset);
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'", Py_TYPE(object)->tp_name, name);
        return NULL;
    }
    return Py_NewRef(value);
}

PyObject *ot_slot_read(PyObject *object, PyObject *name, ot_slot *cache) {
    PyObject *value = ot_slot_get(object, name, cache);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    return value;
}

int ot_slot_write(PyObject *object, Py_ssize_t offset, PyObject *value) {
    if (offset == 0) return -1;
    Py_XSETREF(*(PyObject **)((char *)object + offset), Py_NewRef(value));
    return 0;
}

/* _slot_read(object, name) -> (value, whether read from a slot): the tests' view of one cache (slots.c is read by
 * C only). A class changed since, another class, an unset slot: as getattr(object, name) would answer. */
PyObject *ot_py_slot_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static ot_slot cache;
    (void)module;
    if (nargs != 2 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_slot_read(object, name: str)");
        return NULL;
    }
    PyObject *name = Py_NewRef(args[1]);
    PyUnicode_InternInPlace(&name);
    int from_slot = ot_slot_offset(args[0], name, &cache) != 0;
    PyObject *value = ot_slot_get(args[0], name, &cache);
    Py_DECREF(name);
    if (value == NULL) return NULL;
    return Py_BuildValue("(NO)", value, from_slot ? Py_True : Py_False);
}

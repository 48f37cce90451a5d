/* Two small things the binding's files (steps.c, step_span.c) each need, written once.
 *
 * Interned names: a str made from a C string on every call costs a thousand instructions; each file interns the
 * names it calls or reads once, at import. A contained error's log: the error made the handled exception while a
 * logger runs (as inside the Python methods' except blocks), so the log carries its traceback, then cleared.
 */
#include "binding.h"

int ot_intern_names(const char *const *texts, PyObject **names, int count) {
    for (int index = 0; index < count; index++)
        if (names[index] == NULL && (names[index] = PyUnicode_InternFromString(texts[index])) == NULL) return -1;
    return 0;
}

int ot_log_handled(PyObject *logger, PyObject *const *args, size_t nargs) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyObject *type, *value, *traceback, *saved_type, *saved_value, *saved_traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
    PyErr_GetExcInfo(&saved_type, &saved_value, &saved_traceback);
    PyErr_SetExcInfo(type, value, traceback);
    PyObject *logged = logger == NULL ? NULL : PyObject_Vectorcall(logger, args, nargs, NULL);
    PyErr_SetExcInfo(saved_type, saved_value, saved_traceback);
    if (logged != NULL) {
        Py_DECREF(logged);
        return 0;
    }
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_Clear(); /* the log itself failed: contained, as log_once contains its own */
    return 0;
}

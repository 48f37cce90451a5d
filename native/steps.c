/* StepCore: the torch step tracker's hot state in a C struct, and its five per-step hooks' usual case in C.
 *
 * Why: an offloaded torch step spent about 43 000 instructions (callgrind) in the tracker's hooks before any span
 * was made: six Python calls from C (the fetch and backward stand-ins, torch's optimizer hook loop) and some 370
 * bytecodes reading and writing the tracker's attributes. An earlier attempt (StepHooks, reverted) ran the same
 * logic in C on the tracker's Python attributes and saved nothing: a generic attribute lookup from C costs what
 * the bytecode did. Here the fields the hooks touch are the struct's own (member descriptors to Python, so the
 * tracker's Python code reads and writes them as before), and the hooks read them directly.
 *
 * Only the usual case of each hook is here: a step open in this thread, nothing dormant, no claim pending, plain
 * containers. Anything else calls the tracker's Python method of the same name (``_py_<hook>``, the Python class's
 * own, which is also the pure-Python fallback): one behaviour, written once in Python; C is its shortcut. The
 * transitions (a step closing, the forward hook armed, a long data wait's span) are the tracker's Python methods.
 * An error in C is reported through ``_failed(hook)`` (logged once) and never raised into the training loop.
 *
 * StepCore(...) is only a base: integrations/torch/steps.py makes the class (StepCore, StepTracker).
 */
#include "binding.h"

#include <limits.h>
#include <string.h>
#include <stddef.h>
#include <structmember.h>
#include <time.h>

/* Every field is a Python object behind a T_OBJECT_EX member: the interpreter specialises attribute reads and
 * writes of those (LOAD_ATTR_SLOT, STORE_ATTR_SLOT, a few instructions) and of no other member type, so the
 * tracker's Python code pays no generic lookup for them. The counts are ints and the flags bools, as in Python. */
#define STEP_CORE_FIELDS(X)                                                                                   \
    X(step, "_step", "The open step (a StepDuration), or None.")                                             \
    X(owner, "_owner", "The thread ident that drives steps, or None.")                                       \
    X(claim, "_claim", "Dormancy's pending claim, or None.")                                                 \
    X(stepped, "_stepped", "ids of the optimizers stepped in this step (a set).")                            \
    X(expected, "_expected", "ids of the optimizers a step waits for (a frozenset), or None.")               \
    X(backward_ends, "_backward_ends", "This step's backward ends (wall clock, ns), a list.")                \
    X(nested, "_nested", "optimizer id -> step() calls in progress (a dict).")                               \
    X(enabled, "_enabled", "The suppression check (instrumentation_enabled).")                               \
    X(optimizer_calls, "optimizer_calls", "optimizer.step() calls in any thread (tells a GradScaler skip).") \
    X(optimizer_steps, "_optimizer_steps", NULL)                                                             \
    X(wait_ns, "_wait_ns", "This step's data wait (ns).")                                                    \
    X(wait_span_min_ns, "_wait_span_min_ns", "A wait at least this long gets its own span.")                 \
    X(complete, "_complete", NULL)                                                                           \
    X(fetched, "_fetched", NULL)                                                                             \
    X(awaiting_input, "_awaiting_input", NULL)                                                               \
    X(template, "_step_template", "The never-begun step _make_step copies (made by the Python one), or None.") \
    X(number, "_number", "The open (or next) step's number.")                                               \
    X(just_closed, "_just_closed", "A step closed and none opened since.")                                   \
    X(ctx, "_ctx", "The open step's context for work nested in it, once made, or None.")                     \
    X(start_ns, "_start_ns", "The open step's start (wall clock, ns).")                                      \
    X(collectives, "collectives", "The process groups' collectives (collectives.CollectiveTracker), or None.") \
    X(end_keys, "_end_keys", "The attributes a step's end sets: substeps, optimizer steps, skipped, data wait.") \
    X(step_key, "_step_key", "The attribute a step's number is (training.step).")                           \
    X(dormant, "dormant", "Records nothing: dormant until the process trains (dormancy.py).")               \
    X(suspended, "suspended", "Set by framework callbacks that emit their own step spans.")                 \
    X(loop, "loop", "The run's train, epoch and evaluation spans (loop_spans.LoopSpans).")                  \
    X(rt, "_rt", "The runtime steps are made in, until its pipeline closes, or None.")                       \
    X(forward_handle, "_forward_handle", "The forward pre-hook's handle while armed, or None.")              \
    X(grad_enabled, "_grad_enabled", "torch.is_grad_enabled.")                                               \
    X(lengths, "_lengths", "Whether a DataLoader iterator has nothing left (loader_length.LoaderLengths).")

typedef struct {
    PyObject_HEAD
#define DECLARE(member, python_name, doc) PyObject *member;
    STEP_CORE_FIELDS(DECLARE)
#undef DECLARE
    /* No dict here: the Python subclass's own (a managed dict) is the one the interpreter specialises reads of. */
    PyObject *copied_type;        /* the template's class once copy_step has checked it (held), or NULL */
    Py_ssize_t attributes_offset; /* where that class keeps ``_attributes`` */
} StepCore;

static PyMemberDef step_core_members[] = {
#define MEMBER(member, python_name, doc) {python_name, T_OBJECT_EX, offsetof(StepCore, member), 0, doc},
    STEP_CORE_FIELDS(MEMBER)
#undef MEMBER
    {NULL, 0, 0, 0, NULL},
};

/* Every field set from the start (a T_OBJECT_EX member that is NULL raises AttributeError when read). */
static PyObject *step_core_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)args, (void)kwargs;
    /* object.__new__ itself: it also lays out the Python subclass's attributes inline (tp_alloc alone leaves
     * them to a dict made later, whose reads the interpreter does not specialise: a generic lookup each). */
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) return NULL;
    StepCore *self = (StepCore *)PyBaseObject_Type.tp_new(type, empty, NULL);
    Py_DECREF(empty);
    if (self == NULL) return NULL;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->step = Py_NewRef(Py_None), self->owner = Py_NewRef(Py_None), self->claim = Py_NewRef(Py_None);
    self->expected = Py_NewRef(Py_None), self->enabled = Py_NewRef(Py_None);
    self->stepped = PySet_New(NULL), self->backward_ends = PyList_New(0), self->nested = PyDict_New();
    self->optimizer_calls = Py_NewRef(zero), self->optimizer_steps = Py_NewRef(zero), self->wait_ns = Py_NewRef(zero);
    self->wait_span_min_ns = zero;
    self->complete = Py_NewRef(Py_False), self->fetched = Py_NewRef(Py_False);
    self->awaiting_input = Py_NewRef(Py_False), self->template = Py_NewRef(Py_None);
    self->number = Py_NewRef(zero), self->just_closed = Py_NewRef(Py_False), self->ctx = Py_NewRef(Py_None);
    self->start_ns = Py_NewRef(zero), self->collectives = Py_NewRef(Py_None), self->end_keys = Py_NewRef(Py_None);
    self->step_key = Py_NewRef(Py_None), self->dormant = Py_NewRef(Py_False), self->suspended = Py_NewRef(Py_False);
    self->loop = Py_NewRef(Py_None), self->rt = Py_NewRef(Py_None), self->forward_handle = Py_NewRef(Py_None);
    self->grad_enabled = Py_NewRef(Py_None), self->lengths = Py_NewRef(Py_None);
    if (self->stepped == NULL || self->backward_ends == NULL || self->nested == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int step_core_traverse(StepCore *self, visitproc visit, void *arg) {
#define VISIT(member, python_name, doc) Py_VISIT(self->member);
    STEP_CORE_FIELDS(VISIT)
#undef VISIT
    Py_VISIT(self->copied_type);
    return 0; /* the subclass's own slots and its type: subtype_traverse's */
}

static int step_core_clear(StepCore *self) {
#define CLEAR(member, python_name, doc) Py_CLEAR(self->member);
    STEP_CORE_FIELDS(CLEAR)
#undef CLEAR
    Py_CLEAR(self->copied_type);
    return 0;
}

/* Reached through subtype_dealloc (the Python subclass), which clears weak references and its own slots and
 * releases the heap type after this returns. */
static void step_core_dealloc(StepCore *self) {
    PyObject_GC_UnTrack(self);
    step_core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int present(PyObject *value) { return value != NULL && value != Py_None; }

/* The fast paths take plain state only: a flag that is an exact bool, a count that is an exact int within int64.
 * Anything else (a deleted field, an int subclass, a float) is the Python hook's, before any side effect. */
static int flag(PyObject *value) { return value == Py_True ? 1 : value == Py_False ? 0 : -1; }

static int count(PyObject *value, long long *out) {
    if (value == NULL || !PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return overflow == 0;
}

/* *field = bool. */
static void set_flag(PyObject **field, int value) { Py_XSETREF(*field, Py_NewRef(value ? Py_True : Py_False)); }

/* *field = value (-1 with an exception). */
static int set_count(PyObject **field, long long value) {
    PyObject *next = PyLong_FromLongLong(value);
    if (next == NULL) return -1;
    Py_XSETREF(*field, next);
    return 0;
}

/* 1 when this thread drives steps (owner is this thread's ident), 0 otherwise; never an error. */
static int owner_is_me(StepCore *self) {
    if (self->owner == NULL || !PyLong_CheckExact(self->owner)) return 0;
    unsigned long owner = PyLong_AsUnsignedLong(self->owner);
    if (owner == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* out of range: not an ident, so not this thread's */
        return 0;
    }
    return owner == PyThread_get_thread_ident();
}

static long long now_ns(void) { /* time.time_ns() */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* The tracker's Python methods C calls, by name, interned once (a str made from a C string on every call costs a
 * thousand instructions). */
#define STEP_CORE_NAMES(X)                                                                                    \
    X(PY_BACKWARD_BEGIN, "_py_backward_begin") X(PY_BACKWARD_END, "_py_backward_end")                         \
    X(PY_OPTIMIZER_PRE, "_py_optimizer_pre") X(PY_OPTIMIZER_POST, "_py_optimizer_post")                       \
    X(PY_FETCH_END, "_py_fetch_end") X(STEPPED_ONCE, "_stepped_once") X(WAIT_SPAN, "_wait_span")              \
    X(CLOSE, "_close") X(ARM_FORWARD, "arm_forward") X(FAILED, "_failed") X(DEVICE_STEP, "device_step")      \
    X(INPUT_READY, "input_ready") X(PY_MAKE_STEP, "_py_make_step") X(PY_CLOSE, "_py_close") X(END, "end")     \
    X(PY_FETCH_BEGIN, "_py_fetch_begin") X(PY_OPEN, "_py_open") X(EXHAUSTED, "exhausted") X(TRAINING, "_training") \
    X(STARTED, "started") X(EPOCH_ITERATOR, "epoch_iterator") X(FETCHED, "fetched") X(OPEN, "_open")            \
    X(BEGIN_EVALUATION, "begin_evaluation") X(EVALUATION, "evaluation") X(END_EVALUATION, "end_evaluation")     \
    X(DISARM_FORWARD, "disarm_forward") X(MAKE_STEP, "_make_step") X(PARENT, "parent")                         \
    X(BEGIN_DETACHED, "begin_detached") X(LENGTH_OF, "_length_of") X(NUM_YIELDED, "_num_yielded")

enum {
#define ENUMERATE(symbol, text) symbol,
    STEP_CORE_NAMES(ENUMERATE)
#undef ENUMERATE
    NAME_COUNT
};
static PyObject *names[NAME_COUNT];
static PyObject *names_one; /* the int 1 (_close's step count) */
/* The loop's (loop_spans.LoopSpans), the lengths' (loader_length.LoaderLengths) and the DataLoader iterator's
 * fields, read as PyObject_GetAttr reads them, from their slots where their classes have them (slots.c). */
static ot_slot loop_slots[NAME_COUNT], lengths_slots[NAME_COUNT], iterator_slots[NAME_COUNT];
#define AT(caches, name) names[name], &(caches)[name]

int ot_steps_init(void) {
    static const char *const texts[NAME_COUNT] = {
#define TEXT(symbol, text) text,
        STEP_CORE_NAMES(TEXT)
#undef TEXT
    };
    if (ot_intern_names(texts, names, NAME_COUNT) < 0) return -1;
    if (names_one == NULL && (names_one = PyLong_FromLong(1)) == NULL) return -1;
    return 0;
}

/* The tracker's Python method ``name`` (the whole hook, or a transition), its result passed on. */
static PyObject *python_kw(StepCore *self, int name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    /* Called as a method (PyObject_VectorcallMethod): looked up as getattr would, without a bound method made and
     * let go on every call (three a step: the opening, the step's making, the close). */
    PyObject *stack[8];
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + keywords < 8) {
        stack[0] = (PyObject *)self;
        for (Py_ssize_t index = 0; index < nargs + keywords; index++) stack[index + 1] = args[index];
        return PyObject_VectorcallMethod(names[name], stack, (size_t)(nargs + 1), kwnames);
    }
    PyObject *method = PyObject_GetAttr((PyObject *)self, names[name]);
    if (method == NULL) return NULL;
    PyObject *result = PyObject_Vectorcall(method, args, (size_t)nargs, kwnames);
    Py_DECREF(method);
    return result;
}

static PyObject *python(StepCore *self, int name, PyObject *const *args, Py_ssize_t nargs) {
    return python_kw(self, name, args, nargs, NULL);
}

/* An error in a hook: an Exception is logged once by the tracker (``_failed``) and never raised into the loop, as
 * the Python hooks' ``except Exception`` does; anything else (KeyboardInterrupt, SystemExit) goes on up. */
static PyObject *failed(StepCore *self, const char *hook) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    /* logged as the Python hooks' except blocks log it: the error is the handled exception, with its traceback */
    PyObject *text = PyUnicode_FromString(hook), *logger = NULL;
    if (text != NULL) { /* the logger looked up with the error set aside (a failed lookup: no log) */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        logger = PyObject_GetAttr((PyObject *)self, names[FAILED]);
        PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    int logged = ot_log_handled(logger, &text, 1);
    Py_XDECREF(logger);
    Py_XDECREF(text);
    if (logged < 0) return NULL;
    Py_RETURN_NONE;
}

/* A transition the tracker's Python code makes (``_close``, ``arm_forward``): errors go to ``_failed(hook)``. */
static PyObject *transition(StepCore *self, int name, const char *hook) {
    PyObject *result = python(self, name, NULL, 0);
    if (result == NULL) return failed(self, hook);
    Py_DECREF(result);
    Py_RETURN_NONE;
}

#define HOOK_ARGS StepCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames
#define KEYWORDS (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)

static PyObject *step_core_backward_begin(HOOK_ARGS) {
    /* A step open in this thread that is not waiting for its boundary: nothing to do. */
    int complete = flag(self->complete), fetched = flag(self->fetched);
    if (nargs == 0 && !KEYWORDS && !present(self->claim) && present(self->step) && owner_is_me(self) &&
        complete >= 0 && fetched >= 0 && !(complete && !fetched))
        Py_RETURN_NONE;
    return python_kw(self, PY_BACKWARD_BEGIN, args, nargs, kwnames);
}

static PyObject *step_core_backward_end(HOOK_ARGS) {
    if (nargs != 0 || KEYWORDS || self->backward_ends == NULL || !PyList_CheckExact(self->backward_ends))
        return python_kw(self, PY_BACKWARD_END, args, nargs, kwnames);
    if (!present(self->step) || !owner_is_me(self)) Py_RETURN_NONE;
    PyObject *end = PyLong_FromLongLong(now_ns());
    if (end == NULL) return failed(self, "backward_end");
    int appended = PyList_Append(self->backward_ends, end);
    Py_DECREF(end);
    if (appended < 0) return failed(self, "backward_end");
    Py_RETURN_NONE;
}

/* nested[key] as a count: 1 and *depth (*found 0 and *depth 0 when absent), 0 when not a plain count, -1 with an
 * exception. */
static int depth_of(StepCore *self, PyObject *key, long long *depth, int *found) {
    PyObject *value = PyDict_GetItemWithError(self->nested, key); /* an int key: no Python code runs */
    *found = value != NULL;
    if (value == NULL) {
        *depth = 0;
        return PyErr_Occurred() ? -1 : 1;
    }
    return count(value, depth);
}

static PyObject *step_core_optimizer_pre(HOOK_ARGS) {
    long long calls, depth;
    /* A step already open, nothing dormant: only the counts (a GradScaler skip is told apart by them). */
    if (nargs != 3 || KEYWORDS || present(self->claim) || !present(self->step) || self->nested == NULL ||
        !PyDict_CheckExact(self->nested) || !count(self->optimizer_calls, &calls) || calls == LLONG_MAX)
        return python_kw(self, PY_OPTIMIZER_PRE, args, nargs, kwnames);
    PyObject *key = PyLong_FromVoidPtr(args[0]); /* id(optimizer) */
    if (key == NULL) return failed(self, "optimizer_pre");
    int found, plain = depth_of(self, key, &depth, &found);
    if (plain <= 0 || depth == LLONG_MAX) {
        Py_DECREF(key);
        if (plain < 0) return failed(self, "optimizer_pre");
        return python_kw(self, PY_OPTIMIZER_PRE, args, nargs, kwnames);
    }
    PyObject *next = PyLong_FromLongLong(depth + 1);
    int done = next != NULL && set_count(&self->optimizer_calls, calls + 1) == 0 &&
               PyDict_SetItem(self->nested, key, next) == 0;
    Py_XDECREF(next);
    Py_DECREF(key);
    if (!done) return failed(self, "optimizer_pre");
    Py_RETURN_NONE;
}

static PyObject *step_core_optimizer_post(HOOK_ARGS) {
    long long steps, depth;
    if (nargs != 3 || KEYWORDS || !present(self->step) || !owner_is_me(self) || self->nested == NULL ||
        !PyDict_CheckExact(self->nested) || self->stepped == NULL || !PySet_CheckExact(self->stepped) ||
        self->enabled == NULL || !count(self->optimizer_steps, &steps) || steps == LLONG_MAX ||
        flag(self->fetched) < 0)
        return python_kw(self, PY_OPTIMIZER_POST, args, nargs, kwnames);
    PyObject *key = PyLong_FromVoidPtr(args[0]);
    if (key == NULL) return failed(self, "optimizer_post");
    int found, plain = depth_of(self, key, &depth, &found);
    if (plain <= 0 || depth == LLONG_MIN) {
        Py_DECREF(key);
        if (plain < 0) return failed(self, "optimizer_post");
        return python_kw(self, PY_OPTIMIZER_POST, args, nargs, kwnames);
    }
    /* depth = nested.pop(key, 1) - 1: the inner step() of a subclass's super().step() is not the step */
    if (!found) depth = 1;
    else if (PyDict_DelItem(self->nested, key) < 0) goto error;
    if (depth - 1 > 0) {
        PyObject *rest = PyLong_FromLongLong(depth - 1);
        int kept = rest != NULL && PyDict_SetItem(self->nested, key, rest) == 0;
        Py_XDECREF(rest);
        if (!kept) goto error;
        Py_DECREF(key);
        Py_RETURN_NONE;
    }
    PyObject *check = Py_NewRef(self->enabled); /* held: the call may rebind the field */
    PyObject *enabled = PyObject_CallNoArgs(check);
    Py_DECREF(check);
    int recording = enabled == NULL ? -1 : PyObject_IsTrue(enabled);
    Py_XDECREF(enabled);
    if (recording < 0) goto error;
    if (!recording) {
        Py_DECREF(key);
        Py_RETURN_NONE;
    }
    if (!present(self->step) || self->stepped == NULL || !PySet_CheckExact(self->stepped) ||
        !count(self->optimizer_steps, &steps) || steps == LLONG_MAX || flag(self->fetched) < 0) {
        /* the check ran Python code that changed the state: the Python method's, from here on */
        Py_DECREF(key);
        PyObject *call[2] = {args[0], Py_False};
        PyObject *result = python(self, STEPPED_ONCE, call, 2);
        if (result == NULL) return failed(self, "optimizer_post");
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    /* _stepped_once(optimizer, skipped=False) with the step open, inline (an override of it in a subclass is
     * not called on this path) */
    if (PySet_Add(self->stepped, key) < 0) goto error;
    Py_DECREF(key);
    if (set_count(&self->optimizer_steps, steps + 1) < 0) return failed(self, "optimizer_post");
    set_flag(&self->complete, 1);
    if (present(self->expected)) { /* every optimizer the iteration steps has stepped: the step ends */
        int all = PyObject_RichCompareBool(self->stepped, self->expected, Py_GE);
        if (all < 0) return failed(self, "optimizer_post");
        if (all) return transition(self, CLOSE, "optimizer_post");
    }
    if (flag(self->fetched) == 0) return transition(self, ARM_FORWARD, "optimizer_post");
    Py_RETURN_NONE;
error:
    Py_DECREF(key);
    return failed(self, "optimizer_post");
}

static PyObject *step_core_fetch_end(HOOK_ARGS) {
    if (nargs >= 1 && !KEYWORDS && args[0] == Py_None) Py_RETURN_NONE;
    long long begun, waited, span_min, ended = now_ns();
    /* A plain start and no error (a failed fetch is the Python method's); a wait, a threshold and a total
     * that are plain counts without overflow. */
    if (nargs < 1 || nargs > 2 || KEYWORDS || (nargs == 2 && args[1] != Py_None) || !count(args[0], &begun) ||
        !count(self->wait_ns, &waited) || !count(self->wait_span_min_ns, &span_min) ||
        flag(self->awaiting_input) < 0 || begun < 0 || begun > ended || waited > LLONG_MAX - (ended - begun))
        return python_kw(self, PY_FETCH_END, args, nargs, kwnames);
    PyObject *started = args[0];
    PyObject *step = present(self->step) && owner_is_me(self) ? Py_NewRef(self->step) : NULL;
    if (step != NULL) {
        if (set_count(&self->wait_ns, waited + (ended - begun)) < 0) {
            Py_DECREF(step);
            return failed(self, "fetch_end");
        }
        if (flag(self->awaiting_input) == 1) { /* the batch is in: the step's device work may begin */
            set_flag(&self->awaiting_input, 0);
            PyObject *device_step = PyObject_GetAttr(step, names[DEVICE_STEP]);
            PyObject *result = NULL;
            if (device_step != NULL && device_step != Py_None) result = PyObject_CallMethodNoArgs(step, names[INPUT_READY]);
            int ok = device_step != NULL && (device_step == Py_None || result != NULL);
            Py_XDECREF(device_step);
            Py_XDECREF(result);
            if (!ok) {
                Py_DECREF(step);
                return failed(self, "fetch_end");
            }
        }
    }
    if (ended - begun < span_min) {
        Py_XDECREF(step);
        Py_RETURN_NONE;
    }
    /* a wait long enough for its own span: the tracker's Python */
    PyObject *call[3] = {started, NULL, step != NULL ? step : Py_None};
    call[1] = PyLong_FromLongLong(ended);
    PyObject *result = call[1] != NULL ? python(self, WAIT_SPAN, call, 3) : NULL;
    Py_XDECREF(call[1]);
    Py_XDECREF(step);
    if (result == NULL) return failed(self, "fetch_end");
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* ``object.name()`` (a method of another object: the loop's, the lengths'), its result passed on. */
static PyObject *call_on(PyObject *object, int name, PyObject *argument) {
    PyObject *held = Py_NewRef(object); /* the call may rebind the field it came from */
    PyObject *result = argument == NULL ? PyObject_CallMethodNoArgs(held, names[name])
                                        : PyObject_CallMethodOneArg(held, names[name], argument);
    Py_DECREF(held);
    return result;
}

/* A field read again after Python code ran (which may have deleted it): a new reference, or NULL with the
 * AttributeError reading it from Python would raise. */
static PyObject *field_again(PyObject *value, const char *name) {
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "StepTracker has no attribute '%s'", name);
        return NULL;
    }
    return Py_NewRef(value);
}

/* LoaderLengths.exhausted(iterator), its usual case: the iterator it last asked about, a plain count past its
 * first batch. 1 or 0: exhausted or not; -1: not the usual case (the method's, which asks len() again). */
static int exhausted_here(PyObject *lengths, PyObject *iterator) {
    PyObject *pair = ot_slot_read(lengths, AT(lengths_slots, LENGTH_OF)), *yielded = NULL; /* held: its items */
    int answer = -1;
    if (pair == NULL || !PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) goto out;
    PyObject *reference = PyTuple_GET_ITEM(pair, 0), *length = PyTuple_GET_ITEM(pair, 1);
    if (!PyWeakref_CheckRefExact(reference) || (length != Py_None && !PyLong_CheckExact(length))) goto out;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *referent = NULL;
    if (PyWeakref_GetRef(reference, &referent) < 0) goto out;
    Py_XDECREF(referent); /* compared only: the caller holds the iterator */
#else
    PyObject *referent = PyWeakref_GET_OBJECT(reference);
#endif
    if (referent != iterator) goto out;
    yielded = ot_slot_read(iterator, AT(iterator_slots, NUM_YIELDED));
    if (yielded == NULL || !PyLong_CheckExact(yielded) || PyObject_Not(yielded) != 0) goto out;
    answer = length == Py_None ? 0 : PyObject_RichCompareBool(yielded, length, Py_GE); /* exact ints */
out:
    Py_XDECREF(pair);
    Py_XDECREF(yielded);
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return -2; /* KeyboardInterrupt and the like go on up */
        PyErr_Clear();
        answer = -1;
    }
    return answer;
}

/* fetch_begin(iterator): before a DataLoader hands out a batch (its stand-in checked suppression); returns the
 * wall-clock start (ns) of the wait, or None. The usual case here: nothing dormant or suspended, a loop object, a
 * plain state. Its parts that are other objects' (the loader's length, the loop's epochs, the step's begin) are
 * their Python methods, called from here; the rest is the Python method's (``_py_fetch_begin``). An error is
 * logged once and None returned, as there. Every field read after Python code ran is read again, checked. */
static PyObject *step_core_fetch_begin(HOOK_ARGS) {
    if (nargs != 1 || KEYWORDS || self->dormant != Py_False || self->suspended != Py_False || !present(self->lengths) ||
        !present(self->grad_enabled) || !present(self->loop) || self->step == NULL || self->owner == NULL ||
        (self->owner != Py_None && !PyLong_CheckExact(self->owner)) || flag(self->complete) < 0 ||
        self->number == NULL || self->rt == NULL)
        return python_kw(self, PY_FETCH_BEGIN, args, nargs, kwnames);
    PyObject *iterator = args[0], *loop = NULL;
    PyObject *lengths = Py_NewRef(self->lengths);
    int exhausted = exhausted_here(lengths, iterator);
    if (exhausted == -1) {
        PyObject *answer = call_on(lengths, EXHAUSTED, iterator);
        exhausted = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
    }
    Py_DECREF(lengths);
    if (exhausted < 0) return failed(self, "fetch_begin");
    int here;
    if (self->owner == NULL) { /* deleted by the call above: as Python's read of it would */
        PyErr_SetString(PyExc_AttributeError, "StepTracker has no attribute '_owner'");
        return failed(self, "fetch_begin");
    }
    if (self->owner == Py_None) { /* the first thread that fetches drives steps */
        PyObject *me = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
        if (me == NULL) return failed(self, "fetch_begin");
        Py_XSETREF(self->owner, me);
        here = 1;
    } else {
        here = owner_is_me(self);
    }
    if (here) {
        int open = present(self->step);
        if (open && self->complete == Py_True) { /* the boundary a completed step waited for */
            PyObject *closed = python(self, CLOSE, NULL, 0);
            if (closed == NULL) return failed(self, "fetch_begin");
            Py_DECREF(closed);
            open = 0;
        }
        if (!open && !exhausted) {
            PyObject *check = field_again(self->grad_enabled, "_grad_enabled");
            PyObject *enabled = check == NULL ? NULL : PyObject_CallNoArgs(check);
            Py_XDECREF(check);
            int training = enabled == NULL ? -1 : PyObject_IsTrue(enabled);
            Py_XDECREF(enabled);
            if (training < 0) return failed(self, "fetch_begin");
            if ((loop = field_again(self->loop, "loop")) == NULL) goto loop_error;
            if (training) {
                /* rt = self._rt if self._rt is not None and loop.started else self._training() */
                PyObject *rt = NULL;
                if (present(self->rt)) {
                    PyObject *started = ot_slot_get(loop, AT(loop_slots, STARTED));
                    int yes = started == NULL ? -1 : PyObject_IsTrue(started);
                    Py_XDECREF(started);
                    if (yes < 0) goto loop_error;
                    if (yes && (rt = field_again(self->rt, "_rt")) == NULL) goto loop_error;
                    if (rt == Py_None) Py_CLEAR(rt); /* rebound by the read above: asked for, as Python would */
                }
                if (rt == NULL && (rt = python(self, TRAINING, NULL, 0)) == NULL) goto loop_error;
                /* a new iterator is a new epoch (fetched()'s own check, here) */
                PyObject *epoch_of = ot_slot_get(loop, AT(loop_slots, EPOCH_ITERATOR));
                int same = 0;
                if (epoch_of != NULL && epoch_of != Py_None) {
                    PyObject *current = PyObject_CallNoArgs(epoch_of);
                    same = current == NULL ? -1 : current == iterator;
                    Py_XDECREF(current);
                }
                Py_XDECREF(epoch_of);
                PyObject *fetched = epoch_of == NULL || same < 0 ? NULL : same ? Py_NewRef(Py_None)
                                                                            : call_on(loop, FETCHED, iterator);
                PyObject *call[2] = {Py_True, rt};
                PyObject *opened = fetched == NULL ? NULL : python(self, OPEN, call, 2);
                Py_XDECREF(fetched);
                Py_DECREF(rt);
                if (opened == NULL) goto loop_error;
                Py_DECREF(opened);
            } else {
                PyObject *number = field_again(self->number, "_number");
                int after = number == NULL ? -1 : PyObject_IsTrue(number);
                Py_XDECREF(number);
                PyObject *begun = after <= 0 ? NULL : call_on(loop, BEGIN_EVALUATION, NULL);
                if (after < 0 || (after > 0 && begun == NULL)) goto loop_error;
                Py_XDECREF(begun); /* batches without gradients after training began: an evaluation */
            }
            Py_CLEAR(loop);
        }
        set_flag(&self->fetched, present(self->step));
    }
    if (exhausted) Py_RETURN_NONE; /* a fetch that only raises StopIteration is no wait */
    return PyLong_FromLongLong(now_ns());
loop_error:
    Py_XDECREF(loop);
    return failed(self, "fetch_begin");
}

/* _open(awaiting_input, rt): a step begins. The usual case here (a loop object, a runtime given); anything else is
 * the Python method's (``_py_open``). Errors are raised, as there. Fields read after Python code ran are read
 * again, checked. */
static PyObject *step_core_open(HOOK_ARGS) {
    if (nargs != 2 || KEYWORDS || flag(args[0]) < 0 || args[1] == Py_None || !present(self->loop) ||
        self->forward_handle == NULL || self->step_key == NULL || !PyUnicode_CheckExact(self->step_key) ||
        self->number == NULL || !PyLong_CheckExact(self->number))
        return python_kw(self, PY_OPEN, args, nargs, kwnames);
    PyObject *loop = Py_NewRef(self->loop), *step = NULL;
    PyObject *evaluation = ot_slot_get(loop, AT(loop_slots, EVALUATION));
    if (evaluation == NULL) goto error;
    if (evaluation != Py_None) {
        Py_DECREF(evaluation);
        evaluation = call_on(loop, END_EVALUATION, NULL);
        if (evaluation == NULL) goto error;
    }
    Py_DECREF(evaluation);
    if (self->forward_handle == NULL) {
        PyErr_SetString(PyExc_AttributeError, "StepTracker has no attribute '_forward_handle'");
        goto error;
    }
    if (self->forward_handle != Py_None) {
        PyObject *disarmed = python(self, DISARM_FORWARD, NULL, 0);
        if (disarmed == NULL) goto error;
        Py_DECREF(disarmed);
    }
    set_flag(&self->just_closed, 0);
    PyObject *made_args[2] = {field_again(self->step_key, "_step_key"), field_again(self->number, "_number")};
    step = made_args[0] == NULL || made_args[1] == NULL ? NULL : python(self, MAKE_STEP, made_args, 2);
    Py_XDECREF(made_args[0]), Py_XDECREF(made_args[1]);
    if (step == NULL) goto error;
    PyObject *parent = ot_slot_get(loop, AT(loop_slots, PARENT));
    if (parent == NULL) goto error;
    /* in the loop's context, where its epoch (or train) span is current: begun under it directly, in C for the
     * usual case (step_span.c; an error there is Duration._begin's, contained: the step stays open unbegun) */
    int here = ot_step_begin(step, args[1], parent); /* awaiting_input: a device timeline's, none there */
    if (here < 0) {
        PyObject *contained = failed(self, "Duration.begin");
        if (contained == NULL) {
            Py_DECREF(parent);
            goto error;
        }
        Py_DECREF(contained);
    } else if (here == 0) {
        PyObject *call[5] = {step, args[0], args[1], Py_True, parent};
        PyObject *begun = PyObject_VectorcallMethod(names[BEGIN_DETACHED], call, parent == Py_None ? 3 : 5, NULL);
        if (begun == NULL) {
            Py_DECREF(parent);
            goto error;
        }
        Py_DECREF(begun);
    }
    Py_DECREF(parent);
    if (set_count(&self->start_ns, now_ns()) < 0) goto error;
    Py_XSETREF(self->step, step); /* the step's reference is the field's now */
    Py_XSETREF(self->ctx, Py_NewRef(Py_None)); /* its context: made when work nests in it (_begin_in_step) */
    Py_XSETREF(self->awaiting_input, Py_NewRef(args[0]));
    Py_DECREF(loop);
    Py_RETURN_NONE;
error:
    Py_XDECREF(step);
    Py_DECREF(loop);
    return NULL;
}

/* _close(): the open step ends with its counts, and the state is the next step's. The usual case here (no
 * collectives, fewer than two backward passes, plain state); anything else is the Python method's (``_py_close``).
 * An error is raised, as the Python method raises it: its callers contain it. What the end's attributes need is
 * taken before any Python code runs; what comes after the step's end (which runs Python code) is read again, as
 * the Python method reads it then. The objects let go here are released last: a finaliser sees the new state. */
static PyObject *step_core_close(HOOK_ARGS) {
    long long steps, waited;
    int complete = flag(self->complete);
    if (nargs != 0 || KEYWORDS || self->step == NULL || present(self->collectives) || complete < 0 ||
        flag(self->fetched) < 0 || self->backward_ends == NULL || !PyList_CheckExact(self->backward_ends) ||
        PyList_GET_SIZE(self->backward_ends) >= 2 || self->stepped == NULL || !PySet_CheckExact(self->stepped) ||
        self->expected == NULL || !count(self->optimizer_steps, &steps) || !count(self->wait_ns, &waited) ||
        self->number == NULL || self->ctx == NULL || self->end_keys == NULL || !PyTuple_CheckExact(self->end_keys) ||
        PyTuple_GET_SIZE(self->end_keys) != 4)
        return python_kw(self, PY_CLOSE, args, nargs, kwnames);
    if (self->step == Py_None) Py_RETURN_NONE;
    /* Before any Python code runs: the end's attributes and the optimizers this iteration stepped. */
    PyObject *frozen = NULL;
    if (complete && self->expected == Py_None && (frozen = PyFrozenSet_New(self->stepped)) == NULL) return NULL;
    PyObject *ends = PyDict_New();
    PyObject *values[4] = {PyLong_FromSsize_t(PyList_GET_SIZE(self->backward_ends)), PyLong_FromLongLong(steps),
                           Py_NewRef(steps == 0 ? Py_True : Py_False), PyFloat_FromDouble((double)waited / 1e9)};
    int built = ends != NULL;
    for (int index = 0; index < 4; index++)
        built = built && values[index] != NULL &&
                PyDict_SetItem(ends, PyTuple_GET_ITEM(self->end_keys, index), values[index]) == 0;
    for (int index = 0; index < 4; index++) Py_XDECREF(values[index]);
    if (!built) {
        Py_XDECREF(ends);
        Py_XDECREF(frozen);
        return NULL;
    }
    /* The Python method's order: the step and its context are let go first (released at the end, here). */
    PyObject *step = self->step, *old_ctx = self->ctx, *old_expected = NULL;
    self->step = Py_NewRef(Py_None), self->ctx = Py_NewRef(Py_None);
    if (frozen != NULL) old_expected = self->expected, self->expected = frozen;
    /* the step's end in C for the usual case (step_span.c; an error there is Duration.end's, contained) */
    int here = ot_step_end(step, ends);
    PyObject *ended = here < 0 ? failed(self, "Duration.end") : here == 0 ? PyObject_CallMethodOneArg(step, names[END], ends)
                                                                         : Py_NewRef(Py_None);
    Py_DECREF(ends);
    PyObject *result = NULL;
    if (ended == NULL) goto done;
    Py_DECREF(ended);
    /* After the end (Python code): self._number += 1; fetched = self._fetched; self._reset(); ... */
    PyObject *number = field_again(self->number, "_number");
    PyObject *next = number == NULL ? NULL : PyNumber_Add(number, names_one);
    Py_XDECREF(number);
    if (next == NULL) goto done;
    Py_XSETREF(self->number, next);
    PyObject *was_fetched = field_again(self->fetched, "_fetched");
    int fetched = was_fetched == NULL ? -1 : PyObject_IsTrue(was_fetched);
    Py_XDECREF(was_fetched);
    if (fetched < 0) goto done;
    PyObject *fresh_ends = PyList_New(0), *fresh_stepped = PySet_New(NULL);
    if (fresh_ends == NULL || fresh_stepped == NULL) {
        Py_XDECREF(fresh_ends);
        Py_XDECREF(fresh_stepped);
        goto done;
    }
    Py_XSETREF(self->backward_ends, fresh_ends);
    Py_XSETREF(self->stepped, fresh_stepped);
    if (set_count(&self->start_ns, 0) < 0 || set_count(&self->optimizer_steps, 0) < 0 ||
        set_count(&self->wait_ns, 0) < 0)
        goto done;
    set_flag(&self->fetched, 0);
    set_flag(&self->complete, 0);
    set_flag(&self->just_closed, 1);
    if (!fetched) { /* a DataLoader-driven loop's next fetch opens the next step; otherwise its forward does */
        PyObject *armed = python(self, ARM_FORWARD, NULL, 0);
        if (armed == NULL) goto done;
        Py_DECREF(armed);
    }
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(step);
    Py_XDECREF(old_ctx);
    Py_XDECREF(old_expected);
    return result;
}

/* A copy of ``template`` (an object of a class made of __slots__ alone: StepDuration) whose every slot holds what
 * the template's does, except ``_attributes``: a copy of the template's dict with ``key`` set to ``number``. NULL
 * with an exception, or NULL without one when the class is not one this copies (a __dict__, a slot of another
 * kind, no ``_attributes`` dict). */
static PyObject *copy_step(StepCore *self, PyObject *template, PyObject *key, PyObject *number) {
    PyTypeObject *type = Py_TYPE(template);
    Py_ssize_t offset = self->attributes_offset; /* a local: the dict copy below may run Python code */
    if ((PyObject *)type == self->copied_type) { /* checked before: only the copy (a class's slots never change) */
        PyObject *attributes = *(PyObject **)((char *)template + offset);
        if (attributes == NULL || !PyDict_CheckExact(attributes)) return NULL;
        goto copy;
    }
    if (type->tp_dictoffset != 0 || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_alloc == NULL) return NULL;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) return NULL;
#endif
    int attributes_seen = 0;
    for (PyTypeObject *base = type; base != NULL && base != &PyBaseObject_Type; base = base->tp_base) {
        /* classes made by a class statement only (their dealloc is the tracker's own class's, subtype_dealloc):
         * a C extension's heap type may keep state outside its members */
        if (!(base->tp_flags & Py_TPFLAGS_HEAPTYPE) || base->tp_dictoffset != 0 ||
            base->tp_dealloc != Py_TYPE(self)->tp_dealloc)
            return NULL;
        for (PyMemberDef *member = base->tp_members; member != NULL && member->name != NULL; member++) {
            if (member->type != T_OBJECT_EX || (member->flags & READONLY) ||
                member->offset < (Py_ssize_t)sizeof(PyObject) || member->offset + (Py_ssize_t)sizeof(PyObject *) >
                type->tp_basicsize)
                return NULL;
            if (!attributes_seen && strcmp(member->name, "_attributes") == 0) { /* the class's own, not a base's */
                PyObject *value = *(PyObject **)((char *)template + member->offset);
                if (value == NULL || !PyDict_CheckExact(value)) return NULL;
                attributes_seen = 1;
                offset = member->offset;
            }
        }
    }
    if (!attributes_seen) return NULL;
    Py_XSETREF(self->copied_type, Py_NewRef((PyObject *)type)); /* checked: this class and where it keeps them */
    self->attributes_offset = offset;
copy:;
    PyObject *copy = type->tp_alloc(type, 0);
    if (copy == NULL) return NULL;
    for (PyTypeObject *base = type; base != NULL && base != &PyBaseObject_Type; base = base->tp_base)
        for (PyMemberDef *member = base->tp_members; member != NULL && member->name != NULL; member++) {
            PyObject *value = *(PyObject **)((char *)template + member->offset);
            if (value != NULL && member->offset == offset) {
                value = PyDict_Copy(value);
                if (value == NULL || PyDict_SetItem(value, key, number) < 0) {
                    Py_XDECREF(value);
                    Py_DECREF(copy);
                    return NULL;
                }
            } else {
                Py_XINCREF(value);
            }
            *(PyObject **)((char *)copy + member->offset) = value;
        }
    return copy;
}

/* _make_step(key, number): the tracker's next step, a StepDuration whose attributes say ``key`` = ``number``. The
 * first call makes it with the Python method (the class's own __init__, as the fallback does) and keeps it as the
 * template; every later one copies the template (``copy_step``): the same object, without __init__'s ~80
 * bytecodes and its attribute conversion (about 5 000 instructions a step). */
static PyObject *step_core_make_step(HOOK_ARGS) {
    if (nargs != 2 || KEYWORDS || !PyUnicode_CheckExact(args[0]) || !PyLong_CheckExact(args[1]))
        return python_kw(self, PY_MAKE_STEP, args, nargs, kwnames);
    if (!present(self->template)) {
        PyObject *made = python(self, PY_MAKE_STEP, args, 2);
        if (made == NULL) return NULL;
        Py_XSETREF(self->template, made); /* kept, never begun: every later step is a copy of it */
    }
    PyObject *template = Py_NewRef(self->template);
    PyObject *copy = copy_step(self, template, args[0], args[1]);
    Py_DECREF(template);
    if (copy != NULL) return copy;
    if (PyErr_Occurred()) return NULL;
    return python(self, PY_MAKE_STEP, args, 2); /* a class this does not copy: made as the fallback makes it */
}

static PyMethodDef step_core_methods[] = {
    {"backward_begin", (PyCFunction)(void (*)(void))step_core_backward_begin, METH_FASTCALL | METH_KEYWORDS,
     "Before torch.autograd.backward (its stand-in checked suppression)."},
    {"backward_end", (PyCFunction)(void (*)(void))step_core_backward_end, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"optimizer_pre", (PyCFunction)(void (*)(void))step_core_optimizer_pre, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"optimizer_post", (PyCFunction)(void (*)(void))step_core_optimizer_post, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"fetch_begin", (PyCFunction)(void (*)(void))step_core_fetch_begin, METH_FASTCALL | METH_KEYWORDS,
     "Before DataLoader hands out a batch (its stand-in checked suppression): the wait's start (ns), or None."},
    {"_open", (PyCFunction)(void (*)(void))step_core_open, METH_FASTCALL | METH_KEYWORDS,
     "A step begins (steps.py's _open)."},
    {"_close", (PyCFunction)(void (*)(void))step_core_close, METH_FASTCALL | METH_KEYWORDS,
     "End the open step (steps.py's _close)."},
    {"_make_step", (PyCFunction)(void (*)(void))step_core_make_step, METH_FASTCALL | METH_KEYWORDS,
     "The tracker's next step, a copy of the first one it made (steps.py's _make_step)."},
    {"fetch_end", (PyCFunction)(void (*)(void))step_core_fetch_end, METH_FASTCALL | METH_KEYWORDS,
     "Account the wait to the step; a span only when it blocked (or failed)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject StepCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_training._native.StepCore",
    .tp_basicsize = sizeof(StepCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The torch step tracker's hot state and the usual case of its per-step hooks (a base class only).",
    .tp_new = step_core_new,
    .tp_dealloc = (destructor)step_core_dealloc,
    .tp_traverse = (traverseproc)step_core_traverse,
    .tp_clear = (inquiry)step_core_clear,
    .tp_members = step_core_members,
    .tp_methods = step_core_methods,
};

/* A fake CUDA driver for the device resolver's tests on machines without a GPU (tests/test_device_native.py
 * builds it as a shared library and hands its path to DevicePoller). It has the driver's entry points that
 * device.c loads, with the driver's semantics where the resolver depends on them: events complete in the
 * order they were recorded on a stream, only when the test says so (fake_complete), at the wall-clock time
 * of that call; an event recorded on a stream the "driver" created (the resolver's side stream) completes at
 * once; a stream may be said to capture; a query may be made to fail, or to hang until released. Thread-safe: the training thread records,
 * the resolver's thread queries. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct fake_event {
    int recorded, done;
    double at_ms;
    uint64_t order;
} fake_event;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t unblocked = PTHREAD_COND_INITIALIZER;
static int context_value;
static int no_context, capturing, fail_queries, block_queries, created_streams;
static uint64_t recorded_order, completed_order, queries, events_live;
static void *side_streams[16];
#define REGISTRY 65536u
static fake_event *by_order[REGISTRY]; /* recorded events by their order, until completed or destroyed */

static double wall_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

int cuCtxGetCurrent(void **context) {
    *context = no_context ? NULL : &context_value;
    return 0;
}

int cuCtxSetCurrent(void *context) {
    return context == &context_value ? 0 : 201; /* CUDA_ERROR_INVALID_CONTEXT */
}

int cuEventCreate(void **event, unsigned int flags) {
    (void)flags;
    fake_event *created = calloc(1, sizeof *created);
    if (created == NULL) return 2;
    pthread_mutex_lock(&lock);
    events_live++;
    pthread_mutex_unlock(&lock);
    *event = created;
    return 0;
}

int cuEventDestroy_v2(void *event) {
    fake_event *destroyed = event;
    pthread_mutex_lock(&lock);
    if (destroyed->order && by_order[destroyed->order % REGISTRY] == destroyed) by_order[destroyed->order % REGISTRY] = NULL;
    events_live--;
    pthread_mutex_unlock(&lock);
    free(event);
    return 0;
}

static int is_side(void *stream) {
    for (int index = 0; index < created_streams && index < 16; index++)
        if (side_streams[index] == stream) return 1;
    return 0;
}

int cuEventRecord(void *event, void *stream) {
    fake_event *recorded = event;
    pthread_mutex_lock(&lock);
    recorded->recorded = 1;
    if (is_side(stream)) {
        recorded->done = 1;
        recorded->at_ms = wall_ms();
        recorded->order = 0;
    } else {
        if (recorded->order && by_order[recorded->order % REGISTRY] == recorded) by_order[recorded->order % REGISTRY] = NULL;
        recorded->done = 0;
        recorded->order = ++recorded_order;
        by_order[recorded->order % REGISTRY] = recorded;
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

int cuEventQuery(void *event) {
    fake_event *queried = event;
    pthread_mutex_lock(&lock);
    while (block_queries) pthread_cond_wait(&unblocked, &lock); /* a hung device: the call does not return */
    queries++;
    int result;
    if (fail_queries) result = 999; /* CUDA_ERROR_UNKNOWN */
    else result = queried->done ? 0 : 600;
    pthread_mutex_unlock(&lock);
    return result;
}

int cuEventElapsedTime(float *milliseconds, void *start, void *end) {
    fake_event *from = start, *to = end;
    pthread_mutex_lock(&lock);
    int ready = from->done && to->done;
    if (ready) *milliseconds = (float)(to->at_ms - from->at_ms);
    pthread_mutex_unlock(&lock);
    return ready ? 0 : 600;
}

int cuStreamIsCapturing(void *stream, int *status) {
    (void)stream;
    *status = capturing;
    return 0;
}

int cuStreamCreate(void **stream, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    int index = created_streams++;
    void *made = malloc(1);
    if (index < 16) side_streams[index] = made;
    pthread_mutex_unlock(&lock);
    *stream = made;
    return 0;
}

int cuStreamDestroy_v2(void *stream) {
    (void)stream; /* kept, so a late record on it still reads as the side stream's */
    return 0;
}

/* -- the tests' controls ---------------------------------------------------------------------------------- */

/* Complete the next `count` events recorded on the training streams (in record order), at this call's time. */
void fake_complete(int count) {
    pthread_mutex_lock(&lock);
    double now = wall_ms();
    for (; count > 0 && completed_order < recorded_order; count--) {
        fake_event *event = by_order[++completed_order % REGISTRY];
        if (event != NULL && event->order == completed_order) {
            event->done = 1;
            event->at_ms = now;
            by_order[completed_order % REGISTRY] = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
}

/* Forget the events a test left recorded and never completed: the next test's complete in its own order. */
void fake_reset(void) {
    pthread_mutex_lock(&lock);
    for (uint64_t order = completed_order + 1; order <= recorded_order; order++) by_order[order % REGISTRY] = NULL;
    completed_order = recorded_order;
    pthread_mutex_unlock(&lock);
}

void fake_set(int which, int value) {
    pthread_mutex_lock(&lock);
    if (which == 0) no_context = value;
    else if (which == 1) capturing = value;
    else if (which == 2) fail_queries = value;
    else if (which == 3) {
        block_queries = value;
        pthread_cond_broadcast(&unblocked);
    }
    pthread_mutex_unlock(&lock);
}

uint64_t fake_count(int which) {
    pthread_mutex_lock(&lock);
    uint64_t value = which == 0 ? queries : which == 1 ? events_live : recorded_order;
    pthread_mutex_unlock(&lock);
    return value;
}

/* The device resolver's thread (device.h says what and why). */
#define _GNU_SOURCE
#include "device.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QUEUE_SIZE 8192u /* markers in flight: ~4000 steps of host run-ahead, far past any launch queue */
#define POOL_SIZE 256u
#define ANCHOR_EVERY_NS 10000000000ll
#define ANCHOR_RETRY_NS 1000000000ll
#define ANCHOR_WAIT_NS 2000000ll
#define ANCHOR_MAX_BRACKET_NS 200000ll
#define ANCHOR_EVENTS 4

typedef struct {
    uint64_t token;
    void *event; /* NULL: a host-timed marker */
    int64_t host_ns;
    uint8_t which;
} entry;

struct ot_poller {
    ot_cuda cuda;
    ot_device_sink sink;
    void *sink_context;
    int64_t poll_ns, idle_ns;
    void *context;
    pthread_t thread;

    pthread_mutex_t lock; /* the queue, the pool, the counters and the flags below; the sink is called under it */
    pthread_cond_t wake;
    entry queue[QUEUE_SIZE];
    uint64_t head, tail;
    void *pool[POOL_SIZE];
    uint32_t pooled;
    int stopping, orphaned, exited, failed;
    int64_t stop_deadline; /* monotonic ns */
    ot_poller_stats stats;

    pthread_mutex_t cuda_lock; /* held by the thread across its CUDA calls; captures change under it */
    int captures;
    int captures_hint; /* a copy the training thread reads without the lock (atomically) */
    int forgotten;     /* after fork, in the child: no lock is taken again */

    /* The thread's own. */
    void *side;
    void *anchor_events[ANCHOR_EVENTS];
    int anchor; /* index into anchor_events, -1 while there is none */
    int64_t anchor_ns, anchored_at, last_incomplete_ns;
};

static int64_t clock_ns(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return (int64_t)now.tv_sec * 1000000000ll + now.tv_nsec;
}

static void say(char *why, size_t size, const char *text, const char *detail) {
    if (why != NULL && size) snprintf(why, size, "%s%s%s", text, detail ? ": " : "", detail ? detail : "");
}

int ot_cuda_load(ot_cuda *cuda, const char *path, int only_loaded, char *why, size_t why_size) {
    memset(cuda, 0, sizeof *cuda);
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL | (only_loaded ? RTLD_NOLOAD : 0));
    if (library == NULL) {
        const char *error = dlerror();
        say(why, why_size, only_loaded ? "the CUDA driver is not loaded in this process" : "cannot load the CUDA driver",
            error);
        return -1;
    }
    struct {
        void **slot;
        const char *names[2];
    } wanted[] = {
        {(void **)&cuda->ctx_get_current, {"cuCtxGetCurrent", NULL}},
        {(void **)&cuda->ctx_set_current, {"cuCtxSetCurrent", NULL}},
        {(void **)&cuda->event_create, {"cuEventCreate", NULL}},
        {(void **)&cuda->event_destroy, {"cuEventDestroy_v2", "cuEventDestroy"}},
        {(void **)&cuda->event_record, {"cuEventRecord", NULL}},
        {(void **)&cuda->event_query, {"cuEventQuery", NULL}},
        {(void **)&cuda->event_elapsed_time, {"cuEventElapsedTime", NULL}},
        {(void **)&cuda->stream_is_capturing, {"cuStreamIsCapturing", NULL}},
        {(void **)&cuda->stream_create, {"cuStreamCreate", NULL}},
        {(void **)&cuda->stream_destroy, {"cuStreamDestroy_v2", "cuStreamDestroy"}},
    };
    for (size_t index = 0; index < sizeof wanted / sizeof wanted[0]; index++) {
        void *found = NULL;
        for (int name = 0; name < 2 && found == NULL && wanted[index].names[name] != NULL; name++)
            found = dlsym(library, wanted[index].names[name]);
        if (found == NULL) {
            say(why, why_size, "the CUDA driver lacks", wanted[index].names[0]);
            dlclose(library);
            memset(cuda, 0, sizeof *cuda);
            return -1;
        }
        *wanted[index].slot = found;
    }
    cuda->library = library;
    return 0;
}

/* -- the thread ------------------------------------------------------------------------------------------ */

/* Up to three samples on the side stream; the narrowest bracket under the limit becomes the anchor. Called
 * with cuda_lock held and no capture in progress. */
static void reanchor(ot_poller *p) {
    int64_t now = clock_ns(CLOCK_MONOTONIC);
    if (p->side == NULL || now - p->anchored_at < (p->anchor < 0 ? ANCHOR_RETRY_NS : ANCHOR_EVERY_NS)) return;
    p->anchored_at = now;
    int best = -1;
    int64_t best_width = 0, best_ns = 0;
    for (int index = 0, samples = 0; index < ANCHOR_EVENTS && samples < 3; index++) {
        if (index == p->anchor) continue; /* the anchor in use is never recorded again */
        samples++;
        void *event = p->anchor_events[index];
        int64_t before = clock_ns(CLOCK_REALTIME);
        if (p->cuda.event_record(event, p->side) != 0) return;
        int done;
        for (;;) {
            int result = p->cuda.event_query(event);
            done = result == 0;
            if (result != OT_CUDA_NOT_READY) break;
            if (clock_ns(CLOCK_REALTIME) - before > ANCHOR_WAIT_NS) break; /* the device is busy: next time */
        }
        int64_t after = clock_ns(CLOCK_REALTIME);
        if (!done) return;
        int64_t width = after - before;
        if (width <= ANCHOR_MAX_BRACKET_NS && (best < 0 || width < best_width))
            best = index, best_width = width, best_ns = before + width / 2;
    }
    if (best >= 0) p->anchor = best, p->anchor_ns = best_ns;
}

/* When `event` completed: from the anchor, else from its own poll bracket. */
static int64_t completed_ns(ot_poller *p, void *event, int64_t after) {
    if (p->anchor >= 0) {
        float milliseconds;
        if (p->cuda.event_elapsed_time(&milliseconds, p->anchor_events[p->anchor], event) == 0)
            return p->anchor_ns + (int64_t)((double)milliseconds * 1e6);
    }
    int64_t since = p->last_incomplete_ns;
    return since && since < after ? since + (after - since) / 2 : after;
}

/* Resolve what has completed, oldest first: 1 if any, 0 if none, -1 when a CUDA call failed. */
static int resolve(ot_poller *p) {
    int progressed = 0, failed = 0;
    pthread_mutex_lock(&p->cuda_lock);
    if (p->captures) {
        pthread_mutex_unlock(&p->cuda_lock);
        return 0;
    }
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int empty = p->head == p->tail || p->orphaned;
        entry item = p->queue[p->head % QUEUE_SIZE];
        pthread_mutex_unlock(&p->lock);
        if (empty) break;
        int64_t ns = item.host_ns;
        if (item.event != NULL) {
            int64_t before = clock_ns(CLOCK_REALTIME);
            int result = p->cuda.event_query(item.event);
            if (result == OT_CUDA_NOT_READY) {
                p->last_incomplete_ns = before;
                break;
            }
            if (result != 0) {
                failed = 1;
                break;
            }
            ns = completed_ns(p, item.event, clock_ns(CLOCK_REALTIME));
            p->last_incomplete_ns = 0;
        }
        void *destroy = NULL;
        pthread_mutex_lock(&p->lock);
        if (!p->orphaned && p->sink(p->sink_context, item.token, item.which, ns) != 0) p->stats.dropped++;
        p->head++;
        p->stats.resolved++;
        if (item.event != NULL) {
            if (p->pooled < POOL_SIZE)
                p->pool[p->pooled++] = item.event;
            else
                destroy = item.event;
        }
        pthread_mutex_unlock(&p->lock);
        if (destroy != NULL) p->cuda.event_destroy(destroy);
        progressed = 1;
    }
    if (!failed) reanchor(p);
    pthread_mutex_unlock(&p->cuda_lock);
    return failed ? -1 : progressed;
}

/* The pooled events and those of markers never resolved (destroying a pending event is allowed: the driver
 * releases it once the device reaches it). Not while a graph is captured: they are leaked then. */
static void release_events(ot_poller *p) {
    if (p->captures) return;
    for (uint32_t index = 0; index < p->pooled; index++) p->cuda.event_destroy(p->pool[index]);
    p->pooled = 0;
    for (; p->head != p->tail; p->head++) {
        void *event = p->queue[p->head % QUEUE_SIZE].event;
        if (event != NULL) p->cuda.event_destroy(event);
    }
}

static void *run(void *argument) {
    ot_poller *p = argument;
    int ok = p->cuda.ctx_set_current(p->context) == 0;
    if (ok && p->cuda.stream_create(&p->side, 1 /* CU_STREAM_NON_BLOCKING */) != 0) p->side = NULL;
    for (int index = 0; ok && p->side != NULL && index < ANCHOR_EVENTS; index++)
        if (p->cuda.event_create(&p->anchor_events[index], 0) != 0) {
            p->anchor_events[index] = NULL;
            p->cuda.stream_destroy(p->side); /* no anchoring: each marker's poll bracket times it */
            p->side = NULL;
        }
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int stop = p->orphaned ||
                   (p->stopping && (p->head == p->tail || clock_ns(CLOCK_MONOTONIC) >= p->stop_deadline));
        pthread_mutex_unlock(&p->lock);
        if (stop) break;
        int result = ok ? resolve(p) : -1;
        if (result < 0) {
            pthread_mutex_lock(&p->lock);
            p->failed = 1;
            p->stats.failed = 1;
            if (!p->orphaned) p->sink(p->sink_context, 0, OT_DEVICE_FAILED, clock_ns(CLOCK_REALTIME));
            pthread_mutex_unlock(&p->lock);
            break;
        }
        if (result == 0) {
            pthread_mutex_lock(&p->lock);
            if (!p->stopping || p->head != p->tail) {
                int64_t wait = p->head != p->tail ? p->poll_ns : p->idle_ns;
                int64_t until = clock_ns(CLOCK_MONOTONIC) + wait;
                struct timespec deadline = {until / 1000000000ll, until % 1000000000ll};
                pthread_cond_timedwait(&p->wake, &p->lock, &deadline);
            }
            pthread_mutex_unlock(&p->lock);
        }
    }
    pthread_mutex_lock(&p->cuda_lock);
    if (!p->captures) { /* the anchor events and the side stream are released as the device finishes with them */
        for (int index = 0; index < ANCHOR_EVENTS; index++)
            if (p->anchor_events[index] != NULL) p->cuda.event_destroy(p->anchor_events[index]);
        if (p->side != NULL) p->cuda.stream_destroy(p->side);
    }
    pthread_mutex_unlock(&p->cuda_lock);
    pthread_mutex_lock(&p->lock);
    p->exited = 1;
    int orphaned = p->orphaned;
    pthread_mutex_unlock(&p->lock);
    if (orphaned) { /* stop() gave up waiting: the poller is this thread's to free */
        release_events(p);
        pthread_mutex_destroy(&p->lock);
        pthread_mutex_destroy(&p->cuda_lock);
        pthread_cond_destroy(&p->wake);
        free(p);
    }
    return NULL;
}

/* -- the training thread --------------------------------------------------------------------------------- */

ot_poller *ot_poller_start(const ot_cuda *cuda, ot_device_sink sink, void *sink_context, uint32_t poll_us,
                           uint32_t idle_us, char *why, size_t why_size) {
    void *context = NULL;
    if (cuda->ctx_get_current(&context) != 0 || context == NULL) {
        say(why, why_size, "no CUDA context is current on this thread", NULL);
        return NULL;
    }
    ot_poller *p = calloc(1, sizeof *p);
    if (p == NULL) {
        say(why, why_size, "out of memory", NULL);
        return NULL;
    }
    p->cuda = *cuda;
    p->sink = sink, p->sink_context = sink_context;
    p->poll_ns = (int64_t)(poll_us ? poll_us : 1) * 1000, p->idle_ns = (int64_t)(idle_us ? idle_us : 1) * 1000;
    p->context = context;
    p->anchor = -1;
    p->anchored_at = clock_ns(CLOCK_MONOTONIC) - ANCHOR_EVERY_NS;
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&p->wake, &attributes);
    pthread_condattr_destroy(&attributes);
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->cuda_lock, NULL);
    /* The thread blocks every signal: they are the process's (Python's handlers run on the main thread). */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int error = pthread_create(&p->thread, NULL, run, p);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (error != 0) {
        say(why, why_size, "cannot start the device resolver thread", strerror(error));
        pthread_mutex_destroy(&p->lock);
        pthread_mutex_destroy(&p->cuda_lock);
        pthread_cond_destroy(&p->wake);
        free(p);
        return NULL;
    }
    return p;
}

static int push(ot_poller *p, uint64_t token, uint8_t which, void *event, int64_t host_ns) {
    pthread_mutex_lock(&p->lock);
    int ok = !p->failed && !p->stopping && p->tail - p->head < QUEUE_SIZE;
    if (ok) {
        p->queue[p->tail % QUEUE_SIZE] = (entry){token, event, host_ns, which};
        p->tail++;
        p->stats.marked++;
    } else {
        p->stats.refused++;
    }
    pthread_mutex_unlock(&p->lock);
    return ok;
}

int ot_poller_mark(ot_poller *p, uint64_t token, uint8_t which, void *stream) {
    if (p->forgotten || __atomic_load_n(&p->captures_hint, __ATOMIC_ACQUIRE)) return 0;
    int status = 0;
    if (p->cuda.stream_is_capturing(stream, &status) != 0 || status != 0) return 0;
    pthread_mutex_lock(&p->lock);
    int refuse = p->failed || p->stopping || p->tail - p->head >= QUEUE_SIZE;
    void *event = !refuse && p->pooled ? p->pool[--p->pooled] : NULL;
    if (refuse) p->stats.refused++;
    pthread_mutex_unlock(&p->lock);
    if (refuse) return 0;
    if (event == NULL && p->cuda.event_create(&event, 0 /* CU_EVENT_DEFAULT: timed */) != 0) return 0;
    if (p->cuda.event_record(event, stream) != 0 || !push(p, token, which, event, 0)) {
        pthread_mutex_lock(&p->lock);
        void *destroy = p->pooled < POOL_SIZE ? NULL : event;
        if (destroy == NULL) p->pool[p->pooled++] = event;
        pthread_mutex_unlock(&p->lock);
        if (destroy != NULL) p->cuda.event_destroy(destroy);
        return 0;
    }
    return 1;
}

int ot_poller_host(ot_poller *p, uint64_t token, uint8_t which, int64_t ns) {
    if (p->forgotten) return 0;
    return push(p, token, which, NULL, ns);
}

void ot_poller_capture(ot_poller *p, int delta) {
    if (p->forgotten) return;
    pthread_mutex_lock(&p->cuda_lock); /* waits for the thread to be out of its CUDA calls */
    p->captures += delta;
    if (p->captures < 0) p->captures = 0;
    __atomic_store_n(&p->captures_hint, p->captures, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&p->cuda_lock);
}

void ot_poller_stats_get(ot_poller *p, ot_poller_stats *stats) {
    if (p->forgotten) {
        *stats = p->stats;
        return;
    }
    pthread_mutex_lock(&p->lock);
    *stats = p->stats;
    stats->pending = p->tail - p->head;
    pthread_mutex_unlock(&p->lock);
}

static void free_joined(ot_poller *p) {
    release_events(p);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->cuda_lock);
    pthread_cond_destroy(&p->wake);
    free(p);
}

int ot_poller_stop(ot_poller *p, double timeout_s, ot_poller_stats *final) {
    if (p->forgotten) { /* the child of a fork: no thread, and locks that may be held forever */
        if (final != NULL) *final = p->stats;
        free(p);
        return 0;
    }
    if (timeout_s < 0) timeout_s = 0;
    int64_t timeout_ns = (int64_t)(timeout_s * 1e9);
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    p->stop_deadline = clock_ns(CLOCK_MONOTONIC) + timeout_ns;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    /* The thread leaves by the deadline unless a CUDA call keeps it (a hung device): a little more for that. */
    int64_t until = clock_ns(CLOCK_REALTIME) + timeout_ns + 100000000ll;
    struct timespec deadline = {until / 1000000000ll, until % 1000000000ll};
    int error = pthread_timedjoin_np(p->thread, NULL, &deadline);
    if (error == 0) {
        if (final != NULL) *final = p->stats, final->pending = p->tail - p->head;
        free_joined(p);
        return 0;
    }
    pthread_mutex_lock(&p->lock);
    if (final != NULL) *final = p->stats, final->pending = p->tail - p->head;
    int exited = p->exited;
    p->orphaned = 1; /* from now on the sink is not called, and the thread frees the poller */
    pthread_mutex_unlock(&p->lock);
    if (exited) { /* it left between the timeout and the lock: join it after all */
        pthread_join(p->thread, NULL);
        free_joined(p);
        return 0;
    }
    pthread_detach(p->thread);
    return 1;
}

void ot_poller_forget(ot_poller *p) {
    p->forgotten = 1;
}

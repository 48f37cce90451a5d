/* The device resolver's thread (device.c) against the fake driver (fake_cuda.c, linked in), run by
 * scripts/native-check under ASan + UBSan and under ThreadSanitizer: markers resolve in stream order, a
 * capture stops the queries, a failing driver is reported once, stop() is bounded with markers pending, and a
 * thread stuck in a driver call (a hung device) is left to free itself without touching freed memory. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../device.h"
#include "check.h"

int cuCtxGetCurrent(void **context);
int cuCtxSetCurrent(void *context);
int cuEventCreate(void **event, unsigned int flags);
int cuEventDestroy_v2(void *event);
int cuEventRecord(void *event, void *stream);
int cuEventQuery(void *event);
int cuEventElapsedTime(float *milliseconds, void *start, void *end);
int cuStreamIsCapturing(void *stream, int *status);
int cuStreamCreate(void **stream, unsigned int flags);
int cuStreamDestroy_v2(void *stream);
void fake_complete(int count);
void fake_reset(void);
void fake_set(int which, int value);
uint64_t fake_count(int which);

#define MAX_SEEN 4096
typedef struct {
    pthread_mutex_t lock;
    int count;
    uint64_t tokens[MAX_SEEN];
    uint8_t which[MAX_SEEN];
    int64_t ns[MAX_SEEN];
    int refuse; /* the sink says "full" */
} seen_t;

static int sink(void *context, uint64_t token, uint8_t which, int64_t ns) {
    seen_t *seen = context;
    pthread_mutex_lock(&seen->lock);
    int refused = seen->refuse;
    if (!refused && seen->count < MAX_SEEN) {
        seen->tokens[seen->count] = token, seen->which[seen->count] = which, seen->ns[seen->count] = ns;
        seen->count++;
    }
    pthread_mutex_unlock(&seen->lock);
    return refused;
}

static int seen_count(seen_t *seen) {
    pthread_mutex_lock(&seen->lock);
    int count = seen->count;
    pthread_mutex_unlock(&seen->lock);
    return count;
}

static void sleep_ms(int milliseconds) {
    struct timespec pause = {milliseconds / 1000, (long)(milliseconds % 1000) * 1000000l};
    nanosleep(&pause, NULL);
}

static int wait_for(seen_t *seen, int count) { /* up to 10 s */
    for (int waited = 0; waited < 10000; waited++) {
        if (seen_count(seen) >= count) return 1;
        sleep_ms(1);
    }
    return 0;
}

static ot_cuda fake(void) {
    ot_cuda cuda = {NULL, cuCtxGetCurrent, cuCtxSetCurrent, cuEventCreate, cuEventDestroy_v2, cuEventRecord,
                    cuEventQuery, cuEventElapsedTime, cuStreamIsCapturing, cuStreamCreate, cuStreamDestroy_v2};
    return cuda;
}

static void *device_thread(void *argument) { /* the "GPU": completes a marker every millisecond */
    int count = *(int *)argument;
    for (int index = 0; index < count; index++) {
        sleep_ms(1);
        fake_complete(1);
    }
    return NULL;
}

static void test_order_and_times(void) {
    fake_reset();
    seen_t seen = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}, {0}, 0};
    ot_cuda cuda = fake();
    char why[128];
    ot_poller *poller = ot_poller_start(&cuda, sink, &seen, 200, 1000, why, sizeof why);
    CHECK(poller != NULL);
    if (poller == NULL) return;
    int steps = 300, events = 0;
    for (int step = 1; step <= steps; step++) {
        CHECK(ot_poller_mark(poller, (uint64_t)step, OT_DEVICE_BEGIN, NULL) == 1);
        if (step % 50 == 0) { /* now and then a host-timed end (a capture began inside the step) */
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            CHECK(ot_poller_host(poller, (uint64_t)step, OT_DEVICE_END, (int64_t)now.tv_sec * 1000000000ll + now.tv_nsec));
            events += 1;
        } else {
            CHECK(ot_poller_mark(poller, (uint64_t)step, OT_DEVICE_END, NULL) == 1);
            events += 2;
        }
    }
    pthread_t gpu;
    pthread_create(&gpu, NULL, device_thread, &events);
    CHECK(wait_for(&seen, 2 * steps));
    pthread_join(gpu, NULL);
    int ordered = 1;
    for (int index = 0; index < seen.count; index++)
        ordered &= seen.tokens[index] == (uint64_t)(index / 2 + 1) && seen.which[index] == index % 2;
    CHECK(ordered);
    int increasing = 1; /* device markers complete in order: their times do not go back (host ones may) */
    for (int index = 1; index < seen.count; index++)
        if (seen.tokens[index] % 50 != 0 && seen.tokens[index - 1] % 50 != 0) increasing &= seen.ns[index] >= seen.ns[index - 1];
    CHECK(increasing);
    ot_poller_stats stats;
    CHECK(ot_poller_stop(poller, 1.0, &stats) == 0);
    CHECK(stats.marked == (uint64_t)(2 * steps) && stats.resolved == (uint64_t)(2 * steps) && stats.pending == 0);
}

static void test_capture_stops_queries(void) {
    fake_reset();
    seen_t seen = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}, {0}, 0};
    ot_cuda cuda = fake();
    ot_poller *poller = ot_poller_start(&cuda, sink, &seen, 200, 200, NULL, 0);
    CHECK(poller != NULL);
    if (poller == NULL) return;
    CHECK(ot_poller_mark(poller, 1, OT_DEVICE_BEGIN, NULL) == 1);
    ot_poller_capture(poller, 1);
    uint64_t queries = fake_count(0);
    CHECK(ot_poller_mark(poller, 1, OT_DEVICE_END, NULL) == 0); /* a capture anywhere: the host times it */
    sleep_ms(20);
    CHECK(fake_count(0) == queries); /* no query while a graph is captured */
    fake_set(1, 1);
    ot_poller_capture(poller, -1);
    CHECK(ot_poller_mark(poller, 1, OT_DEVICE_END, NULL) == 0); /* this stream captures */
    fake_set(1, 0);
    fake_complete(1);
    CHECK(wait_for(&seen, 1));
    CHECK(ot_poller_stop(poller, 0.5, NULL) == 0);
}

static void test_failure_is_reported_once(void) {
    fake_reset();
    seen_t seen = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}, {0}, 0};
    ot_cuda cuda = fake();
    ot_poller *poller = ot_poller_start(&cuda, sink, &seen, 200, 200, NULL, 0);
    CHECK(poller != NULL);
    if (poller == NULL) return;
    fake_set(2, 1);
    CHECK(ot_poller_mark(poller, 7, OT_DEVICE_BEGIN, NULL) == 1);
    CHECK(wait_for(&seen, 1));
    sleep_ms(10);
    CHECK(seen.count == 1 && seen.which[0] == OT_DEVICE_FAILED && seen.tokens[0] == 0);
    CHECK(ot_poller_mark(poller, 7, OT_DEVICE_END, NULL) == 0 && ot_poller_host(poller, 7, OT_DEVICE_END, 1) == 0);
    fake_set(2, 0);
    ot_poller_stats stats;
    CHECK(ot_poller_stop(poller, 0.5, &stats) == 0 && stats.failed == 1);
}

static void test_stop_is_bounded_and_a_hung_thread_frees_itself(void) {
    fake_reset();
    seen_t seen = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}, {0}, 1 /* a full ring: counted as dropped */};
    ot_cuda cuda = fake();
    ot_poller *poller = ot_poller_start(&cuda, sink, &seen, 200, 200, NULL, 0);
    CHECK(poller != NULL);
    if (poller == NULL) return;
    CHECK(ot_poller_host(poller, 1, OT_DEVICE_BEGIN, 5) == 1);
    for (int waited = 0; waited < 5000; waited++) { /* resolved, refused by the sink */
        ot_poller_stats stats;
        ot_poller_stats_get(poller, &stats);
        if (stats.dropped == 1) break;
        sleep_ms(1);
    }
    ot_poller_stats stats;
    ot_poller_stats_get(poller, &stats);
    CHECK(stats.dropped == 1 && stats.resolved == 1);
    fake_set(3, 1); /* the next query hangs, as on a hung device */
    CHECK(ot_poller_mark(poller, 2, OT_DEVICE_BEGIN, NULL) == 1);
    sleep_ms(20);
    struct timespec before, after;
    clock_gettime(CLOCK_MONOTONIC, &before);
    CHECK(ot_poller_stop(poller, 0.05, &stats) == 1); /* gave up on the thread: it is orphaned */
    clock_gettime(CLOCK_MONOTONIC, &after);
    double took = (double)(after.tv_sec - before.tv_sec) + (double)(after.tv_nsec - before.tv_nsec) / 1e9;
    CHECK(took < 1.0);
    CHECK(stats.pending == 1);
    int count = seen_count(&seen);
    fake_set(3, 0); /* the call returns: the thread must not call the sink, and frees the poller */
    sleep_ms(50);
    CHECK(seen_count(&seen) == count);
}

static void test_no_context(void) {
    fake_reset();
    fake_set(0, 1);
    ot_cuda cuda = fake();
    char why[128] = "";
    CHECK(ot_poller_start(&cuda, sink, NULL, 200, 200, why, sizeof why) == NULL);
    CHECK(strstr(why, "no CUDA context") != NULL);
    fake_set(0, 0);
}

int main(void) {
    test_order_and_times();
    test_capture_stops_queries();
    test_failure_is_reported_once();
    test_stop_is_bounded_and_a_hung_thread_frees_itself();
    test_no_context();
    sleep_ms(50); /* the orphaned thread has left */
    return report();
}

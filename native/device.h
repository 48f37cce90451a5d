/* The device resolver: a native thread that turns a step's CUDA events into wall-clock times, never taking
 * the GIL (docs/offload.md, "The device resolver").
 *
 * The training thread records a marker (a pooled timing event) on the current stream when a step's device
 * work begins and ends (ot_poller_mark: one cuEventRecord, no synchronisation) and queues it with the step's
 * token (its host span's id). The poller thread queries the oldest marker (markers complete in stream
 * order), and for each one that completed hands (token, which, wall-clock ns) to a sink: the binding writes
 * it into the offload ring as a device record, which the drain turns into the step's device span. Nothing
 * of OpenTelemetry is here.
 *
 * Times: cuEventElapsedTime from an anchor event whose wall-clock time is bracketed Cristian-style (recorded
 * on a side stream of the poller's own, polled for at most 2 ms; a bracket narrower than 200 us is kept, its
 * midpoint then within 100 us), re-anchored every 10 s. Until a first good anchor, a marker's own poll
 * bracket stands in.
 *
 * The CUDA driver API is reached through function pointers loaded from the driver library torch already
 * loaded (dlopen with RTLD_NOLOAD): nothing is linked against CUDA, and the tests load a fake driver
 * (native/tests/fake_cuda.c) the same way. While a CUDA graph is captured anywhere in the process (the
 * binding counts captures), the thread makes no CUDA call: a query from another thread invalidates a capture
 * in CUDA's global capture mode.
 */
#ifndef OT_DEVICE_H
#define OT_DEVICE_H

#include <stddef.h>
#include <stdint.h>

/* The driver API's entry points the resolver uses (CUresult is an int; 0 success, 600 not ready). */
typedef struct {
    void *library;
    int (*ctx_get_current)(void **context);
    int (*ctx_set_current)(void *context);
    int (*event_create)(void **event, unsigned int flags);
    int (*event_destroy)(void *event);
    int (*event_record)(void *event, void *stream);
    int (*event_query)(void *event);
    int (*event_elapsed_time)(float *milliseconds, void *start, void *end);
    int (*stream_is_capturing)(void *stream, int *status);
    int (*stream_create)(void **stream, unsigned int flags);
    int (*stream_destroy)(void *stream);
} ot_cuda;

#define OT_CUDA_NOT_READY 600

/* Load the driver from `path`; `only_loaded`: only if the process has loaded it already (RTLD_NOLOAD). 0, or
 * -1 with a reason in `why`. */
int ot_cuda_load(ot_cuda *cuda, const char *path, int only_loaded, char *why, size_t why_size);

enum { OT_DEVICE_BEGIN = 0, OT_DEVICE_END = 1, OT_DEVICE_FAILED = 2 };

/* Where resolved markers go, on the poller thread: 0 written, non-zero dropped (counted). */
typedef int (*ot_device_sink)(void *context, uint64_t token, uint8_t which, int64_t ns);

typedef struct ot_poller ot_poller;

typedef struct {
    uint64_t marked;   /* markers queued (events and host times) */
    uint64_t resolved; /* markers handed to the sink */
    uint64_t dropped;  /* resolved markers the sink refused (a full ring) */
    uint64_t refused;  /* markers not queued: the queue was full, or the poller had failed */
    uint64_t failed;   /* 1 once a CUDA call failed (the poller then stopped) */
    uint64_t pending;  /* queued, not yet resolved */
} ot_poller_stats;

/* Start the poller thread for the CUDA context current on the calling thread. NULL, with a reason in `why`,
 * when there is none or the thread cannot start. `poll_us`: how often the oldest marker is queried while one
 * is pending; `idle_us`: how often the queue is looked at while empty. */
ot_poller *ot_poller_start(const ot_cuda *cuda, ot_device_sink sink, void *sink_context, uint32_t poll_us,
                           uint32_t idle_us, char *why, size_t why_size);

/* Training thread: record a marker on `stream` and queue it. 1 queued; 0 not (a graph is being captured, the
 * stream captures, the queue is full, the poller failed or is stopping): the caller times this one on the
 * host (ot_poller_host). */
int ot_poller_mark(ot_poller *poller, uint64_t token, uint8_t which, void *stream);

/* Training thread: queue a marker whose time is the host's (`ns`), resolved in order with the others. 1 queued,
 * 0 not. */
int ot_poller_host(ot_poller *poller, uint64_t token, uint8_t which, int64_t ns);

/* A CUDA graph capture began (+1) or ended (-1) somewhere in the process. */
void ot_poller_capture(ot_poller *poller, int delta);

void ot_poller_stats_get(ot_poller *poller, ot_poller_stats *stats);

/* Resolve what completes within `timeout_s`, then stop the thread and free the poller: 0. 1 when the thread
 * did not stop in time (inside a CUDA call on a hung device): it frees the poller itself when it returns, and
 * calls the sink no more. `final` (may be NULL) gets the counts as the poller stopped. */
int ot_poller_stop(ot_poller *poller, double timeout_s, ot_poller_stats *final);

/* After fork(), in the child: the thread is not there. Marks are refused; stop frees without joining. */
void ot_poller_forget(ot_poller *poller);

#endif

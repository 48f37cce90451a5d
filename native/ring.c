/* The offload ring's core: see ring.h. No Python here, so the sanitizer tests and the fuzzer drive it alone. */
#include "ring.h"

#include <string.h>

/* The positions are shared between processes: their atomics must not be a library's (process-local) locks. */
#if defined(__GCC_ATOMIC_LLONG_LOCK_FREE) && __GCC_ATOMIC_LLONG_LOCK_FREE != 2
#error "the ring needs lock-free 64-bit atomics (the pure-Python fallback serves this machine)"
#endif

static inline uint64_t *word(const ot_ring *ring, uint64_t offset) {
    return (uint64_t *)(void *)(ring->base + offset);
}

static inline uint64_t load_acquire(const ot_ring *ring, uint64_t offset) {
    return __atomic_load_n(word(ring, offset), __ATOMIC_ACQUIRE);
}

static inline void store_release(ot_ring *ring, uint64_t offset, uint64_t value) {
    __atomic_store_n(word(ring, offset), value, __ATOMIC_RELEASE);
}

static int valid_capacity(uint64_t capacity, uint64_t size) {
    return capacity >= 8 && capacity <= OT_RING_MAX_CAPACITY && size >= OT_RING_HEADER &&
           size - OT_RING_HEADER == capacity;
}

int ot_ring_create(ot_ring *ring, uint8_t *base, uint64_t size) {
    if (size < OT_RING_HEADER || !valid_capacity(size - OT_RING_HEADER, size)) return -1;
    memset(ring, 0, sizeof *ring);
    memset(base, 0, OT_RING_HEADER); /* no position, report or capability left from an earlier use */
    ring->base = base;
    ring->capacity = size - OT_RING_HEADER;
    __atomic_store_n(word(ring, OT_F_CAPACITY), ring->capacity, __ATOMIC_RELAXED);
    store_release(ring, OT_F_MAGIC, OT_RING_MAGIC);
    return 0;
}

int ot_ring_attach(ot_ring *ring, uint8_t *base, uint64_t size) {
    if (size < OT_RING_HEADER) return -1;
    memset(ring, 0, sizeof *ring);
    ring->base = base;
    if (load_acquire(ring, OT_F_MAGIC) != OT_RING_MAGIC) return -1;
    uint64_t capacity = load_acquire(ring, OT_F_CAPACITY);
    if (!valid_capacity(capacity, size)) return -1;
    ring->capacity = capacity;
    ring->write = load_acquire(ring, OT_F_WRITE);
    ring->read = ring->read_seen = load_acquire(ring, OT_F_READ);
    return 0;
}

/* Copy `length` bytes to data position `position` (mod capacity), wrapping once at most. */
static void put(ot_ring *ring, uint64_t position, const uint8_t *source, uint64_t length) {
    uint8_t *data = ring->base + OT_RING_HEADER;
    uint64_t offset = position % ring->capacity;
    uint64_t first = ring->capacity - offset < length ? ring->capacity - offset : length;
    memcpy(data + offset, source, first);
    if (first < length) memcpy(data, source + first, length - first);
}

int ot_ring_append(ot_ring *ring, const uint8_t *payload, uint32_t length, int *reader_moved) {
    uint64_t size = 4ull + length;
    *reader_moved = 0;
    if (size > ring->capacity) return OT_TOO_BIG;
    if (ring->write + size - ring->read_seen > ring->capacity) {
        uint64_t read = load_acquire(ring, OT_F_READ);
        /* A reader position ahead of ours (a damaged header) reads as full, never as room: it is not kept,
         * so the next append looks again rather than computing room from it. */
        if (read > ring->write) return OT_FULL;
        if (read != ring->read_seen) {
            ring->read_seen = read;
            *reader_moved = 1;
        }
        if (ring->write + size - read > ring->capacity) return OT_FULL;
    }
    uint8_t prefix[4] = {(uint8_t)length, (uint8_t)(length >> 8), (uint8_t)(length >> 16), (uint8_t)(length >> 24)};
    put(ring, ring->write, prefix, 4);
    put(ring, ring->write + 4, payload, length);
    ring->write += size;
    store_release(ring, OT_F_WRITE, ring->write); /* publishes the record */
    return OT_OK;
}

void ot_ring_take(ot_ring *ring, uint64_t max_bytes, ot_record_fn fn, void *context, ot_take_result *result) {
    memset(result, 0, sizeof *result);
    const uint8_t *data = ring->base + OT_RING_HEADER;
    uint64_t capacity = ring->capacity;
    uint64_t start = ring->read;
    uint64_t end = load_acquire(ring, OT_F_WRITE);
    if (end < start || end - start > capacity) {
        /* Not a position a writer could publish: nothing here can be framed. Resynchronise on it when it is
         * ahead (the records between are lost and counted); a position behind ours is ignored. */
        result->corrupt = 1;
        if (end > start) {
            ring->read = end;
            store_release(ring, OT_F_READ, end);
        }
        return;
    }
    uint64_t position = start;
    while (position < end && position - start < max_bytes) {
        uint64_t available = end - position;
        uint32_t length = 0;
        if (available >= 4) {
            uint8_t prefix[4];
            for (int index = 0; index < 4; index++) prefix[index] = data[(position + index) % capacity];
            length = (uint32_t)prefix[0] | (uint32_t)prefix[1] << 8 | (uint32_t)prefix[2] << 16 |
                     (uint32_t)prefix[3] << 24;
        }
        if (available < 4 || length > available - 4) {
            result->corrupt = 1; /* a length that does not fit what was published: skip to the end */
            position = end;
            break;
        }
        uint64_t offset = (position + 4) % capacity;
        uint32_t first = capacity - offset < length ? (uint32_t)(capacity - offset) : length;
        int stop = fn(context, data + offset, first, data, length - first);
        result->records++;
        position += 4ull + length;
        if (stop) break;
    }
    result->bytes = position - start;
    if (position != start) {
        ring->read = position;
        store_release(ring, OT_F_READ, position); /* the writer may reuse the space now */
    }
}

int ot_ring_load(const ot_ring *ring, uint64_t offset, uint64_t *value) {
    if (offset % 8 || offset >= OT_RING_HEADER) return -1;
    *value = load_acquire(ring, offset);
    return 0;
}

int ot_ring_store(ot_ring *ring, uint64_t offset, uint64_t value) {
    if (offset % 8 || offset >= OT_RING_HEADER) return -1;
    store_release(ring, offset, value);
    return 0;
}

/* The offload ring's core, shared by the CPython binding (module.c), the sanitizer tests and the fuzz harness.
 *
 * Layout (the same bytes as the pure-Python fallback, otel_training/_ring.py, so either side may read the
 * other's ring): a header page, then `capacity` bytes of records, each a little-endian u32 length and that
 * many bytes, wrapping around the end. The writer and the reader each own one monotonic byte position in the
 * header. A record is published by a release store of the write position after its bytes are in place, and
 * read after an acquire load of it; the reader frees space with a release store of the read position, which
 * the writer loads with acquire. That is correct on any CPU C11 atomics target (x86-64 and aarch64 alike).
 *
 * The reader never trusts what the shared memory says: its own position and the capacity are private copies,
 * and a write position or a record length that does not fit what was published is counted as corruption and
 * skipped, never followed out of the mapping.
 */
#ifndef OT_RING_H
#define OT_RING_H

#include <stddef.h>
#include <stdint.h>

#define OT_RING_HEADER 4096u
#define OT_RING_MAGIC 0x4F545452494E4731ull /* "OTTRING1" */
#define OT_F_MAGIC 0u
#define OT_F_CAPACITY 8u
#define OT_F_WRITE 64u
#define OT_F_READ 128u
/* The largest ring accepted (the option's bound is 4 GiB). */
#define OT_RING_MAX_CAPACITY (1ull << 40)

typedef struct {
    uint8_t *base;      /* the mapping: the header page, then the data */
    uint64_t capacity;  /* data bytes: read once at init, never again from shared memory */
    uint64_t write;     /* the writer's own position (private copy of what it published) */
    uint64_t read_seen; /* the writer's last look at the reader's position */
    uint64_t read;      /* the reader's own position (private copy of what it stored) */
} ot_ring;

enum { OT_OK = 0, OT_FULL = 1, OT_TOO_BIG = 2 };

/* Lay out a new ring in `size` bytes at `base` (zeroed by the caller, as a fresh memfd is). 0, or -1 when
 * `size` cannot hold a header and at least 8 data bytes. */
int ot_ring_create(ot_ring *ring, uint8_t *base, uint64_t size);

/* Attach to a ring laid out by another process in a mapping of `size` bytes. 0, or -1 when the magic is
 * wrong or the capacity the header claims does not match the mapping. */
int ot_ring_attach(ot_ring *ring, uint8_t *base, uint64_t size);

/* Writer: append one record. OT_OK, OT_FULL (no room now: the caller decides whether to wait), or OT_TOO_BIG
 * (never fits). `reader_moved` is set to 1 when the reader's position was found to have advanced. */
int ot_ring_append(ot_ring *ring, const uint8_t *payload, uint32_t length, int *reader_moved);

/* Reader: a record, handed over in at most two pieces (it may wrap). Return non-zero to stop early (the
 * record is consumed). */
typedef int (*ot_record_fn)(void *context, const uint8_t *first, uint32_t first_length, const uint8_t *second,
                            uint32_t second_length);

typedef struct {
    uint64_t records; /* records handed to the callback */
    uint64_t bytes;   /* bytes consumed, framing included */
    uint64_t corrupt; /* 1 when the published bytes did not frame as records (skipped), else 0 */
} ot_take_result;

/* Reader: hand every record published since the last take (up to about `max_bytes`) to `fn`, then free their
 * space. Never reads outside the data area, whatever the shared memory holds. */
void ot_ring_take(ot_ring *ring, uint64_t max_bytes, ot_record_fn fn, void *context, ot_take_result *result);

/* Header words, atomically (the drain's report fields, the positions). `offset` must be a multiple of 8
 * below OT_RING_HEADER: -1 otherwise. */
int ot_ring_load(const ot_ring *ring, uint64_t offset, uint64_t *value);
int ot_ring_store(ot_ring *ring, uint64_t offset, uint64_t value);

#endif

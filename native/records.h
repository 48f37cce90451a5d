/* The fast span records: a span's begin and end in a compact binary form that C writes without Python objects
 * (so a native thread can write them without the GIL) and the drain parses without trusting a byte.
 *
 * Layout, little-endian. A record starts with its type byte, which marshal never starts a record with, so the
 * drain tells the two apart by it:
 *   begin (0x01): kind u8, flags u8, parent_flags u8, remote u8, span_id u64, trace_id_high u64,
 *                 trace_id_low u64, parent_id u64, start i64, scope u32, name (str), attributes
 *   end   (0x02): span_id u64, end i64, attributes (the span's updates)
 *   device (0x03): token u64 (the host step span's id), which u8 (0 begin, 1 end, 2 the resolver failed),
 *                 time i64: a step's device work began or ended then (device.h; no attributes)
 *   str:        u32 byte length, that many bytes of UTF-8 (checked when decoded)
 *   attributes: u16 count, then each: key (str), tag u8 (1 bool, 2 int64, 3 float64, 4 str), value
 *                 (bool: u8 0 or 1; int64: 8 bytes; float64: 8 bytes; str)
 * Anything else a span may carry (events, links, status, trace state, sequences) travels as marshal records.
 */
#ifndef OT_RECORDS_H
#define OT_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#define OT_RECORD_BEGIN 0x01
#define OT_RECORD_END 0x02
#define OT_RECORD_DEVICE 0x03
#define OT_DEVICE_WHICH_MAX 2
#define OT_MAX_ATTRIBUTES 64
#define OT_MAX_RECORD (1u << 20)

enum { OT_BOOL = 1, OT_INT = 2, OT_FLOAT = 3, OT_STR = 4 };

typedef struct {
    const char *data; /* not NUL-terminated */
    uint32_t length;
} ot_str;

typedef struct {
    ot_str key;
    uint8_t tag;
    union {
        int64_t integer; /* OT_BOOL (0 or 1) and OT_INT */
        double number;
        ot_str text;
    } value;
} ot_attribute;

typedef struct {
    uint8_t type; /* OT_RECORD_BEGIN, OT_RECORD_END or OT_RECORD_DEVICE */
    uint8_t kind, flags, parent_flags, remote; /* a device record: kind is its "which" */
    uint64_t span_id, trace_id_high, trace_id_low, parent_id;
    int64_t time; /* start (begin) or end (end), ns since the epoch */
    uint32_t scope;
    ot_str name;
    uint16_t count;
    ot_attribute attributes[OT_MAX_ATTRIBUTES];
} ot_record;

/* The encoded size of `record`, or 0 when it cannot be encoded (too many attributes, too big). */
size_t ot_record_size(const ot_record *record);

/* Encode `record` into `out` (at least ot_record_size bytes). Returns the bytes written. */
size_t ot_record_encode(const ot_record *record, uint8_t *out);

/* Parse `length` bytes into `record`, whose strings then point into `data`. 0, or -1 when the bytes are not
 * exactly one well-formed record (a length past the end, an unknown tag or type, bytes left over). UTF-8 is
 * checked by whoever turns the strings into text. */
int ot_record_parse(const uint8_t *data, size_t length, ot_record *record);

/* Ids for new spans: 64 random bits (never 0), from a generator seeded by the kernel and seeded again in a
 * forked child. Not for cryptography: for trace and span ids, as the SDK's own generator. */
uint64_t ot_random_id(void);

/* Nanoseconds since the epoch (CLOCK_REALTIME, as time.time_ns()). */
int64_t ot_now_ns(void);

#endif

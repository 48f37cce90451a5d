/* Fuzz the ring's reader, the code that decodes shared memory another process wrote.
 *
 * The input is a ring's whole mapping as a hostile writer could leave it: the first bytes choose the header
 * (magic right or wrong, a capacity that may not match, any write and read positions), the rest is the data
 * area. The reader must refuse or frame it without reading outside the mapping: AddressSanitizer and
 * UndefinedBehaviorSanitizer watch (scripts/native-check). Built with clang's -fsanitize=fuzzer where that is
 * available (coverage-guided); fuzz_main.c drives it anywhere else.
 */
#include <stdlib.h>
#include <string.h>

#include "../ring.h"

static int check(void *context, const uint8_t *first, uint32_t first_length, const uint8_t *second,
                 uint32_t second_length) {
    const ot_ring *ring = context;
    const uint8_t *data = ring->base + OT_RING_HEADER;
    /* Every piece lies inside the data area: touch its first and last byte so ASan sees any overrun. */
    volatile uint8_t sink = 0;
    if (first_length) sink ^= first[0] ^ first[first_length - 1];
    if (second_length) sink ^= second[0] ^ second[second_length - 1];
    (void)sink;
    if (first < data || first + first_length > data + ring->capacity) abort();
    if (second_length && (second != data || second_length > ring->capacity)) abort();
    if ((uint64_t)first_length + second_length + 4 > ring->capacity) abort();
    return 0;
}

static uint64_t take64(const uint8_t **cursor, size_t *left) {
    uint64_t value = 0;
    size_t count = *left < 8 ? *left : 8;
    memcpy(&value, *cursor, count);
    *cursor += count;
    *left -= count;
    return value;
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size) {
    const uint8_t *cursor = input;
    size_t left = size;
    uint64_t flags = take64(&cursor, &left);
    uint64_t write = take64(&cursor, &left);
    uint64_t read = take64(&cursor, &left);
    uint64_t max_bytes = take64(&cursor, &left);
    uint64_t capacity = 8 + left % 4096; /* the data the input carries, at least the smallest ring */
    uint64_t mapped = OT_RING_HEADER + capacity;
    uint8_t *base = aligned_alloc(8, (mapped + 7) / 8 * 8);
    if (base == NULL) return 0;
    memset(base, 0, OT_RING_HEADER);
    memset(base + OT_RING_HEADER, 0xA5, capacity);
    memcpy(base + OT_RING_HEADER, cursor, left < capacity ? left : capacity);
    uint64_t magic = flags & 1 ? OT_RING_MAGIC : flags;
    uint64_t claimed = flags & 2 ? capacity : (flags >> 8) ^ capacity;
    memcpy(base + OT_F_MAGIC, &magic, 8);
    memcpy(base + OT_F_CAPACITY, &claimed, 8);
    if (flags & 4) write = read + write % (2 * capacity); /* near the reader: lengths get parsed */
    memcpy(base + OT_F_WRITE, &write, 8);
    memcpy(base + OT_F_READ, &read, 8);
    ot_ring reader;
    if (ot_ring_attach(&reader, base, mapped) == 0) {
        for (int round = 0; round < 3; round++) {
            ot_take_result result;
            ot_ring_take(&reader, max_bytes >> (round * 8), check, &reader, &result);
            if (result.bytes > capacity) abort();
            if (flags & 8) { /* the writer moves on meanwhile, as a hostile one would */
                uint64_t moved = write + (flags >> 16) % (capacity + 16);
                memcpy(base + OT_F_WRITE, &moved, 8);
            }
        }
        /* A writer on the same damaged ring never writes outside it either. */
        ot_ring writer = reader;
        uint8_t payload[64] = {0};
        int reader_moved;
        for (int round = 0; round < 4; round++) ot_ring_append(&writer, payload, (uint32_t)(flags >> 24) % 64,
                                                               &reader_moved);
    }
    free(base);
    return 0;
}

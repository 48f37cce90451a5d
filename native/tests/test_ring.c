/* ring.c's own tests, run under AddressSanitizer + UndefinedBehaviorSanitizer and, for the two-thread test,
 * ThreadSanitizer (scripts/native-check). No Python: the core alone. Prints "N passed, N failed". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "../ring.h"


typedef struct {
    uint8_t records[64][64];
    uint32_t lengths[64];
    int count;
} Collected;

static int collect(void *context, const uint8_t *first, uint32_t first_length, const uint8_t *second,
                   uint32_t second_length) {
    Collected *collected = context;
    if (collected->count >= 64 || first_length + second_length > 64) return 1;
    memcpy(collected->records[collected->count], first, first_length);
    memcpy(collected->records[collected->count] + first_length, second, second_length);
    collected->lengths[collected->count++] = first_length + second_length;
    return 0;
}

/* A fresh ring of `capacity` data bytes, its writer and its reader; free() the result. */
static uint8_t *pair(uint64_t capacity, ot_ring *writer, ot_ring *reader) {
    uint8_t *base = calloc(1, OT_RING_HEADER + capacity);
    CHECK(ot_ring_create(writer, base, OT_RING_HEADER + capacity) == 0);
    CHECK(ot_ring_attach(reader, base, OT_RING_HEADER + capacity) == 0);
    return base;
}

static void test_round_trip_across_the_wrap(void) {
    ot_ring writer, reader;
    uint8_t *base = pair(100, &writer, &reader);
    for (int round = 0; round < 200; round++) {
        uint8_t payload[40];
        uint32_t length = (uint32_t)(round % 37);
        memset(payload, round & 0xff, length);
        int moved;
        CHECK(ot_ring_append(&writer, payload, length, &moved) == OT_OK);
        Collected got = {0};
        ot_take_result result;
        ot_ring_take(&reader, 1 << 20, collect, &got, &result);
        CHECK(result.records == 1 && result.corrupt == 0 && got.count == 1 && got.lengths[0] == length);
        CHECK(length == 0 || (got.records[0][0] == (round & 0xff) && got.records[0][length - 1] == (round & 0xff)));
    }
    free(base);
}

static void test_full_and_too_big(void) {
    ot_ring writer, reader;
    uint8_t *base = pair(64, &writer, &reader);
    uint8_t payload[100] = {0};
    int moved;
    CHECK(ot_ring_append(&writer, payload, 61, &moved) == OT_TOO_BIG);
    CHECK(ot_ring_append(&writer, payload, 28, &moved) == OT_OK);
    CHECK(ot_ring_append(&writer, payload, 28, &moved) == OT_OK);
    CHECK(ot_ring_append(&writer, payload, 1, &moved) == OT_FULL && moved == 0);
    Collected got = {0};
    ot_take_result result;
    ot_ring_take(&reader, 1, collect, &got, &result); /* max_bytes: one record at least, then stop */
    CHECK(result.records == 1);
    CHECK(ot_ring_append(&writer, payload, 1, &moved) == OT_OK && moved == 1);
    free(base);
}

static void test_hostile_header_and_lengths(void) {
    uint64_t capacity = 64;
    uint8_t *base = calloc(1, OT_RING_HEADER + capacity);
    ot_ring writer, reader;
    ot_ring_create(&writer, base, OT_RING_HEADER + capacity);
    CHECK(ot_ring_attach(&reader, base, OT_RING_HEADER + capacity + 8) == -1); /* capacity vs mapping */
    CHECK(ot_ring_attach(&reader, base, 100) == -1);
    CHECK(ot_ring_attach(&reader, base, OT_RING_HEADER + capacity) == 0);
    uint64_t *write_word = (uint64_t *)(void *)(base + OT_F_WRITE);
    Collected got = {0};
    ot_take_result result;
    *write_word = 1ull << 60; /* far ahead */
    ot_ring_take(&reader, 1 << 20, collect, &got, &result);
    CHECK(result.corrupt == 1 && result.records == 0 && got.count == 0);
    *write_word = 0; /* behind the reader, which resynchronised on the position it was shown */
    ot_ring_take(&reader, 1 << 20, collect, &got, &result);
    CHECK(result.corrupt == 1 && result.records == 0);

    ot_ring_create(&writer, base, OT_RING_HEADER + capacity);
    memset(base + OT_F_WRITE, 0, 8);
    memset(base + OT_F_READ, 0, 8);
    ot_ring_attach(&reader, base, OT_RING_HEADER + capacity);
    uint8_t *data = base + OT_RING_HEADER;
    data[0] = 0xff, data[1] = 0xff, data[2] = 0xff, data[3] = 0x7f; /* a length past what is published */
    *write_word = 20;
    ot_ring_take(&reader, 1 << 20, collect, &got, &result);
    CHECK(result.corrupt == 1 && result.records == 0 && result.bytes == 20);
    *write_word = 22; /* two bytes: not even a length */
    ot_ring_take(&reader, 1 << 20, collect, &got, &result);
    CHECK(result.corrupt == 1 && result.records == 0);
    uint64_t value;
    CHECK(ot_ring_load(&reader, 4095, &value) == -1 && ot_ring_load(&reader, 4096, &value) == -1);
    CHECK(ot_ring_store(&reader, 3, 1) == -1 && ot_ring_load(&reader, 192, &value) == 0);
    free(base);
}

/* One writer thread, one reader thread: every record arrives, whole and in order. Under ThreadSanitizer this
 * checks the acquire/release protocol; anywhere it checks nothing is torn. */
#define THREAD_RECORDS 200000
typedef struct {
    ot_ring ring;
} Side;

static void *write_all(void *argument) {
    Side *side = argument;
    for (uint32_t index = 0; index < THREAD_RECORDS;) {
        uint8_t payload[12];
        uint32_t length = 4 + index % 9;
        for (uint32_t byte = 0; byte < length; byte++) payload[byte] = (uint8_t)(index + byte);
        memcpy(payload, &index, 4);
        int moved;
        if (ot_ring_append(&side->ring, payload, length, &moved) == OT_OK) index++;
    }
    return NULL;
}

typedef struct {
    uint32_t next;
    int bad;
} Order;

static int check_order(void *context, const uint8_t *first, uint32_t first_length, const uint8_t *second,
                       uint32_t second_length) {
    Order *order = context;
    uint8_t record[16];
    if (first_length + second_length > sizeof record) {
        order->bad++;
        return 1;
    }
    memcpy(record, first, first_length);
    memcpy(record + first_length, second, second_length);
    uint32_t index;
    memcpy(&index, record, 4);
    if (index != order->next || first_length + second_length != 4 + index % 9) order->bad++;
    for (uint32_t byte = 4; byte < first_length + second_length; byte++)
        if (record[byte] != (uint8_t)(index + byte)) order->bad++;
    order->next = index + 1;
    return 0;
}

static void test_one_writer_one_reader_thread(void) {
    Side writer;
    ot_ring reader;
    uint8_t *base = pair(1000, &writer.ring, &reader); /* small: the writer often waits, and records wrap */
    pthread_t thread;
    pthread_create(&thread, NULL, write_all, &writer);
    Order order = {0, 0};
    while (order.next < THREAD_RECORDS && order.bad == 0) {
        ot_take_result result;
        ot_ring_take(&reader, 1 << 20, check_order, &order, &result);
        if (result.corrupt) order.bad++;
    }
    pthread_join(thread, NULL);
    CHECK(order.bad == 0 && order.next == THREAD_RECORDS);
    free(base);
}

int main(void) {
    test_round_trip_across_the_wrap();
    test_full_and_too_big();
    test_hostile_header_and_lengths();
    test_one_writer_one_reader_thread();
    return report();
}

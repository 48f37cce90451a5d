/* records.c's own tests, under AddressSanitizer + UndefinedBehaviorSanitizer (scripts/native-check).
 * Prints "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "../records.h"


static ot_str text(const char *value) { return (ot_str){value, (uint32_t)strlen(value)}; }

static int same_str(ot_str a, ot_str b) { return a.length == b.length && memcmp(a.data, b.data, a.length) == 0; }

static void test_round_trip(void) {
    static ot_record record, parsed;
    memset(&record, 0, sizeof record);
    record.type = OT_RECORD_BEGIN, record.kind = 2, record.flags = 3, record.parent_flags = 1, record.remote = 1;
    record.span_id = 0x1122334455667788ull, record.trace_id_high = 1, record.trace_id_low = ~0ull;
    record.parent_id = 42, record.time = 1795777607332179351ll, record.scope = 7, record.name = text("training.step");
    record.count = 4;
    record.attributes[0] = (ot_attribute){text("b"), OT_BOOL, {.integer = 1}};
    record.attributes[1] = (ot_attribute){text("i"), OT_INT, {.integer = -5}};
    record.attributes[2] = (ot_attribute){text("f"), OT_FLOAT, {.number = 0.25}};
    record.attributes[3] = (ot_attribute){text("s"), OT_STR, {.text = text("gradient")}};
    size_t size = ot_record_size(&record);
    uint8_t *buffer = malloc(size);
    CHECK(size > 0 && ot_record_encode(&record, buffer) == size);
    CHECK(ot_record_parse(buffer, size, &parsed) == 0);
    CHECK(parsed.type == OT_RECORD_BEGIN && parsed.kind == 2 && parsed.flags == 3 && parsed.parent_flags == 1);
    CHECK(parsed.remote == 1 && parsed.span_id == record.span_id && parsed.trace_id_low == ~0ull);
    CHECK(parsed.trace_id_high == 1 && parsed.parent_id == 42 && parsed.time == record.time && parsed.scope == 7);
    CHECK(same_str(parsed.name, record.name) && parsed.count == 4);
    CHECK(parsed.attributes[0].tag == OT_BOOL && parsed.attributes[0].value.integer == 1);
    CHECK(parsed.attributes[1].tag == OT_INT && parsed.attributes[1].value.integer == -5);
    CHECK(parsed.attributes[2].tag == OT_FLOAT && parsed.attributes[2].value.number == 0.25);
    CHECK(parsed.attributes[3].tag == OT_STR && same_str(parsed.attributes[3].value.text, text("gradient")));
    for (size_t cut = 0; cut < size; cut++) CHECK(ot_record_parse(buffer, cut, &parsed) == -1); /* truncated */
    uint8_t *longer = malloc(size + 1);
    memcpy(longer, buffer, size);
    longer[size] = 0;
    CHECK(ot_record_parse(longer, size + 1, &parsed) == -1); /* a byte left over */
    free(longer);
    free(buffer);
}

static void test_end_and_refusals(void) {
    static ot_record record, parsed;
    memset(&record, 0, sizeof record);
    record.type = OT_RECORD_END, record.span_id = 9, record.time = 100;
    uint8_t buffer[64];
    size_t size = ot_record_size(&record);
    CHECK(size == 19 && ot_record_encode(&record, buffer) == size);
    CHECK(ot_record_parse(buffer, size, &parsed) == 0 && parsed.type == OT_RECORD_END && parsed.span_id == 9);
    buffer[0] = 3; /* no such type */
    CHECK(ot_record_parse(buffer, size, &parsed) == -1);
    record.count = OT_MAX_ATTRIBUTES + 1;
    CHECK(ot_record_size(&record) == 0);
    record.count = 1;
    record.attributes[0] = (ot_attribute){text("k"), 9, {.integer = 0}};
    CHECK(ot_record_size(&record) == 0); /* an unknown tag */
    uint8_t lying[] = {OT_RECORD_END, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
                       0xff, 0xff, 0xff, 0x7f, 'k'}; /* a key length far past the end */
    CHECK(ot_record_parse(lying, sizeof lying, &parsed) == -1);
    uint8_t bad_bool[] = {OT_RECORD_END, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
                          1, 0, 0, 0, 'k', OT_BOOL, 2};
    CHECK(ot_record_parse(bad_bool, sizeof bad_bool, &parsed) == -1);
}

static void test_ids(void) {
    uint64_t seen[1000];
    int zero = 0, repeated = 0;
    for (int index = 0; index < 1000; index++) {
        seen[index] = ot_random_id();
        zero += seen[index] == 0;
        for (int other = 0; other < index; other++) repeated += seen[other] == seen[index];
    }
    CHECK(zero == 0 && repeated == 0);
    CHECK(ot_now_ns() > 1600000000000000000ll);
}

int main(void) {
    test_round_trip();
    test_end_and_refusals();
    test_ids();
    return report();
}

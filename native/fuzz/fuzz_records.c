/* Fuzz the fast span records' parser (records.c), which the drain runs on bytes from shared memory. Every
 * parsed string must lie inside the input and every count within bounds; whatever parses must encode back to
 * exactly the same bytes. AddressSanitizer and UndefinedBehaviorSanitizer watch (scripts/native-check). */
#include <stdlib.h>
#include <string.h>

#include "../records.h"

static void inside(const uint8_t *input, size_t size, ot_str text) {
    if (text.length && ((const uint8_t *)text.data < input || (const uint8_t *)text.data + text.length > input + size))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size) {
    static ot_record record;
    if (ot_record_parse(input, size, &record) != 0) return 0;
    if (record.count > OT_MAX_ATTRIBUTES) abort();
    inside(input, size, record.name);
    for (uint16_t index = 0; index < record.count; index++) {
        inside(input, size, record.attributes[index].key);
        if (record.attributes[index].tag == OT_STR) inside(input, size, record.attributes[index].value.text);
    }
    size_t again = ot_record_size(&record);
    if (again != size) abort(); /* exactly one record, and the encoder agrees on its size */
    uint8_t *copy = malloc(again);
    if (copy == NULL) return 0;
    ot_record_encode(&record, copy);
    if (memcmp(copy, input, size) != 0) abort(); /* parse and encode are inverses */
    free(copy);
    return 0;
}

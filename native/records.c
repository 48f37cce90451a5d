/* The fast span records: see records.h. No Python here: the sanitizer tests and the fuzzer drive it alone. */
#define _GNU_SOURCE
#include "records.h"

#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static size_t str_size(ot_str text) { return 4u + text.length; }

static size_t attributes_size(const ot_record *record) {
    size_t size = 2;
    for (uint16_t index = 0; index < record->count; index++) {
        const ot_attribute *attribute = &record->attributes[index];
        size += str_size(attribute->key) + 1;
        switch (attribute->tag) {
        case OT_BOOL: size += 1; break;
        case OT_INT:
        case OT_FLOAT: size += 8; break;
        case OT_STR: size += str_size(attribute->value.text); break;
        default: return 0;
        }
    }
    return size;
}

size_t ot_record_size(const ot_record *record) {
    if (record->type == OT_RECORD_DEVICE) return 1 + 8 + 1 + 8;
    if (record->count > OT_MAX_ATTRIBUTES) return 0;
    size_t attributes = attributes_size(record);
    if (attributes == 0) return 0;
    size_t size;
    if (record->type == OT_RECORD_BEGIN) size = 1 + 4 + 8 * 5 + 4 + str_size(record->name) + attributes;
    else if (record->type == OT_RECORD_END) size = 1 + 8 + 8 + attributes;
    else return 0;
    return size <= OT_MAX_RECORD ? size : 0;
}

static uint8_t *put_u64(uint8_t *out, uint64_t value) {
    for (int byte = 0; byte < 8; byte++) out[byte] = (uint8_t)(value >> (8 * byte));
    return out + 8;
}

static uint8_t *put_u32(uint8_t *out, uint32_t value) {
    for (int byte = 0; byte < 4; byte++) out[byte] = (uint8_t)(value >> (8 * byte));
    return out + 4;
}

static uint8_t *put_str(uint8_t *out, ot_str text) {
    out = put_u32(out, text.length);
    if (text.length) memcpy(out, text.data, text.length);
    return out + text.length;
}

size_t ot_record_encode(const ot_record *record, uint8_t *out) {
    uint8_t *start = out;
    *out++ = record->type;
    if (record->type == OT_RECORD_DEVICE) {
        out = put_u64(out, record->span_id);
        *out++ = record->kind;
        out = put_u64(out, (uint64_t)record->time);
        return (size_t)(out - start);
    }
    if (record->type == OT_RECORD_BEGIN) {
        *out++ = record->kind, *out++ = record->flags, *out++ = record->parent_flags, *out++ = record->remote;
        out = put_u64(out, record->span_id);
        out = put_u64(out, record->trace_id_high);
        out = put_u64(out, record->trace_id_low);
        out = put_u64(out, record->parent_id);
        out = put_u64(out, (uint64_t)record->time);
        out = put_u32(out, record->scope);
        out = put_str(out, record->name);
    } else {
        out = put_u64(out, record->span_id);
        out = put_u64(out, (uint64_t)record->time);
    }
    *out++ = (uint8_t)record->count, *out++ = (uint8_t)(record->count >> 8);
    for (uint16_t index = 0; index < record->count; index++) {
        const ot_attribute *attribute = &record->attributes[index];
        out = put_str(out, attribute->key);
        *out++ = attribute->tag;
        switch (attribute->tag) {
        case OT_BOOL: *out++ = (uint8_t)(attribute->value.integer != 0); break;
        case OT_INT: out = put_u64(out, (uint64_t)attribute->value.integer); break;
        case OT_FLOAT: {
            uint64_t bits;
            memcpy(&bits, &attribute->value.number, 8);
            out = put_u64(out, bits);
            break;
        }
        default: out = put_str(out, attribute->value.text); break;
        }
    }
    return (size_t)(out - start);
}

/* A cursor that refuses to read past the end. */
typedef struct {
    const uint8_t *at, *end;
} cursor;

static int take(cursor *in, size_t size, const uint8_t **out) {
    if ((size_t)(in->end - in->at) < size) return -1;
    *out = in->at;
    in->at += size;
    return 0;
}

static int take_u8(cursor *in, uint8_t *value) {
    const uint8_t *at;
    if (take(in, 1, &at)) return -1;
    *value = *at;
    return 0;
}

static int take_u64(cursor *in, uint64_t *value) {
    const uint8_t *at;
    if (take(in, 8, &at)) return -1;
    uint64_t result = 0;
    for (int byte = 7; byte >= 0; byte--) result = result << 8 | at[byte];
    *value = result;
    return 0;
}

static int take_u32(cursor *in, uint32_t *value) {
    const uint8_t *at;
    if (take(in, 4, &at)) return -1;
    *value = (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
    return 0;
}

static int take_str(cursor *in, ot_str *text) {
    uint32_t length;
    const uint8_t *at;
    if (take_u32(in, &length) || take(in, length, &at)) return -1;
    text->data = (const char *)at;
    text->length = length;
    return 0;
}

int ot_record_parse(const uint8_t *data, size_t length, ot_record *record) {
    cursor in = {data, data + length};
    memset(record, 0, offsetof(ot_record, attributes));
    uint64_t time;
    if (take_u8(&in, &record->type)) return -1;
    if (record->type == OT_RECORD_BEGIN) {
        if (take_u8(&in, &record->kind) || take_u8(&in, &record->flags) || take_u8(&in, &record->parent_flags) ||
            take_u8(&in, &record->remote) || take_u64(&in, &record->span_id) ||
            take_u64(&in, &record->trace_id_high) || take_u64(&in, &record->trace_id_low) ||
            take_u64(&in, &record->parent_id) || take_u64(&in, &time) || take_u32(&in, &record->scope) ||
            take_str(&in, &record->name))
            return -1;
        if (record->remote > 1) return -1;
    } else if (record->type == OT_RECORD_END) {
        if (take_u64(&in, &record->span_id) || take_u64(&in, &time)) return -1;
    } else if (record->type == OT_RECORD_DEVICE) {
        if (take_u64(&in, &record->span_id) || take_u8(&in, &record->kind) || take_u64(&in, &time) ||
            record->kind > OT_DEVICE_WHICH_MAX)
            return -1;
        record->time = (int64_t)time;
        return in.at == in.end ? 0 : -1;
    } else {
        return -1;
    }
    record->time = (int64_t)time;
    uint8_t low, high;
    if (take_u8(&in, &low) || take_u8(&in, &high)) return -1;
    record->count = (uint16_t)(low | high << 8);
    if (record->count > OT_MAX_ATTRIBUTES) return -1;
    for (uint16_t index = 0; index < record->count; index++) {
        ot_attribute *attribute = &record->attributes[index];
        uint64_t bits;
        uint8_t truth;
        if (take_str(&in, &attribute->key) || take_u8(&in, &attribute->tag)) return -1;
        switch (attribute->tag) {
        case OT_BOOL:
            if (take_u8(&in, &truth) || truth > 1) return -1;
            attribute->value.integer = truth;
            break;
        case OT_INT:
            if (take_u64(&in, &bits)) return -1;
            attribute->value.integer = (int64_t)bits;
            break;
        case OT_FLOAT:
            if (take_u64(&in, &bits)) return -1;
            memcpy(&attribute->value.number, &bits, 8);
            break;
        case OT_STR:
            if (take_str(&in, &attribute->value.text)) return -1;
            break;
        default: return -1;
        }
    }
    return in.at == in.end ? 0 : -1; /* exactly one record */
}

/* xoshiro256**, one state per process: the GIL (or the caller's own lock) serialises callers. */
static uint64_t state[4];
static int seeded;

static uint64_t rotate(uint64_t value, int by) { return value << by | value >> (64 - by); }

/* The kernel's random bytes: getrandom(2) by its system call (glibc < 2.25 has no wrapper), else /dev/urandom.
 * 0 when all were read. */
static int kernel_random(void *out, size_t size) {
#ifdef SYS_getrandom
    if (syscall(SYS_getrandom, out, size, 0) == (long)size) return 0;
#endif
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t got = read(fd, out, size);
    close(fd);
    return got == (ssize_t)size ? 0 : -1;
}

static uint64_t mix(uint64_t value) { /* splitmix64's finaliser */
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
    value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
    return value ^ (value >> 31);
}

static void seed(void) {
    uint64_t seed_words[4] = {0, 0, 0, 0};
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    /* Without the kernel's bytes (a seccomp filter, no /dev): time, pid and address, still distinct per
     * process and per rank; mixed in always, so even a failed read gives no two processes one sequence. */
    int from_kernel = kernel_random(seed_words, sizeof seed_words) == 0;
    uint64_t local = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    local ^= (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&now;
    for (int index = 0; index < 4; index++) {
        state[index] = seed_words[index] ^ mix(local + 0x9E3779B97F4A7C15ull * (uint64_t)(index + 1));
        if (!from_kernel) local = mix(local);
    }
    seeded = 1;
}

static void forget_seed(void) { seeded = 0; } /* a forked child draws ids of its own */

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forget_seed); }

uint64_t ot_random_id(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    if (!seeded) seed();
    for (;;) {
        uint64_t result = rotate(state[1] * 5, 7) * 9;
        uint64_t shifted = state[1] << 17;
        state[2] ^= state[0];
        state[3] ^= state[1];
        state[1] ^= state[2];
        state[0] ^= state[3];
        state[2] ^= shifted;
        state[3] = rotate(state[3], 45);
        if (result != 0) return result;
    }
}

int64_t ot_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

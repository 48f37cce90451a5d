/* A driver for the fuzz harnesses (fuzz_ring.c, fuzz_records.c) where libFuzzer is not at hand (gcc). Not
 * coverage-guided: it replays the files named on the command line (the seed corpus, or a crash to reproduce),
 * then, until OT_FUZZ_SECONDS (default 20) have passed, hands the harness mutants of them (bytes flipped, cut,
 * extended, small lengths planted), or random bytes without seeds. Each input is an exact-size heap copy, so
 * AddressSanitizer sees a read one byte past it. scripts/native-check uses libFuzzer instead when clang has it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

#define MAX_INPUT 8192
#define MAX_SEEDS 64

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ull;
}

static void run(const uint8_t *input, size_t size) {
    uint8_t *copy = malloc(size ? size : 1); /* exact size: an over-read is outside the allocation */
    if (copy == NULL) return;
    memcpy(copy, input, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
}

int main(int argc, char **argv) {
    static uint8_t seeds[MAX_SEEDS][MAX_INPUT], work[MAX_INPUT];
    static size_t seed_sizes[MAX_SEEDS];
    int count = 0;
    for (int index = 1; index < argc && count < MAX_SEEDS; index++) {
        FILE *file = fopen(argv[index], "rb");
        if (file == NULL) continue;
        seed_sizes[count] = fread(seeds[count], 1, MAX_INPUT, file);
        fclose(file);
        run(seeds[count], seed_sizes[count]);
        count++;
    }
    const char *seconds_text = getenv("OT_FUZZ_SECONDS");
    double seconds = seconds_text ? atof(seconds_text) : 20.0;
    const char *seed_text = getenv("OT_FUZZ_SEED");
    if (seed_text) state = strtoull(seed_text, NULL, 10) | 1;
    time_t started = time(NULL);
    unsigned long long runs = 0;
    while (difftime(time(NULL), started) < seconds) {
        for (int batch = 0; batch < 1000; batch++, runs++) {
            size_t size;
            if (count) {
                int seed = (int)(next() % (uint64_t)count);
                size = seed_sizes[seed];
                memcpy(work, seeds[seed], size);
            } else {
                size = next() % 512;
                for (size_t byte = 0; byte < size; byte++) work[byte] = (uint8_t)next();
            }
            for (int mutation = (int)(next() % 4) + 1; mutation > 0; mutation--) {
                switch (next() % 5) {
                case 0: if (size) work[next() % size] = (uint8_t)next(); break;        /* flip a byte */
                case 1: if (size) size = next() % size; break;                         /* cut */
                case 2: { /* extend with random bytes */
                    size_t more = next() % 64;
                    for (; more && size < MAX_INPUT; more--) work[size++] = (uint8_t)next();
                    break;
                }
                case 3: if (size >= 4) { /* plant a small length where one may be read */
                    uint32_t length = (uint32_t)(next() % 96);
                    memcpy(work + next() % (size - 3), &length, 4);
                }
                break;
                default: if (size >= 8) { /* a big number where one may be read */
                    uint64_t big = next() >> (next() % 64);
                    size_t at = next() % (size - 7);
                    memcpy(work + at, &big, 8);
                }
                }
            }
            run(work, size);
        }
    }
    printf("fuzz: %llu inputs in %.0f s from %d seeds, no fault\n", runs, seconds, count);
    return 0;
}

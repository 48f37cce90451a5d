/* A driver for the fuzz harnesses (fuzz_ring.c, fuzz_records.c) where libFuzzer is not at hand (gcc): replays the files named on the command line
 * (a corpus, or a crash to reproduce), then feeds random and mutated inputs until OT_FUZZ_SECONDS (default 20)
 * have passed. Not coverage-guided; scripts/native-check uses libFuzzer instead when clang has it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ull;
}

int main(int argc, char **argv) {
    static uint8_t input[8192];
    for (int index = 1; index < argc; index++) {
        FILE *file = fopen(argv[index], "rb");
        if (file == NULL) continue;
        size_t size = fread(input, 1, sizeof input, file);
        fclose(file);
        LLVMFuzzerTestOneInput(input, size);
    }
    const char *seconds_text = getenv("OT_FUZZ_SECONDS");
    double seconds = seconds_text ? atof(seconds_text) : 20.0;
    const char *seed_text = getenv("OT_FUZZ_SEED");
    if (seed_text) state = strtoull(seed_text, NULL, 10) | 1;
    time_t started = time(NULL);
    unsigned long long runs = 0;
    size_t size = 64;
    for (size_t byte = 0; byte < sizeof input; byte++) input[byte] = (uint8_t)next();
    while (difftime(time(NULL), started) < seconds) {
        for (int batch = 0; batch < 1000; batch++, runs++) {
            uint64_t choice = next();
            switch (choice % 4) {
            case 0: size = next() % sizeof input; break;                       /* a new length */
            case 1: input[next() % sizeof input] = (uint8_t)next(); break;     /* flip a byte */
            case 2: { /* plant a small length prefix where the reader will look */
                uint32_t length = (uint32_t)(next() % 96);
                size_t at = 32 + next() % 256;
                memcpy(input + at, &length, 4);
                break;
            }
            default: { /* header words near each other: positions that frame */
                uint64_t base = next() >> (next() % 64);
                uint64_t write = base + next() % 512;
                memcpy(input + 8, &write, 8);
                memcpy(input + 16, &base, 8);
                input[0] |= (uint8_t)(next() % 16);
            }
            }
            LLVMFuzzerTestOneInput(input, size);
        }
    }
    printf("fuzz: %llu inputs in %.0f s, no fault\n", runs, seconds);
    return 0;
}

/* The C tests' one assertion: counts, reports the line of a failure, and lets the test go on.
 * Each test program prints "N passed, N failed" (the plain closing line CI reads) and fails on any failure. */
#ifndef OT_CHECK_H
#define OT_CHECK_H

#include <stdio.h>

static int passed, failed;
#define CHECK(condition)                                                                    \
    do {                                                                                    \
        if (condition) {                                                                    \
            passed++;                                                                       \
        } else {                                                                            \
            failed++;                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition);   \
        }                                                                                   \
    } while (0)

static int report(void) {
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#endif

/* fuzz_trace.c — libFuzzer target: the trace-file reader. */
#include "policy/trace.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sh_trace *t = NULL;
    char err[256];
    if (sh_trace_parse("fuzz.trace", (const char *)data, size, &t, err, sizeof err) == 0) {
        for (size_t i = 0; i < sh_trace_count(t); i++)
            (void)sh_trace_at(t, i);
        sh_trace_destroy(t);
    }
    return 0;
}

/* fuzz_config.c — libFuzzer target: stagehand.ini text through the ini
 * handler, the value parsers and the combination checks. */
#include "config/config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    struct sh_config cfg;
    char err[SH_CONFIG_ERR_MAX];
    sh_config_defaults(&cfg);
    if (sh_config_load_string(&cfg, "fuzz.ini", text, err, sizeof err) == 0)
        sh_config_resolve(&cfg, 80ull << 30, 256ull << 30, err, sizeof err);
    free(text);
    return 0;
}

/* torch.c — what the library can tell from PyTorch's allocator settings.
 *
 * With expandable_segments on, PyTorch's caching allocator maps its own
 * virtual memory (cuMemCreate and cuMemMap, reached through the driver's
 * entry points) and never calls cudaMalloc: nothing it allocates becomes a
 * region, so the library would manage nothing while seeming to run. Until
 * those mappings are managed too, the program is told, in one line, what to
 * change. PyTorch up to 2.9 reads PYTORCH_CUDA_ALLOC_CONF; later versions
 * read PYTORCH_ALLOC_CONF first.
 *
 * Shared state: none.
 */
#include "interpose/interpose.h"

#include "sh_log.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The value of `key` in a "key:value,key:value" setting, copied into out;
 * 0 when present. */
static int setting(const char *conf, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);
    for (const char *p = conf; p && *p;) {
        p += strspn(p, " ");
        const char *end = p + strcspn(p, ",");
        if ((size_t)(end - p) > klen && !strncmp(p, key, klen) && p[klen] == ':') {
            size_t n = (size_t)(end - p) - klen - 1;
            n = n < cap - 1 ? n : cap - 1;
            memcpy(out, p + klen + 1, n);
            out[n] = '\0';
            out[strcspn(out, " ")] = '\0';
            return 0;
        }
        p = *end ? end + 1 : end;
    }
    return -1;
}

int sh_torch_expandable(const char *conf)
{
    char v[32];
    if (!conf || setting(conf, "expandable_segments", v, sizeof v) != 0 ||
        (strcasecmp(v, "true") != 0 && strcmp(v, "1") != 0))
        return 0;
    /* the cudaMallocAsync backend ignores it: every tensor is a cudaMallocAsync */
    return setting(conf, "backend", v, sizeof v) != 0 || strcmp(v, "cudaMallocAsync") != 0;
}

void sh_torch_check_env(void)
{
    static const char *const vars[] = {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *conf = getenv(vars[i]);
        if (sh_torch_expandable(conf)) {
            sh_log(SH_LOG_WARN,
                   "%s has expandable_segments on: PyTorch then maps its own memory and "
                   "stagehand manages none of it; remove it, or set backend:cudaMallocAsync",
                   vars[i]);
            return;
        }
    }
}

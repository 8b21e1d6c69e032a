/* torch.c — what the library can tell from PyTorch's allocator settings.
 *
 * With expandable_segments on, PyTorch's caching allocator maps its own
 * virtual memory (cuMemCreate and cuMemMap, reached through the driver's
 * entry points) and never calls cudaMalloc. vmm.c manages those mappings;
 * where it cannot ([regions] manage_program_vmm off, or no eviction on this
 * device) nothing PyTorch allocates becomes a region, and the program is
 * told, in one line, what to change. PyTorch up to 2.9 reads
 * PYTORCH_CUDA_ALLOC_CONF; later versions read PYTORCH_ALLOC_CONF first.
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
        if (!sh_torch_expandable(getenv(vars[i])))
            continue;
        if (!sh_rt.cfg.regions.manage_program_vmm)
            sh_log(SH_LOG_WARN,
                   "%s has expandable_segments on and [regions] manage_program_vmm is false: "
                   "PyTorch maps its own memory and stagehand manages none of it; set it to "
                   "true, or set backend:cudaMallocAsync",
                   vars[i]);
        else if (!sh_dev_main()->host)
            sh_log(SH_LOG_WARN,
                   "%s has expandable_segments on, but eviction is off on this device: the "
                   "memory PyTorch maps itself is left to the driver",
                   vars[i]);
        else
            sh_log(SH_LOG_INFO,
                   "%s has expandable_segments on: the memory PyTorch maps itself is managed "
                   "(sharing it with another process is refused)",
                   vars[i]);
        return;
    }
}

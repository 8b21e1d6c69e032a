/* learn.c — which regions are worth keeping a host copy for: one that is
 * dirty at every eviction pays a fingerprint each time and saves nothing.
 *
 * No shared state: the caller guards each region's record.
 */
#include "clean/clean.h"

#define BACKOFF_FIRST 8
#define BACKOFF_MAX   128

int sh_clean_learn_keep(struct sh_clean_learn *l)
{
    if (l->skip == 0)
        return 1;
    l->skip--;
    return 0;
}

void sh_clean_learn_note(struct sh_clean_learn *l, int clean)
{
    if (clean) {
        *l = (struct sh_clean_learn){0};
        return;
    }
    if (l->dirty_run < UINT8_MAX)
        l->dirty_run++;
    if (l->dirty_run < SH_CLEAN_DIRTY_RUN)
        return;
    /* Dirty again after a pause: pause twice as long. */
    unsigned next = l->backoff ? l->backoff * 2u : BACKOFF_FIRST;
    l->backoff = (uint8_t)(next > BACKOFF_MAX ? BACKOFF_MAX : next);
    l->skip = l->backoff;
}

/* ui.h — the interactive screen (ui.c), as main.c starts it. */
#ifndef SH_TOP_UI_H
#define SH_TOP_UI_H

#include "tools/stagehand-top/top.h"

struct top_ui_opts {
    const char *dir; /* where segments live; NULL = /dev/shm */
    double delay_s;  /* refresh period */
    int utf8;        /* Unicode blocks and lines */
    int mono;        /* no colours */
    int sort;        /* initial enum top_sort */
};

/* Runs until the user quits. r may be NULL: the picker opens first. Takes
 * ownership of r. Returns the exit status. */
int top_ui_run(const struct top_ui_opts *o, struct top_model *m, struct sh_tm_reader *r);

#endif

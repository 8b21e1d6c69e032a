/* layout.c — where each panel goes for a terminal of rows x cols. Pure
 * arithmetic: no terminal, no globals; unit-tested across sizes for overlap
 * and for staying on screen.
 *
 *   narrow (< 100 cols)              wide (>= 100 cols)
 *   title                            title
 *   VRAM bar                         VRAM bar        | info
 *   host bars                        host bars       | info
 *   info                             H2D sparkline   | D2H sparkline
 *   H2D sparkline                    regions table  [| events, >= 170 cols]
 *   D2H sparkline                   [events, >= 44 rows]
 *   regions table                    status
 *   status
 */
#include "tools/stagehand-top/top.h"

#include <string.h>

#define TABLE_MIN 4 /* header and three rows */
#define WIDE_COLS 100

static struct top_rect rect(int y, int x, int h, int w)
{
    struct top_rect r = {y, x, h > 0 ? h : 0, w > 0 ? w : 0};
    if (!r.h || !r.w)
        r.h = r.w = 0;
    return r;
}

static int min_i(int a, int b)
{
    return a < b ? a : b;
}

static int max_i(int a, int b)
{
    return a > b ? a : b;
}

/* Graph height: taller graphs when the terminal has rows to spare. */
static int spark_rows(int rows)
{
    return rows >= 40 ? 3 : rows >= 28 ? 2 : 1;
}

/* Returns the first row below the meters. */
static int wide_top(struct top_layout *l, int nhost, int *y)
{
    int rows = l->rows, cols = l->cols;
    int sh = spark_rows(rows);
    int lw = cols / 2 - 1, rx = lw + 2, rw = cols - rx;
    int tmax = rows - 2 - sh - TABLE_MIN; /* rows for the meters and the info panel */
    int host = min_i(nhost, max_i(tmax - 1, 0));
    int info = min_i(TOP_INFO_ROWS, tmax);
    l->vram = rect(1, 0, 1, lw);
    l->host = rect(2, 0, host, lw);
    l->info = rect(1, rx, info, rw);
    int top = 1 + max_i(1 + host, info);
    l->spark_h2d = rect(top, 0, sh, lw);
    l->spark_d2h = rect(top, rx, sh, rw);
    *y = top + sh;
    return *y;
}

static int narrow_top(struct top_layout *l, int nhost, int *y)
{
    int rows = l->rows, cols = l->cols;
    int sh = spark_rows(rows);
    int avail = rows - 3 - 2 * sh - TABLE_MIN; /* title, status, VRAM bar and graphs taken */
    int host = min_i(nhost, max_i(avail - TOP_INFO_ROWS, 0));
    if (host == 0 && avail > 1)
        host = 1;
    int info = min_i(TOP_INFO_ROWS, avail - host);
    l->vram = rect(1, 0, 1, cols);
    l->host = rect(2, 0, host, cols);
    l->info = rect(2 + host, 0, info, cols);
    int top = 2 + host + max_i(info, 0);
    l->spark_h2d = rect(top, 0, sh, cols);
    l->spark_d2h = rect(top + sh, 0, sh, cols);
    *y = top + 2 * sh;
    return *y;
}

/* The events panel beside the table on very wide terminals, below it on
 * tall ones, or not at all. */
static void place_events(struct top_layout *l)
{
    struct top_rect *t = &l->table;
    if (l->cols >= 170 && t->h >= TABLE_MIN) {
        l->events = rect(t->y, l->cols - TOP_EVENTS_W, t->h, TOP_EVENTS_W);
        t->w = l->cols - TOP_EVENTS_W - 1;
    } else if (l->rows >= 44) {
        int eh = min_i(12, t->h - 2 * TABLE_MIN);
        if (eh >= 4) {
            t->h -= eh;
            l->events = rect(t->y + t->h, 0, eh, l->cols);
        }
    }
}

void top_layout(int rows, int cols, int nclasses, struct top_layout *out)
{
    struct top_layout *l = out;
    memset(l, 0, sizeof *l);
    l->rows = rows;
    l->cols = cols;
    if (rows < TOP_MIN_ROWS || cols < TOP_MIN_COLS) {
        l->too_small = 1;
        if (rows > 0 && cols > 0)
            l->message = rect(rows / 2, 0, 1, cols);
        return;
    }
    int nhost = max_i(nclasses, 1), y = 0;
    l->title = rect(0, 0, 1, cols);
    l->status = rect(rows - 1, 0, 1, cols);
    if (cols >= WIDE_COLS)
        wide_top(l, nhost, &y);
    else
        narrow_top(l, nhost, &y);
    l->table = rect(y, 0, rows - 1 - y, cols);
    place_events(l);
}

struct top_rect top_help_rect(int rows, int cols)
{
    int h = min_i(22, rows - 2), w = min_i(64, cols - 4);
    return rect((rows - h) / 2, (cols - w) / 2, h, w);
}

int top_layout_rects(const struct top_layout *l, struct top_rect *out, int max)
{
    const struct top_rect *all[] = {&l->message, &l->title,     &l->vram,      &l->host,
                                    &l->info,    &l->spark_h2d, &l->spark_d2h, &l->table,
                                    &l->events,  &l->status};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->h > 0 && all[i]->w > 0 && n < max)
            out[n++] = *all[i];
    return n;
}

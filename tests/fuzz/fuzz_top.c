/* fuzz_top.c — libFuzzer target: stagehand-top from a segment to every output.
 * Each input is a segment file; it goes through the reader, collect (twice, so
 * that rates are computed; its last byte picks the sort order) and every output mode: the
 * full-screen render at several sizes with and without UTF-8, the help box, --once, --json and
 * --prometheus. A hostile segment must give sane text, never undefined
 * behaviour (the sanitizers stop on an out-of-range conversion).
 */
#include "telemetry/tm_internal.h"
#include "tools/stagehand-top/top.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void render_all(const struct top_model *m)
{
    static const int sizes[][2] = {{24, 80}, {60, 220}, {8, 30}, {1, 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int utf8 = 0; utf8 < 2; utf8++) {
            struct top_grid *g = top_grid_new(sizes[i][0], sizes[i][1], utf8);
            if (!g)
                continue;
            struct top_view v = {.delay_s = 1.0, .help = (int)i == 2};
            top_render(top_grid_canvas(g), m, &v);
            if (v.help)
                top_render_help(top_grid_canvas(g));
            top_grid_free(g);
        }
    }
    FILE *null = fopen("/dev/null", "w");
    if (!null)
        return;
    top_print_once(null, m, 100, 1);
    top_print_once(null, m, 40, 0);
    top_print_json(null, m);
    top_print_prometheus(null, m);
    fclose(null);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/stagehand-fuzz-top.%d", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return 0;
    /* An odd sequence word reads as a writer mid-update: the reader would wait out
     * its timeout on every such input. Even it, so the time goes to the outputs. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) {
        close(fd);
        return 0;
    }
    memcpy(copy, data, size);
    size_t seq = offsetof(struct sh_tm_shm_hdr, seq);
    if (size > seq)
        copy[seq] &= 0xfe;
    ssize_t w = write(fd, copy, size);
    free(copy);
    close(fd);
    struct sh_tm_reader *r = NULL;
    if (w == (ssize_t)size && sh_tm_open_path(path, &r, err, sizeof err) == 0) {
        struct top_model *m = calloc(1, sizeof *m);
        if (m && top_collect(m, r) == 0 && top_collect(m, r) == 0) {
            m->sort = size ? data[size - 1] % TOP_SORT_N : 0; /* every order, across inputs */
            top_model_update(m);
            render_all(m);
        }
        free(m);
        sh_tm_close(r);
    }
    unlink(path);
    return 0;
}

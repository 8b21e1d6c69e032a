/* main.c — stagehand-top: options, choosing the process, and the one-shot
 * outputs. Exit status: 0 done, 1 nothing to show (no segment, corrupt
 * segment, several processes and no terminal to ask on), 2 bad usage,
 * 3 the process is gone (stale segment).
 */
#include "tools/stagehand-top/ui.h"

#include "sh_err.h"
#include "stagehand.h"

#include <errno.h>
#include <getopt.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

enum mode { MODE_UI, MODE_ONCE, MODE_JSON, MODE_PROM, MODE_CLEAN };

struct opts {
    int pid;
    double delay_s;
    int mode;
    int ascii, mono, sort;
    const char *dir;
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: stagehand-top [-p PID] [-d SECONDS] [--once | --json | --prometheus]\n"
            "                     [--sort size|state|evictions] [--ascii] [--no-color]\n"
            "                     [--dir DIR] [--clean]\n"
            "\n"
            "Shows what libstagehand is doing in a running program: VRAM against the\n"
            "budget and watermarks, the pinned host pool, copy throughput, prefetch hits,\n"
            "stalls, and the largest regions.\n"
            "\n"
            "  -p, --pid PID      attach to this process (default: the one running, or a list)\n"
            "  -d, --delay SECS   refresh period, e.g. 0.5 (default 1)\n"
            "      --once         print one plain-text snapshot and exit\n"
            "      --json         print one JSON object and exit\n"
            "      --prometheus   print the figures in the Prometheus text format and exit\n"
            "      --sort KEY     order the regions by size, state or evictions\n"
            "      --ascii        no Unicode blocks or lines\n"
            "      --no-color     monochrome\n"
            "      --dir DIR      where the segments live (default " SH_TM_SHM_DIR ")\n"
            "      --clean        remove segments left by processes that are gone, and exit\n"
            "  -h, --help         this text;  -V, --version  the version\n"
            "\n"
            "Keys: q quit, s/F6 sort, p pick a process, h/F1 help.\n"
            "Exit status: 0 ok, 1 nothing to show, 2 bad usage, 3 the process is gone.\n");
}

static int bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "stagehand-top: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'stagehand-top --help'.\n");
    return 2;
}

static int parse_pid(const char *s, int *pid)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v <= 0 || v > INT_MAX)
        return -1;
    *pid = (int)v;
    return 0;
}

static int parse_sort(const char *s)
{
    for (int i = 0; i < TOP_SORT_N; i++)
        if (!strcmp(s, top_sort_name(i)))
            return i;
    return -1;
}

static int set_mode(struct opts *o, int mode)
{
    if (o->mode != MODE_UI && o->mode != mode)
        return -1;
    o->mode = mode;
    return 0;
}

/* Returns -1 to go on, or the exit status. */
static int parse(int argc, char **argv, struct opts *o)
{
    static const struct option longs[] = {{"pid", required_argument, NULL, 'p'},
                                          {"delay", required_argument, NULL, 'd'},
                                          {"once", no_argument, NULL, 'O'},
                                          {"json", no_argument, NULL, 'J'},
                                          {"prometheus", no_argument, NULL, 'P'},
                                          {"sort", required_argument, NULL, 'S'},
                                          {"ascii", no_argument, NULL, 'A'},
                                          {"no-color", no_argument, NULL, 'C'},
                                          {"dir", required_argument, NULL, 'D'},
                                          {"clean", no_argument, NULL, 'X'},
                                          {"help", no_argument, NULL, 'h'},
                                          {"version", no_argument, NULL, 'V'},
                                          {NULL, 0, NULL, 0}};
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":p:d:hV", longs, NULL)) != -1;) {
        char *end;
        int mode = c == 'O' ? MODE_ONCE : c == 'J' ? MODE_JSON : c == 'P' ? MODE_PROM : MODE_CLEAN;
        switch (c) {
        case 'p':
            if (parse_pid(optarg, &o->pid))
                return bad_usage("-p: not a process id: '%s'", optarg);
            break;
        case 'd':
            o->delay_s = strtod(optarg, &end);
            if (end == optarg || *end || !(o->delay_s >= 0.1 && o->delay_s <= 3600))
                return bad_usage("-d: want seconds from 0.1 to 3600, got '%s'", optarg);
            break;
        case 'O':
        case 'J':
        case 'P':
        case 'X':
            if (set_mode(o, mode))
                return bad_usage("%s",
                                 "--once, --json, --prometheus and --clean exclude each other");
            break;
        case 'S':
            if ((o->sort = parse_sort(optarg)) < 0)
                return bad_usage("--sort: want size, state or evictions, got '%s'", optarg);
            break;
        case 'A':
            o->ascii = 1;
            break;
        case 'C':
            o->mono = 1;
            break;
        case 'D':
            o->dir = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("stagehand-top %d.%d.%d\n", STAGEHAND_VERSION_MAJOR, STAGEHAND_VERSION_MINOR,
                   STAGEHAND_VERSION_PATCH);
            return 0;
        case ':':
            return bad_usage("%s needs a value", argv[optind - 1]);
        default:
            return bad_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad_usage("unexpected argument '%s'", argv[optind]);
    return -1;
}

/* ---- choosing the process -------------------------------------------------------- */

static const char *dir_name(const struct opts *o)
{
    return o->dir ? o->dir : SH_TM_SHM_DIR;
}

/* Sets *pid to the one live process; 0 with *pid 0 when the user must pick;
 * otherwise prints why and returns the exit status. */
static int choose(const struct opts *o, int *pid)
{
    struct sh_tm_seg_info segs[64];
    int n = sh_tm_list(o->dir, segs, 64), live = 0, stale = 0;
    if (n < 0) {
        fprintf(stderr, "stagehand-top: cannot read %s\n", dir_name(o));
        return 1;
    }
    n = n > 64 ? 64 : n;
    for (int i = 0; i < n; i++) {
        if (!segs[i].stale && !segs[i].corrupt && live++ == 0)
            *pid = segs[i].pid;
        stale += segs[i].stale;
    }
    if (live == 1)
        return 0;
    if (live > 1 && o->mode == MODE_UI && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)) {
        *pid = 0;
        return 0;
    }
    if (live > 1) {
        fprintf(stderr, "stagehand-top: %d processes use stagehand; choose one with -p:", live);
        for (int i = 0; i < n; i++)
            if (!segs[i].stale && !segs[i].corrupt)
                fprintf(stderr, " %d", segs[i].pid);
        fputc('\n', stderr);
        return 1;
    }
    fprintf(stderr, "stagehand-top: no running process uses stagehand (nothing live in %s)\n",
            dir_name(o));
    for (int i = 0; i < n; i++)
        if (segs[i].stale)
            fprintf(stderr, "stagehand-top: %s/stagehand.%d is stale: pid %d is gone\n",
                    dir_name(o), segs[i].pid, segs[i].pid);
    if (stale)
        fprintf(stderr, "stagehand-top: 'stagehand-top --clean' removes stale segments\n");
    return 1;
}

static int clean(const struct opts *o)
{
    struct sh_tm_seg_info segs[256];
    int n = sh_tm_list(o->dir, segs, 256), removed = 0;
    for (int i = 0; i < n && i < 256; i++) {
        char path[PATH_MAX];
        if (!segs[i].stale || snprintf(path, sizeof path, "%s/stagehand.%d", dir_name(o),
                                       segs[i].pid) >= (int)sizeof path)
            continue;
        if (unlink(path) == 0) {
            printf("removed %s (pid %d is gone)\n", path, segs[i].pid);
            removed++;
        }
    }
    if (!removed)
        printf("no stale segments in %s\n", dir_name(o));
    return 0;
}

/* ---- one-shot outputs ---------------------------------------------------------------- */

static int term_cols(void)
{
    struct winsize ws;
    if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col)
        return ws.ws_col < TOP_MIN_COLS ? TOP_MIN_COLS : ws.ws_col > 300 ? 300 : ws.ws_col;
    return 120;
}

static int one_shot(const struct opts *o, struct top_model *m, struct sh_tm_reader *r, int utf8)
{
    int rc = top_collect(m, r);
    if (m->stale) {
        fprintf(stderr,
                "stagehand-top: pid %d: stale segment %s/stagehand.%d: the process is gone "
                "(not live; 'stagehand-top --clean' removes it)\n",
                m->pid, dir_name(o), m->pid);
        return 3;
    }
    if (rc != SH_OK) {
        fprintf(stderr, "stagehand-top: pid %d: cannot read a consistent snapshot: %s\n", m->pid,
                sh_strerror(rc));
        return 1;
    }
    if (o->mode == MODE_JSON)
        rc = top_print_json(stdout, m);
    else if (o->mode == MODE_PROM)
        rc = top_print_prometheus(stdout, m);
    else
        rc = top_print_once(stdout, m, term_cols(), utf8);
    return rc ? 1 : 0;
}

static int run(const struct opts *o)
{
    int pid = o->pid;
    if (o->mode == MODE_CLEAN)
        return clean(o);
    if (!pid) {
        int rc = choose(o, &pid);
        if (rc)
            return rc;
    }
    int utf8 = !o->ascii && !strcmp(nl_langinfo(CODESET), "UTF-8");
    struct sh_tm_reader *r = NULL;
    char err[512];
    int orc = pid ? sh_tm_open(o->dir, pid, &r, err, sizeof err) : SH_OK;
    if (orc == SH_ENOTFOUND && (kill(pid, 0) == 0 || errno == EPERM)) {
        fprintf(stderr,
                "stagehand-top: process %d exists but publishes no segment in %s: it does not use "
                "stagehand, or runs with [telemetry] shm_enabled = false\n",
                pid, dir_name(o));
        return 1;
    }
    if (orc == SH_ENOTFOUND) {
        fprintf(stderr, "stagehand-top: no process %d, and no segment %s/stagehand.%d\n", pid,
                dir_name(o), pid);
        return 1;
    }
    if (orc != SH_OK) {
        fprintf(stderr, "stagehand-top: %s\n", err);
        return 1;
    }
    struct top_model *m = calloc(1, sizeof *m);
    if (!m) {
        sh_tm_close(r);
        return 1;
    }
    m->sort = o->sort;
    int rc;
    if (o->mode == MODE_UI && r && sh_tm_reader_stale(r)) {
        fprintf(stderr,
                "stagehand-top: pid %d: stale segment %s/stagehand.%d: the process is gone\n", pid,
                dir_name(o), pid);
        sh_tm_close(r);
        rc = 3;
    } else if (o->mode == MODE_UI) {
        struct top_ui_opts u = {o->dir, o->delay_s, utf8, o->mono, o->sort};
        rc = top_ui_run(&u, m, r);
    } else {
        rc = one_shot(o, m, r, utf8);
        sh_tm_close(r);
    }
    free(m);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o = {.delay_s = 1.0, .mode = MODE_UI};
    setlocale(LC_ALL, "");
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    /* Without a terminal there is nothing to be interactive on: print once. */
    if (o.mode == MODE_UI && (!isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO)))
        o.mode = MODE_ONCE;
    return run(&o);
}

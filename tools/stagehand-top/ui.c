/* ui.c — the interactive screen: the ncurses canvas, colours (with a
 * monochrome fallback), the key loop and the process picker.
 *
 * Single-threaded. SIGINT/SIGTERM only set `quit` (no SA_RESTART, so a
 * waiting getch returns), and the loop restores the terminal before exiting.
 */
#include "tools/stagehand-top/ui.h"

#include "sh_err.h"

#include <curses.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define KEY_ESC 27

static volatile sig_atomic_t quit;
static int attr_map[TA_COUNT];

static void on_quit(int sig)
{
    (void)sig;
    quit = 1;
}

/* ---- the canvas ------------------------------------------------------------------- */

static void curses_put(struct top_canvas *cv, int y, int x, const char *s, int ncells, int attr)
{
    (void)ncells;
    if (y < 0 || x < 0 || y >= cv->rows || x >= cv->cols) {
        cv->offscreen++;
        return;
    }
    attrset(attr_map[attr >= 0 && attr < TA_COUNT ? attr : 0]);
    mvaddstr(y, x, s); /* the bottom-right cell reports ERR yet draws */
}

/* ---- colours ------------------------------------------------------------------------ */

static void mono(void)
{
    static const struct {
        int attr;
        int a;
    } m[] = {
        {TA_TITLE, A_REVERSE | A_BOLD},
        {TA_TITLE_BAD, A_REVERSE | A_BOLD | A_UNDERLINE},
        {TA_VALUE, A_BOLD},
        {TA_DIM, A_DIM},
        {TA_WARN, A_BOLD},
        {TA_BAD, A_BOLD | A_UNDERLINE},
        {TA_MARK_LOW, A_BOLD},
        {TA_MARK_HIGH, A_BOLD | A_REVERSE},
        {TA_BRACKET, A_BOLD},
        {TA_HEADER, A_REVERSE},
        {TA_HEADER_SORT, A_REVERSE | A_BOLD},
        {TA_KEY, A_REVERSE},
        {TA_HOST, A_BOLD},
        {TA_MOVING, A_BOLD | A_UNDERLINE},
        {TA_FREED, A_DIM},
        {TA_SELECT, A_REVERSE},
    };
    for (int i = 0; i < TA_COUNT; i++)
        attr_map[i] = A_NORMAL;
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        attr_map[m[i].attr] = m[i].a;
}

static void colours(void)
{
    static const struct {
        int attr, fg, bg, extra;
    } c[] = {
        {TA_TITLE, COLOR_BLACK, COLOR_CYAN, A_BOLD},
        {TA_TITLE_BAD, COLOR_WHITE, COLOR_RED, A_BOLD},
        {TA_LABEL, COLOR_CYAN, -1, 0},
        {TA_OK, COLOR_GREEN, -1, 0},
        {TA_WARN, COLOR_YELLOW, -1, A_BOLD},
        {TA_BAD, COLOR_RED, -1, A_BOLD},
        {TA_MARK_LOW, COLOR_BLACK, COLOR_YELLOW, A_BOLD},
        {TA_MARK_HIGH, COLOR_WHITE, COLOR_RED, A_BOLD},
        {TA_HEADER, COLOR_BLACK, COLOR_GREEN, 0},
        {TA_HEADER_SORT, COLOR_BLACK, COLOR_CYAN, A_BOLD},
        {TA_KEY, COLOR_BLACK, COLOR_CYAN, 0},
        {TA_SPARK_H2D, COLOR_GREEN, -1, 0},
        {TA_SPARK_D2H, COLOR_MAGENTA, -1, 0},
        {TA_RESIDENT, COLOR_GREEN, -1, 0},
        {TA_HOST, COLOR_YELLOW, -1, 0},
        {TA_MOVING, COLOR_MAGENTA, -1, A_BOLD},
        {TA_SELECT, COLOR_BLACK, COLOR_CYAN, 0},
    };
    mono();
    attr_map[TA_HEADER_SORT] = A_REVERSE | A_BOLD;
    start_color();
    use_default_colors();
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        short pair = (short)(i + 1);
        if (init_pair(pair, (short)c[i].fg, (short)c[i].bg) == OK)
            attr_map[c[i].attr] = (int)COLOR_PAIR(pair) | c[i].extra;
    }
}

/* ---- the loop ---------------------------------------------------------------------------- */

struct ui {
    const struct top_ui_opts *o;
    struct top_model *m;
    struct sh_tm_reader *r;
    struct top_canvas cv;
    int help;
    char note[512];
    uint64_t note_until;
};

static void set_note(struct ui *u, const char *msg)
{
    snprintf(u->note, sizeof u->note, "%s", msg);
    u->note_until = sh_tm_now_us() + 3000000;
}

static void draw(struct ui *u)
{
    getmaxyx(stdscr, u->cv.rows, u->cv.cols);
    struct top_view v = {.help = u->help,
                         .delay_s = u->o->delay_s,
                         .note = sh_tm_now_us() < u->note_until ? u->note : NULL};
    erase();
    top_render(&u->cv, u->m, &v);
    refresh();
}

/* Lets the user choose a process; returns its pid, or 0 if they backed out. */
static int picker(struct ui *u)
{
    struct sh_tm_seg_info segs[64];
    int sel = 0;
    for (uint64_t next = 0; !quit;) {
        int n = 0;
        if (sh_tm_now_us() >= next) {
            n = sh_tm_list(u->o->dir, segs, 64);
            n = n < 0 ? 0 : n > 64 ? 64 : n;
            next = sh_tm_now_us() + 1000000;
        }
        sel = sel >= n ? n - 1 : sel < 0 ? 0 : sel;
        getmaxyx(stdscr, u->cv.rows, u->cv.cols);
        erase();
        top_render_picker(&u->cv, segs, n, sel, u->o->dir);
        refresh();
        timeout(1000);
        int ch = getch();
        if (ch == 'q' || ch == KEY_ESC || ch == KEY_F(10))
            return 0;
        if ((ch == KEY_UP || ch == 'k') && sel > 0)
            sel--;
        else if ((ch == KEY_DOWN || ch == 'j') && sel < n - 1)
            sel++;
        else if ((ch == '\n' || ch == '\r' || ch == KEY_ENTER) && n > 0 && !segs[sel].corrupt)
            return segs[sel].pid;
        if (ch != ERR)
            next = 0; /* keep the list fresh while the user moves */
    }
    return 0;
}

/* Switches to pid; keeps the current process (and says why) on failure. */
static void attach(struct ui *u, int pid)
{
    char err[256];
    struct sh_tm_reader *r = NULL;
    int rc = sh_tm_open(u->o->dir, pid, &r, err, sizeof err);
    if (rc != SH_OK) {
        set_note(u, err);
        return;
    }
    sh_tm_close(u->r);
    u->r = r;
    memset(u->m, 0, sizeof *u->m);
    u->m->sort = u->o->sort;
    top_collect(u->m, u->r);
}

static int handle_key(struct ui *u, int ch, uint64_t *next)
{
    if (u->help && ch != KEY_RESIZE && ch != ERR) {
        u->help = 0;
        return 0;
    }
    switch (ch) {
    case 'q':
    case 'Q':
    case KEY_F(10):
        return 1;
    case 's':
    case 'S':
    case KEY_F(6):
        u->m->sort = (u->m->sort + 1) % TOP_SORT_N;
        top_model_update(u->m);
        break;
    case 'h':
    case '?':
    case KEY_F(1):
        u->help = 1;
        break;
    case 'p':
    case 'P': {
        int pid = picker(u);
        if (pid > 0)
            attach(u, pid);
        *next = 0;
        break;
    }
    case ' ':
    case 'r':
        *next = 0;
        break;
    case KEY_RESIZE:
        clearok(stdscr, TRUE); /* repaint everything at the new size */
        break;
    default:
        break;
    }
    return 0;
}

static void loop(struct ui *u)
{
    uint64_t next = 0, period = (uint64_t)(u->o->delay_s * 1e6);
    while (!quit) {
        uint64_t now = sh_tm_now_us();
        if (now >= next) {
            top_collect(u->m, u->r);
            next = now + period;
        }
        draw(u);
        uint64_t left = next > sh_tm_now_us() ? next - sh_tm_now_us() : 0;
        timeout((int)(left / 1000) + 1);
        if (handle_key(u, getch(), &next))
            break;
    }
}

static void catch_quit(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_quit; /* no SA_RESTART: getch returns at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int top_ui_run(const struct top_ui_opts *o, struct top_model *m, struct sh_tm_reader *r)
{
    struct ui u = {.o = o, .m = m, .r = r};
    catch_quit();
    if (!initscr())
        return 1;
    cbreak();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    curs_set(0);
    if (has_colors() && !o->mono)
        colours();
    else
        mono();
    u.cv = (struct top_canvas){.utf8 = o->utf8, .put = curses_put, .ctx = &u};
    if (!u.r) { /* several processes and no -p: ask first */
        int pid = picker(&u);
        if (pid > 0)
            attach(&u, pid);
    }
    if (u.r)
        loop(&u);
    endwin();
    sh_tm_close(u.r);
    return 0;
}

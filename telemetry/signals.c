/* signals.c — removing the segment when the process dies of SIGTERM, SIGINT
 * or SIGHUP, without changing what those signals do to the program.
 *
 * Our handler looks at the disposition it replaced: a program handler is
 * called (the program may well go on running, so the segment stays and the
 * atexit hook removes it later); an ignored signal stays ignored (we never
 * install over SIG_IGN, so nohup and exec'd children keep it); only for the
 * default action (death) do we unlink the segment, restore SIG_DFL and
 * re-raise, so the process still dies of the original signal.
 *
 * State: seg_path/seg_owner are written before `armed` is set (seq_cst) and
 * `armed` is cleared before the path changes; the handler only reads them.
 * The handlers are installed once per process and never removed: a program
 * may have installed its own on top since.
 */
#include "telemetry/tm_internal.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
#define NSIGS ((int)(sizeof sigs / sizeof sigs[0]))

static struct sigaction old_sa[NSIGS];
static int installed[NSIGS];
static atomic_int armed;
static char seg_path[PATH_MAX];
static pid_t seg_owner;

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    int i = 0;
    while (i < NSIGS && sigs[i] != sig)
        i++;
    if (i == NSIGS)
        return;
    const struct sigaction *o = &old_sa[i];
    if ((o->sa_flags & SA_SIGINFO) && o->sa_sigaction) {
        o->sa_sigaction(sig, si, uc);
        return;
    }
    if (!(o->sa_flags & SA_SIGINFO) && o->sa_handler == SIG_IGN)
        return;
    if (!(o->sa_flags & SA_SIGINFO) && o->sa_handler != SIG_DFL) {
        o->sa_handler(sig);
        return;
    }
    /* The default action: the process dies. unlink(2), sigaction(2) and
     * raise(3) are async-signal-safe. */
    if (atomic_load(&armed) && getpid() == seg_owner)
        unlink(seg_path);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
}

void sh_tm_signals_install(void)
{
    for (int i = 0; i < NSIGS; i++) {
        struct sigaction cur;
        if (installed[i] || sigaction(sigs[i], NULL, &cur) != 0)
            continue;
        if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
            continue; /* keep it ignored, across exec too */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], &sa, &old_sa[i]) == 0)
            installed[i] = 1;
    }
}

void sh_tm_signals_arm(const char *path, int owner)
{
    atomic_store(&armed, 0);
    sh_tm_strcpy(seg_path, sizeof seg_path, path);
    seg_owner = owner;
    atomic_store(&armed, 1);
}

void sh_tm_signals_disarm(void)
{
    atomic_store(&armed, 0);
}

/* node.h — a pinned-host-memory budget that the processes of one user on
 * one machine share ([budget] host_ram_scope = node, or auto in a job of
 * several ranks).
 *
 * The processes meet in a small shared segment, /dev/shm/<name> (default
 * stagehand-node.<uid>): a header with the node budget and a process-shared
 * robust mutex, then a table of slots, one per process, each recording its
 * pid, start time, PID namespace and the bytes it holds. A process reserves
 * bytes before it pins them and releases them after it unpins them; a
 * reservation that would take the slots' sum past the budget is refused.
 * The share of a process that died (killed, crashed) is reclaimed by the
 * next one that looks: its pid is gone, a zombie, or now another process.
 *
 * The segment is untrusted input: another user may have planted a file,
 * link or FIFO under its name. sh_node_open refuses anything but a regular
 * file this user owns, writable by nobody else, of the right size, magic
 * and version, with one line naming the path and what is wrong; the caller
 * then keeps to its per-process budget.
 *
 * Thread safety: every function may be called from any thread; the
 * segment's mutex serialises the processes and their threads. Statistics
 * are read without it (each word atomically).
 */
#ifndef SH_NODE_NODE_H
#define SH_NODE_NODE_H

#include <stddef.h>
#include <stdint.h>

#define SH_NODE_SLOTS    64 /* processes sharing one segment */
#define SH_NODE_NAME_MAX 200

struct sh_node;

struct sh_node_params {
    const char *dir;  /* NULL = "/dev/shm" (tests point it elsewhere) */
    const char *name; /* the segment's file name; NULL, "" or "auto" = stagehand-node.<uid> */
    uint64_t budget;  /* bytes, for the group's first process: later ones join its budget */
    int lock_ms;      /* longest wait for the segment's lock; <= 0 means 2000 */
};

struct sh_node_stats {
    uint64_t budget;  /* the node budget in force */
    uint64_t used;    /* bytes the processes of the group hold, this one included */
    uint64_t share;   /* bytes this process holds */
    uint32_t ranks;   /* slots in use, this one included */
    int slot;         /* this process's slot */
    uint64_t refused; /* reservations this process was refused */
};

/* 0 with buf = "stagehand-node.<uid>" for "auto" (or NULL, ""), else name
 * itself once checked: letters, digits, '.', '_' and '-', at most
 * SH_NODE_NAME_MAX characters, not starting with '.'. SH_EINVAL with a
 * reason in why (static text) otherwise. */
int sh_node_name(const char *name, char *buf, size_t len, const char **why);

/* Creates the segment, or joins the one there, and takes a slot for this
 * process. SH_EINVAL: the segment is refused (planted, corrupt, another
 * version); SH_EBUSY: every slot is held by a live process; SH_ENOMEM,
 * SH_ENOTFOUND: it could not be made. err gets one line naming the path and
 * what is wrong. */
int sh_node_open(const struct sh_node_params *p, struct sh_node **out, char *err, size_t errlen);

/* Gives this process's slot and share back and unmaps the segment. */
void sh_node_close(struct sh_node *n);

/* Takes bytes of the node budget for this process: 0, or SH_ENOMEM when the
 * other processes (after reclaiming the shares of dead ones) leave too
 * little, or SH_EBUSY when the lock could not be had (said once). */
int sh_node_reserve(struct sh_node *n, uint64_t bytes);

/* Gives back bytes this process reserved. */
void sh_node_release(struct sh_node *n, uint64_t bytes);

/* Frees the slots of processes that are gone; how many it freed. */
int sh_node_reclaim(struct sh_node *n);

void sh_node_stats(struct sh_node *n, struct sh_node_stats *st);

/* The segment's path. */
const char *sh_node_path(const struct sh_node *n);

#endif

/* node_int.h — the node-budget segment's layout, shared by the files of
 * node/ and its unit tests, not by the rest of the library.
 *
 * Layout (native byte order: a segment is only read on the machine that
 * wrote it): struct sh_node_hdr at offset 0, hdr_size bytes, then nslots
 * struct sh_node_slot of slot_size bytes each; the file is total_size bytes.
 * A segment is built under a temporary name and linked into place whole,
 * so no process ever sees one half-built.
 *
 * Locking: hdr.lock (process-shared, robust) guards the budget and every
 * slot's pid, start time and namespace, and makes "the slots' sum fits the
 * budget, then add" atomic across processes. A slot's bytes have one writer,
 * the process that holds it (atomic adds and subtracts), and readers load
 * every word atomically, so statistics need no lock. Each change under the
 * lock is one store that matters (a slot's pid last when taking it, first
 * when freeing it; the sum counts only slots with a pid), so a process
 * that dies holding the lock leaves a consistent table and the next one
 * just marks the lock consistent.
 */
#ifndef SH_NODE_NODE_INT_H
#define SH_NODE_NODE_INT_H

#include "node/node.h"

#include <pthread.h>
#include <stdint.h>

#define SH_NODE_MAGIC     "SHNODEB1" /* 8 bytes, no NUL stored */
#define SH_NODE_MAJOR     1
#define SH_NODE_MINOR     0
#define SH_NODE_HDR_SIZE  256
#define SH_NODE_SLOT_SIZE 64
#define SH_NODE_MAX_SLOTS 1024 /* a reader refuses more */
#define SH_NODE_DIR       "/dev/shm"
#define SH_NODE_NAME_AUTO "stagehand-node."
#define SH_NODE_LOCK_MS   2000

struct sh_node_hdr {
    char magic[8];
    uint16_t major, minor;
    uint32_t hdr_size;
    uint64_t total_size;
    uint32_t nslots, slot_size;
    uint32_t mutex_size; /* sizeof(pthread_mutex_t) where it was made */
    int32_t budget_pid;  /* the process that set the budget */
    uint64_t budget;     /* bytes; under lock */
    uint64_t reserved0[2];
    union {
        pthread_mutex_t mu;
        char pad[128];
    } lock; /* at offset 64 */
    uint64_t reserved1[8];
};

struct sh_node_slot {
    int32_t pid; /* 0: free */
    uint32_t flags;
    uint64_t start_ticks; /* /proc/<pid>/stat field 22: tells a reused pid */
    uint64_t pidns;       /* inode of /proc/<pid>/ns/pid; 0 unknown */
    uint64_t bytes;       /* pinned bytes the process holds */
    uint64_t reserved[4];
};

_Static_assert(sizeof(struct sh_node_hdr) == SH_NODE_HDR_SIZE, "header is 256 bytes");
_Static_assert(sizeof(struct sh_node_slot) == SH_NODE_SLOT_SIZE, "a slot is 64 bytes");
_Static_assert(sizeof(pthread_mutex_t) <= 128, "room for the mutex");

struct sh_node {
    int fd;
    struct sh_node_hdr *hdr;
    struct sh_node_slot *slots;
    size_t map_size;
    uint32_t nslots;
    int slot;       /* ours */
    int pid;        /* the process that took it (a fork child does not own it) */
    uint64_t pidns; /* our PID namespace */
    int lock_ms;
    int lock_said; /* the lock trouble was reported */
    uint64_t refused;
    char path[4096];
};

/* segment.c: opens or creates dir/name, checked, mapped; *n filled but for
 * the slot. SH_EINVAL (refused), SH_ENOTFOUND/SH_ENOMEM (cannot be made);
 * err says which. */
int sh_node_seg_open(struct sh_node *n, const char *dir, const char *name, uint64_t budget,
                     char *err, size_t errlen);
void sh_node_seg_close(struct sh_node *n);
/* The inode of /proc/<pid>/ns/pid (pid 0: ourselves); 0 if unknown. */
uint64_t sh_node_pidns(int pid);

#endif

/* segment.c — finding, checking, creating and mapping the node-budget
 * segment.
 *
 * The segment may have been planted by someone else: it is opened with
 * O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC through telemetry's sh_tm_open_own
 * (the checks every file the library writes gets), must not be writable by
 * group or others, and its header is read with pread and checked field by
 * field against the file before anything is mapped. A new segment is built
 * under a temporary name and linked into place, so a reader never sees a
 * half-built one, and of two processes creating it at once one wins and the
 * other joins.
 *
 * No state of its own: everything is in the caller's struct sh_node.
 */
#include "node/node_int.h"

#include "sh_err.h"
#include "telemetry/telemetry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int sh_node_name(const char *name, char *buf, size_t len, const char **why)
{
    if (!name || !name[0] || strcmp(name, "auto") == 0) {
        int w = snprintf(buf, len, "%s%u", SH_NODE_NAME_AUTO, (unsigned)geteuid());
        return w < 0 || (size_t)w >= len ? (*why = "too long", SH_EINVAL) : SH_OK;
    }
    size_t n = strlen(name);
    *why = n > SH_NODE_NAME_MAX ? "too long (at most 200 characters)"
           : name[0] == '.'     ? "must not start with '.'"
                                : NULL;
    for (size_t i = 0; !*why && i < n; i++)
        if (!name_char(name[i]))
            *why = "may hold only letters, digits, '.', '_' and '-'";
    if (!*why && n >= len)
        *why = "too long";
    if (*why)
        return SH_EINVAL;
    memcpy(buf, name, n + 1);
    return SH_OK;
}

uint64_t sh_node_pidns(int pid)
{
    char p[64];
    struct stat st;
    if (pid)
        snprintf(p, sizeof p, "/proc/%d/ns/pid", pid);
    else
        snprintf(p, sizeof p, "/proc/self/ns/pid");
    return stat(p, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static uint64_t seg_size(uint32_t nslots)
{
    return SH_NODE_HDR_SIZE + (uint64_t)nslots * SH_NODE_SLOT_SIZE;
}

/* Checks a header copy against the file; 0, or SH_EINVAL with err. */
static int check_header(const struct sh_node_hdr *h, uint64_t fsize, const char *path, char *err,
                        size_t errlen)
{
    if (memcmp(h->magic, SH_NODE_MAGIC, 8) != 0)
        return sh_err_say(SH_EINVAL, err, errlen,
                          "%s: not a stagehand node-budget segment (bad magic)", path);
    if (h->major != SH_NODE_MAJOR)
        return sh_err_say(SH_EINVAL, err, errlen,
                          "%s: segment version %u.%u; this library uses %d.x", path, h->major,
                          h->minor, SH_NODE_MAJOR);
    if (h->hdr_size != SH_NODE_HDR_SIZE || h->slot_size != SH_NODE_SLOT_SIZE ||
        h->mutex_size != sizeof(pthread_mutex_t))
        return sh_err_say(
            SH_EINVAL, err, errlen,
            "%s: corrupt, or made by a build with another layout (header %u, slot %u, "
            "mutex %u bytes)",
            path, h->hdr_size, h->slot_size, h->mutex_size);
    if (h->nslots == 0 || h->nslots > SH_NODE_MAX_SLOTS || h->total_size != seg_size(h->nslots) ||
        h->total_size != fsize)
        return sh_err_say(
            SH_EINVAL, err, errlen,
            "%s: truncated or corrupt: %u slots, header says %llu bytes, file has %llu", path,
            h->nslots, (unsigned long long)h->total_size, (unsigned long long)fsize);
    if (h->budget == 0)
        return sh_err_say(SH_EINVAL, err, errlen, "%s: corrupt: a node budget of 0", path);
    return SH_OK;
}

/* Opens an existing segment and checks who controls it: the fd, or -1 with
 * err, *absent set when there is none. */
static int open_existing(const char *path, uint64_t *fsize, int *absent, char *err, size_t errlen)
{
    struct stat st;
    const char *why = NULL;
    int fd = sh_tm_open_own(path, O_RDWR, 0, &st, &why);
    *absent = fd < 0 && errno == ENOENT;
    if (fd < 0 && strcmp(why, "owned by another user") == 0)
        return sh_err_say(-1, err, errlen, "%s: owned by uid %u, not this user (uid %u)", path,
                          (unsigned)st.st_uid, (unsigned)geteuid());
    if (fd < 0)
        return sh_err_say(-1, err, errlen, "%s: %s", path, why);
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        close(fd);
        return sh_err_say(-1, err, errlen, "%s: writable by group or others (mode %04o)", path,
                          (unsigned)(st.st_mode & 07777));
    }
    *fsize = (uint64_t)st.st_size;
    return fd;
}

static int map_checked(struct sh_node *n, int fd, uint64_t fsize, char *err, size_t errlen)
{
    struct sh_node_hdr h;
    if (fsize < sizeof h || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        return sh_err_say(SH_EINVAL, err, errlen, "%s: truncated: %llu bytes, a header alone is %d",
                          n->path, (unsigned long long)fsize, SH_NODE_HDR_SIZE);
    int rc = check_header(&h, fsize, n->path, err, errlen);
    if (rc)
        return rc;
    void *m = mmap(NULL, (size_t)fsize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return sh_err_say(SH_ENOMEM, err, errlen, "%s: cannot map: %s", n->path, strerror(errno));
    n->fd = fd;
    n->hdr = m;
    n->slots = (struct sh_node_slot *)((char *)m + SH_NODE_HDR_SIZE);
    n->map_size = (size_t)fsize;
    n->nslots = h.nslots;
    return SH_OK;
}

static int init_mutex(pthread_mutex_t *mu)
{
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (rc == 0 && (rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED)) == 0 &&
        (rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST)) == 0)
        rc = pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
    return rc;
}

/* Fills a new segment; the magic goes in last. */
static int build(int fd, uint64_t budget)
{
    uint64_t size = seg_size(SH_NODE_SLOTS);
    if (ftruncate(fd, (off_t)size) != 0)
        return -1;
    struct sh_node_hdr *h = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return -1;
    *h = (struct sh_node_hdr){.major = SH_NODE_MAJOR,
                              .minor = SH_NODE_MINOR,
                              .hdr_size = SH_NODE_HDR_SIZE,
                              .total_size = size,
                              .nslots = SH_NODE_SLOTS,
                              .slot_size = SH_NODE_SLOT_SIZE,
                              .mutex_size = sizeof(pthread_mutex_t),
                              .budget_pid = getpid(),
                              .budget = budget};
    int rc = init_mutex(&h->lock.mu);
    if (rc == 0)
        memcpy(h->magic, SH_NODE_MAGIC, 8);
    munmap(h, (size_t)size);
    errno = rc ? rc : errno;
    return rc ? -1 : 0;
}

/* Builds a segment under a temporary name and links it in as path: 0, 1 if
 * another process linked one first, -1 with err. */
static int create(const char *dir, const char *name, const char *path, uint64_t budget, char *err,
                  size_t errlen)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/.%s.%d.tmp", dir, name, (int)getpid());
    unlink(tmp); /* one of ours left by a process of this pid that died building it */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return sh_err_say(-1, err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    int rc = build(fd, budget) == 0 ? 0 : -1;
    if (rc)
        sh_err_say(-1, err, errlen, "cannot build %s: %s", tmp, strerror(errno));
    else if (link(tmp, path) != 0) {
        rc = errno == EEXIST ? 1 : -1;
        if (rc < 0)
            sh_err_say(-1, err, errlen, "cannot create %s: %s", path, strerror(errno));
    }
    unlink(tmp);
    close(fd);
    return rc;
}

int sh_node_seg_open(struct sh_node *n, const char *dir, const char *name, uint64_t budget,
                     char *err, size_t errlen)
{
    dir = dir ? dir : SH_NODE_DIR;
    int w = snprintf(n->path, sizeof n->path, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= sizeof n->path)
        return sh_err_say(SH_EINVAL, err, errlen, "%s/%s: path too long", dir, name);
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t fsize = 0;
        int absent = 0;
        int fd = open_existing(n->path, &fsize, &absent, err, errlen);
        if (fd >= 0) {
            int rc = map_checked(n, fd, fsize, err, errlen);
            if (rc)
                close(fd);
            return rc;
        }
        if (!absent)
            return SH_EINVAL;
        int c = create(dir, name, n->path, budget, err, errlen);
        if (c < 0)
            return SH_ENOTFOUND;
        /* Made (c == 0) or lost the race (c == 1): open what is there now. */
    }
    return sh_err_say(SH_ENOTFOUND, err, errlen, "%s: appears and disappears; not using it",
                      n->path);
}

void sh_node_seg_close(struct sh_node *n)
{
    if (n->hdr)
        munmap(n->hdr, n->map_size);
    if (n->fd >= 0)
        close(n->fd);
    n->hdr = NULL;
    n->fd = -1;
}

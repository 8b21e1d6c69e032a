/* peermap.h — several devices in one process (peermap.c): what they ask of
 * the library's mappings and drains. Below driver.c, which calls it from
 * its mapping and drain operations.
 */
#ifndef SH_INTERPOSE_PEERMAP_H
#define SH_INTERPOSE_PEERMAP_H

#include "interpose/entries.h"

#include <stddef.h>
#include <stdint.h>

/* sh_peers_manage: a device the library manages, with its context (NULL
 * if it has none yet), and whether the process sees more
 * than one (several = 0: nothing below is used); with two or more managed,
 * every drain waits for each one's context. sh_peers_link: context ctx, on
 * device from, enabled (on = 1) or disabled peer access to device to;
 * while any link lets `from` reach a managed device, every listed mapping
 * on it gives `from` read and write access, and ctx is waited for by every
 * drain from then on. sh_peers_mapped: a mapping was just made on device
 * dev at [va, va + size): lists it and sets its access (dev, and every
 * device with a link to dev); on failure it is not listed.
 * sh_peers_reach: the devices (bit d: device d) that links let `from`
 * reach now (one atomic load: every launch with several devices asks).
 * sh_peers_listed: lists (1) or forgets (0) a mapping on dev without
 * touching its access. sh_peers_note: work on a stream
 * of ctx used regions: drains wait for ctx from now on. sh_peers_own: the
 * program created ctx on device dev: on the managed device (or before it
 * is known), drains wait for it from now on, with one device as with
 * several. sh_peers_destroying(1) ... (0): the program destroys a context
 * meanwhile, and no drain waits for the noted ones; sh_peers_forget, in
 * between: ctx is destroyed, drains no longer wait for it (and
 * sh_peers_generation changes). sh_peers_waiting: whether any context but
 * the managed one is noted (one relaxed load). sh_peers_sync_except: waits
 * for every noted context but `done` (their errors ignored); nothing to do
 * when none is noted. sh_peers_sync: the same but drv->ctx. */
void sh_peers_manage(CUdevice dev, CUcontext ctx, int several);
void sh_peers_link(const struct sh_driver *drv, CUcontext ctx, int from, int to, int on);
CUresult sh_peers_mapped(const struct sh_driver *drv, CUdevice dev, uintptr_t va, size_t size);
void sh_peers_listed(CUdevice dev, uintptr_t va, size_t size, int listed);
size_t sh_peers_mappings(void);
void sh_peers_note(CUcontext ctx);
void sh_peers_own(CUcontext ctx, int dev);
void sh_peers_destroying(int on);
void sh_peers_forget(CUcontext ctx);
unsigned sh_peers_generation(void);
uint64_t sh_peers_reach(int from);
int sh_peers_waiting(void);
void sh_peers_sync(const struct sh_driver *drv);
void sh_peers_sync_except(const struct sh_driver *drv, CUcontext done);

#endif

/* gates.c — which devices' remap gates a piece of work takes.
 *
 * Each managed device has its own gate (transfer.h): a window on its
 * regions waits for the work inside its gate and holds back new work
 * there, and nothing else. Work takes the gate of every device whose
 * regions it may reach, in device order, and marks regions only on those
 * devices (launch.c):
 *  - with one device managed, every launch takes its gate, as always;
 *  - a kernel reaches its own device's memory and that of the devices its
 *    device's peer links open: the library gives a peer access to its
 *    mappings only for a link (peermap.c), so however opaque its pointers,
 *    a kernel reaches no other device's regions;
 *  - a copy or memset reaches the ranges it names, whatever the stream;
 *    one whose reach the wrapper cannot bound reaches every device;
 *  - a graph's nodes may run on any device, and a capture's start and end
 *    must not meet any window: every device;
 *  - work on a stream whose device the driver cannot name: every device.
 *
 * Shared state: none; the thread's context cache is thread-local.
 */
#include "interpose/interpose.h"
#include "interpose/peermap.h"

static int ndevs(void)
{
    return atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
}

/* The CUdevice of s's context, -1 when the driver cannot say. A managed
 * device's primary context (the library holds it) is known; of the others,
 * one is remembered per thread until a context is destroyed (its address
 * may come back as another device's). */
static int stream_cudevice(CUstream s, int n)
{
    static _Thread_local struct {
        CUcontext ctx;
        int dev;
        unsigned gen;
    } last;
    CUcontext c = NULL;
    if (sh_rt.drv.cuStreamGetCtx(s, &c) != CUDA_SUCCESS || !c)
        return -1;
    for (int i = 0; i < n; i++)
        if (sh_rt.devs[i]->ctx == c)
            return (int)sh_rt.devs[i]->dev;
    unsigned gen = sh_peers_generation();
    if (c == last.ctx && gen == last.gen)
        return last.dev;
    int dev = sh_driver_ctx_device(&sh_rt.drv, c);
    if (dev >= 0) {
        last.ctx = c;
        last.dev = dev;
        last.gen = gen;
    }
    return dev;
}

uint32_t sh_gates_kernel(CUstream s)
{
    int n = ndevs();
    if (n == 1)
        return 1;
    int dev = stream_cudevice(s, n);
    if (dev < 0 || dev >= 64)
        return SH_GATES_ALL;
    uint64_t reach = sh_peers_reach(dev) | 1ull << dev;
    uint32_t mask = 0;
    for (int i = 0; i < n; i++) {
        int d = (int)sh_rt.devs[i]->dev;
        mask |= d >= 0 && d < 64 && (reach >> d & 1) ? 1u << i : 0;
    }
    return mask;
}

uint32_t sh_gates_ranges(const uintptr_t *ends, size_t n)
{
    uint32_t mask = 0;
    int nd = ndevs();
    for (int i = 0; i < nd; i++) {
        uintptr_t lo, hi;
        sh_pool_bounds(sh_rt.devs[i]->pool, &lo, &hi);
        /* Pools' reservations may interleave: the bounds can only say too
         * much, which costs a wait at worst. */
        for (size_t k = 0; k + 1 < n && !(mask >> i & 1); k += 2)
            mask |= ends[k] < hi && ends[k + 1] > lo ? 1u << i : 0;
    }
    return mask;
}

/* The devices whose gates the thread holds, from the gates themselves. */
static uint32_t held_now(void)
{
    uint32_t mask = 0;
    int n = ndevs();
    for (int i = 0; i < n; i++)
        mask |= sh_gate_held(sh_rt.devs[i]->gate) ? 1u << i : 0;
    return mask;
}

uint32_t sh_gates_enter_set(uint32_t devs)
{
    if (sh_gate_held_any()) { /* nested: the outermost call's gates hold */
        sh_gate_enter_set(NULL, 0);
        return held_now();
    }
    _Static_assert(SH_DEVICES_MAX <= SH_GATE_SET_MAX, "a set holds every device's gate");
    struct sh_gate *set[SH_DEVICES_MAX];
    unsigned k = 0;
    uint32_t taken = 0;
    int n = ndevs();
    for (int i = 0; i < n; i++)
        if (devs >> i & 1) {
            set[k++] = sh_rt.devs[i]->gate;
            taken |= 1u << i;
        }
    sh_gate_enter_set(set, k);
    return taken; /* a device published meanwhile is not held */
}

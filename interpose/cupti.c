/* cupti.c — launch tracking through CUPTI callbacks, and handing CUPTI to
 * another subscriber and back.
 *
 * CUPTI takes one subscriber at a time. The library subscribes at start
 * (unless [tracking] mode = hooks) and sees launches through its callbacks;
 * the wrappers then leave launches to CUPTI ("pass") while nothing is off
 * the device, and track them themselves otherwise (intercept.c: a launch
 * whose own restore fails for good is refused there). When another party
 * subscribes (a profiler, such as torch.profiler's Kineto), the exported
 * cuptiSubscribe gives CUPTI up first: hooks on, passes in flight drained,
 * then our unsubscribe, then theirs goes through. When that party
 * unsubscribes, the library subscribes again, and only then turns the
 * hooks off; cuptiFinalize, which ends every subscription, is bracketed
 * the same way. So every launch is seen by at least one mechanism at every
 * moment; when both see one, the callback finds the wrapper's launch open
 * (sh_launch_busy) and stays out of it.
 *
 * Locking: switch_mu serialises every change of subscription (ours, and
 * the other party's through our exports) and guards the state below it
 * but for the atomics. hooks_on and in_pass are read on the launch path
 * without it: a wrapper counts itself into in_pass, then reads hooks_on; a
 * switch sets hooks_on, then waits for in_pass to drain (both sequentially
 * consistent, so one of them sees the other). The callback's open/nest
 * counters are per thread.
 */
#include "interpose/dl.h"
#include "interpose/interpose.h"

#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef __typeof__(cuptiSubscribe) subscribe_fn;
typedef __typeof__(cuptiSubscribe_v2) subscribe_v2_fn;
typedef __typeof__(cuptiUnsubscribe) unsubscribe_fn;
typedef __typeof__(cuptiEnableCallback) enable_fn;
typedef __typeof__(cuptiEnableDomain) enable_domain_fn;
typedef __typeof__(cuptiFinalize) finalize_fn;

/* One CUPTI library's entry points. */
struct cupti_lib {
    void *handle; /* ours only: what dlopen gave */
    const char *path;
    subscribe_fn *subscribe;
    subscribe_v2_fn *subscribe_v2; /* NULL in a CUPTI without it */
    unsubscribe_fn *unsubscribe;
    enable_fn *enable;
    enable_domain_fn *enable_domain;
    finalize_fn *finalize;
};

static pthread_mutex_t switch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cupti_lib ours;    /* the CUPTI the library loaded */
static struct cupti_lib program; /* the program's, while the library has none */
static CUpti_SubscriberHandle our_sub, their_sub;
static const struct cupti_lib *their_lib; /* where their subscription lives */
static int subscribed;                    /* the library holds CUPTI */
static int lent;                          /* another party subscribed through our export */
static int wanted;                        /* the library tracks through CUPTI when it can */

static atomic_int mode = SH_TRACK_NONE;
static atomic_int hooks_on = 1; /* the wrappers track launches themselves */
static atomic_uint in_pass;     /* wrappers leaving a launch to CUPTI now */
static atomic_ullong handovers, returns;
static atomic_int back_pending; /* CUPTI came free inside a launch: take it at the next */
static const char *pending_why; /* ... and why, for the log line */

#define UNSUBSCRIBED "the other subscriber having unsubscribed"

/* The callback that opened the thread's launch (its EXIT closes it), and
 * the callbacks nested in that launch since (a runtime launch raises the
 * driver launch it makes). */
static _Thread_local struct {
    int open, nest;
} cb_state;

/* ---- the launch path ---- */

int sh_cupti_mode(void)
{
    return atomic_load_explicit(&mode, memory_order_relaxed);
}

static void catch_up(void);

int sh_cupti_pass_begin(void)
{
    if (atomic_load_explicit(&hooks_on, memory_order_relaxed)) {
        if (atomic_load_explicit(&back_pending, memory_order_relaxed))
            catch_up();
        return 0;
    }
    atomic_fetch_add(&in_pass, 1);
    if (!atomic_load(&hooks_on))
        return 1;
    atomic_fetch_sub(&in_pass, 1);
    return 0;
}

void sh_cupti_poll(void)
{
    if (atomic_load_explicit(&hooks_on, memory_order_relaxed) &&
        atomic_load_explicit(&back_pending, memory_order_relaxed))
        catch_up();
}

void sh_cupti_pass_end(void)
{
    if (cb_state.open) { /* CUPTI went away between ENTER and EXIT: close the launch */
        cb_state.open = cb_state.nest = 0;
        sh_launch_end();
    }
    atomic_fetch_sub(&in_pass, 1);
}

void sh_cupti_counts(uint64_t *h, uint64_t *r)
{
    *h = atomic_load(&handovers);
    *r = atomic_load(&returns);
}

/* ---- the callbacks ---- */

/* The per-thread-default variants (_ptsz) mean the calling thread's own
 * stream by stream 0. (The two domains' ids overlap: check the domain.) */
static int is_ptsz(CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
        return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 ||
               cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000 ||
               cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060 ||
               cbid == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000 ||
               cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000;
    return cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz;
}

static CUstream per_thread_default(int ptsz, CUstream s)
{
    return ptsz ? sh_stream_ptsz(s) : s;
}

/* What a launch callback names. graph: a graph launch (key is the exec). */
struct launch_call {
    const void *key;
    int kind, graph;
    void **args;
    CUstream stream;
};

static void runtime_call(CUpti_CallbackId cbid, const void *p, struct launch_call *c)
{
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
        c->key = ((const cudaLaunchKernel_v7000_params *)p)->func;
        c->args = ((const cudaLaunchKernel_v7000_params *)p)->args;
        c->stream = (CUstream)((const cudaLaunchKernel_v7000_params *)p)->stream;
        c->kind = SH_KEY_HOST_FN;
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
        c->key = ((const cudaLaunchCooperativeKernel_v9000_params *)p)->func;
        c->args = ((const cudaLaunchCooperativeKernel_v9000_params *)p)->args;
        c->stream = (CUstream)((const cudaLaunchCooperativeKernel_v9000_params *)p)->stream;
        c->kind = SH_KEY_HOST_FN;
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
        c->key = ((const cudaLaunchKernelExC_v11060_params *)p)->func;
        c->args = ((const cudaLaunchKernelExC_v11060_params *)p)->args;
        c->stream = (CUstream)((const cudaLaunchKernelExC_v11060_params *)p)->config->stream;
        c->kind = SH_KEY_HOST_FN;
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000:
        c->key = ((const cudaGraphLaunch_v10000_params *)p)->graphExec;
        c->stream = (CUstream)((const cudaGraphLaunch_v10000_params *)p)->stream;
        c->graph = 1;
        break;
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000:
        /* Same layout as cudaLaunchKernel's, with a kernel handle first. */
        c->key = ((const cudaLaunchKernel_v7000_params *)p)->func;
        c->args = ((const cudaLaunchKernel_v7000_params *)p)->args;
        c->stream = (CUstream)((const cudaLaunchKernel_v7000_params *)p)->stream;
        c->kind = SH_KEY_KERNEL;
        break;
    default:
        break;
    }
}

static void driver_call(CUpti_CallbackId cbid, const void *p, struct launch_call *c)
{
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        c->key = ((const cuLaunchKernel_params *)p)->f;
        c->args = ((const cuLaunchKernel_params *)p)->kernelParams;
        c->stream = ((const cuLaunchKernel_params *)p)->hStream;
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
        c->key = ((const cuLaunchKernelEx_params *)p)->f;
        c->args = ((const cuLaunchKernelEx_params *)p)->kernelParams;
        c->stream = ((const cuLaunchKernelEx_params *)p)->config->hStream;
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
        c->key = ((const cuLaunchCooperativeKernel_params *)p)->f;
        c->args = ((const cuLaunchCooperativeKernel_params *)p)->kernelParams;
        c->stream = ((const cuLaunchCooperativeKernel_params *)p)->hStream;
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz:
        c->key = ((const cuGraphLaunch_params *)p)->hGraph;
        c->stream = ((const cuGraphLaunch_params *)p)->hStream;
        c->graph = 1;
        break;
    default:
        break;
    }
}

/* The first ENTER on a thread with no launch open opens one; its EXIT
 * closes it. A launch a wrapper tracks (hooks on) is left to the wrapper,
 * and so is an EXIT whose ENTER came before we subscribed. */
/* An ENTER with no launch open on the thread: opens one, unless it is the
 * library's own kernel (in a remap window) or a wrapper's launch. */
static __attribute__((noinline)) void open_launch(CUpti_CallbackDomain domain,
                                                  CUpti_CallbackId cbid, const void *params)
{
    if (sh_fingerprint_own() || sh_launch_busy())
        return;
    struct launch_call c = {.kind = SH_KEY_FUNCTION};
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
        runtime_call(cbid, params, &c);
    else
        driver_call(cbid, params, &c);
    CUstream stream = per_thread_default(is_ptsz(domain, cbid), c.stream);
    cb_state.open = 1;
    cb_state.nest = 0;
    if (c.graph)
        sh_graph_launch_begin((CUgraphExec)(uintptr_t)c.key, stream);
    else
        sh_launch_begin(c.key, c.kind, c.args, stream);
}

/* Four callbacks a launch (the runtime's and the driver's, each ENTER and
 * EXIT): all but the one that opens it only count. */
static void CUPTIAPI on_callback(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *data)
{
    (void)user;
    const CUpti_CallbackData *d = data;
    __typeof__(cb_state) *s = &cb_state; /* one thread-local lookup per callback */
    if (d->callbackSite == CUPTI_API_EXIT) {
        if (s->open && s->nest > 0) {
            s->nest--;
        } else if (s->open) {
            s->open = 0;
            sh_launch_end();
        }
    } else if (s->open) { /* what the launch makes (the library's own kernels too) */
        s->nest++;
    } else {
        open_launch(domain, cbid, d->functionParams);
    }
}

static const CUpti_CallbackId runtime_ids[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
};
static const CUpti_CallbackId driver_ids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

/* ---- our subscription (switch_mu held) ---- */

static void resolve(struct cupti_lib *c, void *h)
{
    c->subscribe = (subscribe_fn *)sh_dl_lookup(h, "cuptiSubscribe");
    c->subscribe_v2 = (subscribe_v2_fn *)sh_dl_lookup(h, "cuptiSubscribe_v2");
    c->unsubscribe = (unsubscribe_fn *)sh_dl_lookup(h, "cuptiUnsubscribe");
    c->enable = (enable_fn *)sh_dl_lookup(h, "cuptiEnableCallback");
    c->enable_domain = (enable_domain_fn *)sh_dl_lookup(h, "cuptiEnableDomain");
    c->finalize = (finalize_fn *)sh_dl_lookup(h, "cuptiFinalize");
}

static int complete(const struct cupti_lib *c)
{
    return c->subscribe && c->unsubscribe && c->enable;
}

/* Named, where CUPTI takes a name, so that a tool refused by CUPTI (one
 * that reaches it past our exports) is told who holds it. */
static CUptiResult subscribe_ours(void)
{
    CUpti_SubscriberHandle s;
    CUpti_SubscriberParams named = {.structSize = CUpti_SubscriberParams_STRUCT_SIZE,
                                    .subscriberName = "stagehand"};
    CUptiResult r = ours.subscribe_v2
                        ? ours.subscribe_v2(&s, (CUpti_CallbackFunc)on_callback, NULL, &named)
                        : ours.subscribe(&s, (CUpti_CallbackFunc)on_callback, NULL);
    if (r != CUPTI_SUCCESS)
        return r;
    for (size_t i = 0; i < sizeof runtime_ids / sizeof *runtime_ids; i++)
        ours.enable(1, s, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_ids[i]);
    for (size_t i = 0; i < sizeof driver_ids / sizeof *driver_ids; i++)
        ours.enable(1, s, CUPTI_CB_DOMAIN_DRIVER_API, driver_ids[i]);
    our_sub = s;
    subscribed = 1;
    return CUPTI_SUCCESS;
}

static const char *subscribe_failure(CUptiResult r)
{
    return r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
               ? "another CUPTI subscriber (a profiler?) is active"
               : "cuptiSubscribe failed (a CUPTI for another CUDA version?)";
}

/* Loads the CUPTI at path as ours and, unless another party holds CUPTI
 * through our export, subscribes. NULL on success, else why not. */
static const char *start_at(const char *path)
{
    static char why[SH_CONFIG_STR_MAX + 256]; /* start-up runs once */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "[tracking] cupti_path %s could not be loaded: %s", path,
                 e ? e : "unknown reason");
        return why;
    }
    struct cupti_lib c = {.handle = lib, .path = path};
    resolve(&c, lib);
    if (!complete(&c)) {
        dlclose(lib);
        snprintf(why, sizeof why, "%s: no cuptiSubscribe in it", path);
        return why;
    }
    ours = c;
    CUptiResult r = lent ? CUPTI_SUCCESS : subscribe_ours();
    if (r != CUPTI_SUCCESS) {
        memset(&ours, 0, sizeof ours);
        dlclose(lib);
        snprintf(why, sizeof why, "%s: %s", path, subscribe_failure(r));
        return why;
    }
    return NULL;
}

/* cupti_path, or with "auto" the CUPTI of the CUDA runtime the program has
 * loaded (12, else 13), then the other. NULL on success, else why the first
 * one tried did not. */
static const char *start(const char *path)
{
    if (strcmp(path, "auto") != 0)
        return start_at(path);
    void *rt12 = dlopen("libcudart.so.12", RTLD_LAZY | RTLD_NOLOAD);
    if (rt12)
        dlclose(rt12);
    const char *first = rt12 ? "libcupti.so.12" : "libcupti.so.13";
    const char *why = start_at(first);
    if (!why)
        return NULL;
    static char kept[SH_CONFIG_STR_MAX + 256]; /* the first reason: the one that matters */
    snprintf(kept, sizeof kept, "%s", why);
    return start_at(rt12 ? "libcupti.so.13" : "libcupti.so.12") ? kept : NULL;
}

static void set_mode(int m)
{
    atomic_store(&mode, m);
    sh_tm_set(SH_TM_G_tracking, m);
}

/* 1 while the calling thread issues device work (a profiler's call from
 * inside its own callback). */
static int inside_work(void)
{
    return sh_launch_busy() || sh_gate_held_any();
}

/* The hooks take over, then no launch left to CUPTI is still being issued
 * (each is seen by our callbacks). A caller inside a launch cannot wait:
 * one left to CUPTI may need its side of the remap gate to be issued. */
static void hooks_up(void)
{
    atomic_store(&hooks_on, 1);
    if (inside_work())
        return;
    while (atomic_load(&in_pass))
        sched_yield();
}

/* Our subscription is gone (switch_mu held); why and until: the log line. */
static void gave_up(const char *why, const char *until)
{
    subscribed = 0;
    set_mode(SH_TRACK_HOOKS);
    atomic_fetch_add(&handovers, 1);
    sh_tm_inc(SH_TM_C_cupti_handovers);
    sh_monitor_event(SH_TM_EV_TRACKING, SH_TM_TRACK_HOOKS, 0);
    sh_log(SH_LOG_INFO, "launch tracking: CUPTI %s; runtime and driver hooks until %s", why, until);
}

/* Gives CUPTI up: the hooks take over before the subscription goes. -1,
 * and CUPTI kept, if CUPTI would not let it go. */
static int hand_over(void)
{
    hooks_up();
    if (ours.unsubscribe(our_sub) != CUPTI_SUCCESS) {
        atomic_store(&hooks_on, 0); /* still subscribed: the callbacks see every launch */
        return -1;
    }
    gave_up("given to another subscriber (a profiler?)", "it unsubscribes");
    return 0;
}

/* Takes CUPTI back (why: for the log line): the hooks go off only once
 * our callbacks are on. */
static void take_back(const char *why)
{
    CUptiResult r = subscribe_ours();
    if (r != CUPTI_SUCCESS) {
        sh_log(SH_LOG_WARN,
               "launch tracking: CUPTI could not be taken back (%s); staying with "
               "runtime and driver hooks",
               subscribe_failure(r));
        return;
    }
    atomic_store(&hooks_on, 0);
    atomic_store(&back_pending, 0); /* whatever asked for this is done */
    set_mode(SH_TRACK_CUPTI);
    atomic_fetch_add(&returns, 1);
    sh_tm_inc(SH_TM_C_cupti_returns);
    sh_monitor_event(SH_TM_EV_TRACKING, SH_TM_TRACK_CUPTI, 0);
    sh_log(SH_LOG_INFO, "launch tracking: CUPTI callbacks again (%s), %s", ours.path, why);
}

/* CUPTI is free again and ours to take (switch_mu held): now, or, when
 * the call came from inside a launch (a profiler unsubscribing in its own
 * callback, as Kineto's teardown does, then finalizing CUPTI), from the
 * next launch that starts outside any other. */
static void free_again(const char *why)
{
    if (!wanted || subscribed || lent)
        return;
    if (!inside_work()) {
        take_back(why);
        return;
    }
    pending_why = why;
    atomic_store(&back_pending, 1);
}

int sh_cupti_init(void)
{
    const char *why = "configured";
    pthread_mutex_lock(&switch_mu);
    if (sh_rt.cfg.tracking.mode != SH_CONFIG_TRACK_HOOKS) {
        why = start(sh_rt.cfg.tracking.cupti_path);
        wanted = ours.handle != NULL;
        if (!why && subscribed) {
            atomic_store(&hooks_on, 0);
            set_mode(SH_TRACK_CUPTI);
            pthread_mutex_unlock(&switch_mu);
            sh_log(SH_LOG_INFO, "launch tracking: CUPTI callbacks (%s)", ours.path);
            return 0;
        }
        if (!why) /* loaded, not subscribed: lent */
            why = "another CUPTI subscriber (a profiler?) is active; CUPTI is taken back when "
                  "it unsubscribes";
        else if (sh_rt.cfg.tracking.mode == SH_CONFIG_TRACK_CUPTI)
            sh_log(SH_LOG_WARN, "tracking mode cupti requested, but %s", why);
    }
    set_mode(SH_TRACK_HOOKS);
    pthread_mutex_unlock(&switch_mu);
    sh_log(SH_LOG_INFO, "launch tracking: runtime and driver hooks (%s)", why);
    return 0;
}

/* ---- the exports: another party's subscription ---- */

/* The CUPTI another party's call goes to: the one the library loaded, else
 * the program's (the next in the global scope, else one loaded locally,
 * CUDA 12's first when the program runs CUDA 12's runtime). switch_mu held. */
static const struct cupti_lib *target(void)
{
    if (ours.handle)
        return &ours;
    if (complete(&program))
        return &program;
    resolve(&program, RTLD_NEXT);
    void *rt12 = dlopen("libcudart.so.12", RTLD_LAZY | RTLD_NOLOAD);
    if (rt12)
        dlclose(rt12);
    const char *names[] = {rt12 ? "libcupti.so.12" : "libcupti.so.13",
                           rt12 ? "libcupti.so.13" : "libcupti.so.12", "libcupti.so"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !complete(&program); i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            resolve(&program, h);
            dlclose(h); /* only our reference: the program holds it open */
        }
    }
    return complete(&program) ? &program : NULL;
}

/* 1 when s is the library's own live subscription: a stale handle of the
 * other party's that CUPTI reuses for ours must not reach it. */
static int is_ours(CUpti_SubscriberHandle s)
{
    return subscribed && s == our_sub;
}

static CUptiResult subscribe_other(CUpti_SubscriberHandle *sub, CUpti_CallbackFunc cb, void *user,
                                   CUpti_SubscriberParams *params, int v2)
{
    pthread_mutex_lock(&switch_mu);
    const struct cupti_lib *c = target();
    CUptiResult r = CUPTI_ERROR_NOT_INITIALIZED;
    if (c) {
        int handed = subscribed && sub && !lent && hand_over() == 0;
        r = v2 && c->subscribe_v2 ? c->subscribe_v2(sub, cb, user, params)
                                  : c->subscribe(sub, cb, user);
        if (r == CUPTI_SUCCESS) {
            their_sub = *sub;
            their_lib = c;
            lent = 1;
        } else if (handed) {
            take_back("the other subscriber's cuptiSubscribe having failed");
        }
    }
    pthread_mutex_unlock(&switch_mu);
    return r;
}

EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                  void *userdata)
{
    return subscribe_other(subscriber, callback, userdata, NULL, 0);
}

EXPORT CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber,
                                     CUpti_CallbackFunc callback, void *userdata,
                                     CUpti_SubscriberParams *params)
{
    return subscribe_other(subscriber, callback, userdata, params, 1);
}

EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
    pthread_mutex_lock(&switch_mu);
    int theirs = lent && subscriber == their_sub;
    const struct cupti_lib *c = theirs ? their_lib : target();
    CUptiResult r = !c                    ? CUPTI_ERROR_NOT_INITIALIZED
                    : is_ours(subscriber) ? CUPTI_ERROR_INVALID_PARAMETER
                                          : c->unsubscribe(subscriber);
    if (r == CUPTI_SUCCESS && theirs) {
        lent = 0;
        their_sub = NULL;
        free_again(UNSUBSCRIBED);
    }
    pthread_mutex_unlock(&switch_mu);
    return r;
}

EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                       CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    pthread_mutex_lock(&switch_mu);
    const struct cupti_lib *c = lent && subscriber == their_sub ? their_lib : target();
    int refused = !c || is_ours(subscriber);
    pthread_mutex_unlock(&switch_mu);
    if (refused)
        return c ? CUPTI_ERROR_INVALID_PARAMETER : CUPTI_ERROR_NOT_INITIALIZED;
    return c->enable(enable, subscriber, domain, cbid);
}

EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                     CUpti_CallbackDomain domain)
{
    pthread_mutex_lock(&switch_mu);
    const struct cupti_lib *c = lent && subscriber == their_sub ? their_lib : target();
    int refused = !c || is_ours(subscriber) || !c->enable_domain;
    pthread_mutex_unlock(&switch_mu);
    if (refused)
        return c ? CUPTI_ERROR_INVALID_PARAMETER : CUPTI_ERROR_NOT_INITIALIZED;
    return c->enable_domain(enable, subscriber, domain);
}

/* cuptiFinalize ends every subscription, ours too: the hooks take over
 * first, and CUPTI is taken back once it is done (it starts again at the
 * next call). */
EXPORT CUptiResult cuptiFinalize(void)
{
    pthread_mutex_lock(&switch_mu);
    const struct cupti_lib *c = lent ? their_lib : target();
    CUptiResult r = CUPTI_ERROR_NOT_INITIALIZED;
    if (c && c->finalize) {
        if (subscribed)
            hooks_up();
        r = c->finalize();
        if (r == CUPTI_SUCCESS && subscribed)
            gave_up("finalized by the program", "it starts again");
        else if (subscribed)
            atomic_store(&hooks_on, 0); /* still ours */
        if (r == CUPTI_SUCCESS) {
            lent = 0;
            their_sub = NULL;
        }
        free_again("CUPTI started again after cuptiFinalize");
    }
    pthread_mutex_unlock(&switch_mu);
    return r;
}

/* From a launch outside any other, in hook mode: CUPTI came free inside one. */
static void catch_up(void)
{
    if (inside_work())
        return;
    pthread_mutex_lock(&switch_mu);
    if (atomic_exchange(&back_pending, 0))
        free_again(pending_why);
    pthread_mutex_unlock(&switch_mu);
}

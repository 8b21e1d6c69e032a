/* cupti.c — the simulated CUPTI (libcupti.so.13): one subscriber, callbacks
 * enabled per (domain, id) or per domain, fed by the simulated driver's API
 * hub with the real callback-data and parameter structs.
 *
 * Locking: mu guards the subscriber, the enable table and the hub's hook
 * (set and cleared under it, so an unsubscribe racing a new subscribe
 * cannot detach the newcomer); the hook copies what it needs under mu and
 * calls the subscriber without it, so a callback may call CUPTI again. The
 * test probe is an atomic pair, called with no lock held.
 */
#include "sim.h"

#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef void (*simcuda_api_hook)(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const CUpti_CallbackData *data);
void simcuda__set_api_hook(simcuda_api_hook hook, void *user);
int simcuda__inject(const char *fn);

#define MAX_CBID 1024

struct subscriber {
    CUpti_CallbackFunc fn;
    void *user;
    bool used;
    char name[64]; /* "CUPTI for <subscriberName>", as CUPTI names it */
    unsigned char enabled[CUPTI_CB_DOMAIN_SIZE][MAX_CBID];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct subscriber sub;
static _Atomic(simcuda_cupti_probe_fn) probe_fn;
static void *_Atomic probe_arg;

SIM_EXPORT void simcuda_cupti_probe(simcuda_cupti_probe_fn fn, void *arg)
{
    atomic_store(&probe_arg, arg);
    atomic_store(&probe_fn, fn);
}

static void probe(int event)
{
    simcuda_cupti_probe_fn fn = atomic_load(&probe_fn);
    if (fn)
        fn(event, atomic_load(&probe_arg));
}

int sim_refuse_cupti(const char *name, int code);
int sim_refuse_cupti(const char *name, int code)
{
    fprintf(stderr, "simcuda: %s is not supported by the simulated CUPTI\n", name);
    return code;
}

static bool api_domain(CUpti_CallbackDomain d)
{
    return d == CUPTI_CB_DOMAIN_DRIVER_API || d == CUPTI_CB_DOMAIN_RUNTIME_API;
}

static void hook(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                 const CUpti_CallbackData *data)
{
    (void)user;
    pthread_mutex_lock(&mu);
    bool on = sub.used && cbid < MAX_CBID && sub.enabled[domain][cbid];
    CUpti_CallbackFunc fn = sub.fn;
    void *u = sub.user;
    pthread_mutex_unlock(&mu);
    if (on)
        fn(u, domain, cbid, data);
}

/* Whether the caller's params (structSize bytes of them) reach field. */
#define HAS_FIELD(params, field)                                                                   \
    ((params)->structSize >= CUPTI_CALLBACK_STRUCT_SIZE(CUpti_SubscriberParams, field))

static CUptiResult subscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                             void *userdata, CUpti_SubscriberParams *params)
{
    if (!subscriber)
        return CUPTI_ERROR_INVALID_PARAMETER;
    /* cupti_callbacks.h: CUPTI_ERROR_INVALID_PARAMETER "if pParams.structSize
     * is not filled with the size of the structure". */
    if (params && !HAS_FIELD(params, structSize))
        return CUPTI_ERROR_INVALID_PARAMETER;
    probe(SIMCUDA_CUPTI_SUBSCRIBING);
    if (simcuda__inject("cuptiSubscribe") != 0) /* SIMCUDA_FAIL=cuptiSubscribe:1 */
        return CUPTI_ERROR_NOT_INITIALIZED;
    const char *name = params && HAS_FIELD(params, subscriberName) ? params->subscriberName : NULL;
    pthread_mutex_lock(&mu);
    if (sub.used) {
        /* "the name of the incompatible tool or the existing CUPTI subscriber
         * will be written to" oldSubscriberName. */
        if (params && HAS_FIELD(params, oldSubscriberSize) && params->oldSubscriberName &&
            params->oldSubscriberSize > 0)
            snprintf(params->oldSubscriberName, params->oldSubscriberSize, "%s", sub.name);
        pthread_mutex_unlock(&mu);
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    memset(&sub, 0, sizeof sub);
    sub.fn = callback;
    sub.user = userdata;
    sub.used = true;
    snprintf(sub.name, sizeof sub.name, "CUPTI for %.*s", CUPTI_SUBSCRIBER_NAME_MAX_LEN,
             name ? name : "an unnamed subscriber");
    simcuda__set_api_hook(hook, NULL);
    pthread_mutex_unlock(&mu);
    *subscriber = (CUpti_SubscriberHandle)&sub;
    return CUPTI_SUCCESS;
}

SIM_EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber,
                                      CUpti_CallbackFunc callback, void *userdata)
{
    return subscribe(subscriber, callback, userdata, NULL);
}

SIM_EXPORT CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber,
                                         CUpti_CallbackFunc callback, void *userdata,
                                         CUpti_SubscriberParams *params)
{
    return subscribe(subscriber, callback, userdata, params);
}

static bool valid(CUpti_SubscriberHandle s)
{
    return s == (CUpti_SubscriberHandle)&sub && sub.used;
}

SIM_EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
    pthread_mutex_lock(&mu);
    bool ok = valid(subscriber);
    if (ok) {
        sub.used = false;
        simcuda__set_api_hook(NULL, NULL);
    }
    pthread_mutex_unlock(&mu);
    if (!ok)
        return CUPTI_ERROR_INVALID_PARAMETER;
    probe(SIMCUDA_CUPTI_UNSUBSCRIBED);
    return CUPTI_SUCCESS;
}

/* "destroys and cleans up all the resources associated with CUPTI": the
 * subscriber goes, callbacks stop; the next call starts CUPTI afresh. */
SIM_EXPORT CUptiResult cuptiFinalize(void)
{
    pthread_mutex_lock(&mu);
    bool had = sub.used;
    sub.used = false;
    simcuda__set_api_hook(NULL, NULL);
    pthread_mutex_unlock(&mu);
    if (had)
        probe(SIMCUDA_CUPTI_UNSUBSCRIBED);
    return CUPTI_SUCCESS;
}

SIM_EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                           CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    if (domain <= CUPTI_CB_DOMAIN_INVALID || domain >= CUPTI_CB_DOMAIN_SIZE || cbid >= MAX_CBID)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&mu);
    bool ok = valid(subscriber);
    if (ok)
        sub.enabled[domain][cbid] = enable != 0;
    pthread_mutex_unlock(&mu);
    return ok ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
}

SIM_EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                         CUpti_CallbackDomain domain)
{
    if (domain <= CUPTI_CB_DOMAIN_INVALID || domain >= CUPTI_CB_DOMAIN_SIZE)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (!api_domain(domain))
        return sim_refuse_cupti("cuptiEnableDomain (non-API domains)", CUPTI_ERROR_NOT_SUPPORTED);
    pthread_mutex_lock(&mu);
    bool ok = valid(subscriber);
    if (ok)
        memset(sub.enabled[domain], enable != 0, MAX_CBID);
    pthread_mutex_unlock(&mu);
    return ok ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
}

SIM_EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char **str)
{
    if (!str)
        return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
    case CUPTI_SUCCESS:
        *str = "CUPTI_SUCCESS";
        break;
    case CUPTI_ERROR_INVALID_PARAMETER:
        *str = "CUPTI_ERROR_INVALID_PARAMETER";
        break;
    case CUPTI_ERROR_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_NOT_SUPPORTED";
        break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
        break;
    default:
        *str = NULL;
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    return CUPTI_SUCCESS;
}

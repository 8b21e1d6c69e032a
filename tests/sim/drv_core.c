/* drv_core.c — the simulated driver's front: cuInit and its configuration,
 * sticky errors, fault injection, error strings, cuGetProcAddress and the
 * hub that feeds API callbacks to the simulated CUPTI. Devices and contexts
 * are in drv_device.c.
 *
 * Shared state: `initialised` and `sticky` are atomics; the callback hook is
 * an atomic pointer set by libcupti.
 */
#include "sim.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sim_cfg sim_cfg;
struct sim_stats sim_stats;

/* The CUDA version the simulated driver claims: SIMCUDA_DRIVER_VERSION
 * (12000 for 12.0), 13000 by default. It may be asked before cuInit. */
int sim_driver_version(void)
{
    static atomic_int version;
    int v = atomic_load(&version);
    if (v)
        return v;
    const char *e = getenv("SIMCUDA_DRIVER_VERSION");
    char *end = NULL;
    long n = e && *e ? strtol(e, &end, 10) : 13000;
    if (end && (*end || n < 11000 || n > 99000)) {
        fprintf(stderr,
                "simcuda: SIMCUDA_DRIVER_VERSION=%s: expected a version such as 12040; "
                "using 13000\n",
                e);
        n = 13000;
    }
    atomic_store(&version, (int)n);
    return (int)n;
}

/* 0 before cuInit, 2 while it runs, 1 once it succeeded, 3 if it failed. */
static atomic_int initialised;
static atomic_int init_error;
static atomic_int sticky[SIM_MAX_DEVICES]; /* per device: its context's */
static atomic_uint corr_ids;

static size_t env_size(const char *name, size_t dflt, size_t unit)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || *end || n == 0) {
        fprintf(stderr, "simcuda: %s=%s: expected a positive integer; using %zu\n", name, v,
                dflt / unit);
        return dflt;
    }
    return (size_t)n * unit;
}

static double env_double(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    double d = strtod(v, &end);
    if (*end || d < 0) {
        fprintf(stderr, "simcuda: %s=%s: expected a non-negative number; using 0\n", name, v);
        return 0;
    }
    return d;
}

/* SIMCUDA_DEVICES: 1 to SIM_MAX_DEVICES, or -1 after naming the problem. */
static int env_devices(void)
{
    const char *v = getenv("SIMCUDA_DEVICES");
    if (!v || !*v)
        return 1;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || !isdigit((unsigned char)*v) || n < 1 || n > SIM_MAX_DEVICES) {
        fprintf(stderr,
                "simcuda: SIMCUDA_DEVICES=%s: expected a number of devices from 1 to %d; "
                "cuInit fails with CUDA_ERROR_NO_DEVICE\n",
                v, SIM_MAX_DEVICES);
        return -1;
    }
    return (int)n;
}

/* One size in MiB, or false. */
static bool parse_mib(const char *s, const char **end, size_t *bytes)
{
    char *e;
    errno = 0;
    unsigned long long n = strtoull(s, &e, 10);
    *end = e;
    if (errno || e == s || n == 0 || n > (SIZE_MAX >> 20))
        return false;
    *bytes = (size_t)n << 20;
    return true;
}

/* SIMCUDA_VRAM_MB: one size for every device, or one per device separated
 * by commas ("1024,512"). */
static void read_vram(void)
{
    size_t dflt = 1024ull << 20, v[SIM_MAX_DEVICES + 1] = {0};
    int n = 0;
    const char *e = getenv("SIMCUDA_VRAM_MB"), *p = e;
    bool ok = true;
    while (ok && p && *p) {
        ok = n <= SIM_MAX_DEVICES && parse_mib(p, &p, &v[n++]) && (*p == '\0' || *p++ == ',');
        ok = ok && (*p || p[-1] != ',');
    }
    if (ok && n > 1 && n != sim_cfg.ndevices)
        ok = false;
    if (!ok) {
        fprintf(stderr,
                "simcuda: SIMCUDA_VRAM_MB=%s: expected a size in MiB, or one per device "
                "(SIMCUDA_DEVICES=%d); using 1024\n",
                e, sim_cfg.ndevices);
        n = 0;
    }
    sim_cfg.vram_total = 0;
    for (int d = 0; d < sim_cfg.ndevices; d++) {
        sim_cfg.vram_bytes[d] = n == 0 ? dflt : v[n == 1 ? 0 : d];
        sim_cfg.vram_total += sim_cfg.vram_bytes[d];
    }
}

/* False if the configuration leaves no device. */
static bool read_config(void)
{
    sim_cfg.ndevices = env_devices();
    if (sim_cfg.ndevices < 1)
        return false;
    read_vram();
    sim_cfg.host_bytes = env_size("SIMCUDA_HOST_MB", 8192ull << 20, 1 << 20);
    sim_cfg.gran = env_size("SIMCUDA_GRANULARITY_KB", 2048ull << 10, 1 << 10);
    if (sim_cfg.gran & (sim_cfg.gran - 1) || sim_cfg.gran < 4096) {
        fprintf(stderr,
                "simcuda: SIMCUDA_GRANULARITY_KB must be a power of two >= 4; using 2048\n");
        sim_cfg.gran = 2048ull << 10;
    }
    /* GB/s = 1e9 B/s = 1e3 B/us */
    sim_cfg.pcie_bytes_per_us = env_double("SIMCUDA_PCIE_GBPS") * 1e3;
    sim_cfg.hbm_bytes_per_us = env_double("SIMCUDA_HBM_GBPS") * 1e3;
    sim_cfg.kernel_us = (unsigned)env_double("SIMCUDA_KERNEL_US");
    const char *nh = getenv("SIMCUDA_NO_HOST_VMM");
    sim_cfg.no_host_vmm = nh && *nh && strcmp(nh, "0") != 0;
    return true;
}

SIM_EXPORT CUresult cuInit(unsigned int flags)
{
    CUresult inj = sim_inject(__func__);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (inj != CUDA_SUCCESS)
        return inj;
    int expected = 0;
    if (atomic_compare_exchange_strong(&initialised, &expected, 2)) {
        if (!read_config()) {
            atomic_store(&init_error, CUDA_ERROR_NO_DEVICE);
            atomic_store(&initialised, 3);
        } else {
            sim_exec_init();
            atomic_store(&initialised, 1);
        }
    }
    while (atomic_load(&initialised) == 2)
        ; /* another thread is initialising */
    if (atomic_load(&initialised) == 3)
        return (CUresult)atomic_load(&init_error);
    return sim_check();
}

/* The sticky error the caller sees: its current context's (its device's),
 * or with none current, the first faulted device's (one device: always its
 * own). A destroyed context still current here refuses every call. */
static CUresult sticky_error(void)
{
    CUcontext c = sim_ctx_current();
    if (c && sim_ctx_destroyed(c))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (c)
        return (CUresult)atomic_load(&sticky[sim_ctx_device(c)]);
    for (int d = 0; d < sim_cfg.ndevices; d++)
        if (atomic_load(&sticky[d]))
            return (CUresult)atomic_load(&sticky[d]);
    return CUDA_SUCCESS;
}

CUresult sim_check(void)
{
    if (atomic_load(&initialised) != 1)
        return CUDA_ERROR_NOT_INITIALIZED;
    return sticky_error();
}

static CUresult check_dev(int dev)
{
    if (atomic_load(&initialised) != 1)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= sim_cfg.ndevices)
        return sticky_error();
    return (CUresult)atomic_load(&sticky[dev]);
}

CUresult sim_check_ctx(void)
{
    CUresult r = sim_check();
    if (r == CUDA_SUCCESS && sim_ctx_current() == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    return r;
}

/* ---- fault injection ---- */

#define MAX_RULES 32

struct fail_rule {
    char call[64];
    unsigned long nth;
    bool onwards;
    CUresult err;
    atomic_ulong seen;
};

static struct fail_rule rules[MAX_RULES];
static atomic_int nrules; /* simcuda_fail_clear drops it to 0 */
static pthread_once_t rules_once = PTHREAD_ONCE_INIT;

static CUresult error_by_name(const char *name, bool *ok);
static const char *error_name(CUresult e);

/* cuMemAlloc_v2 and cuMemcpyAsync_ptsz count as cuMemAlloc and cuMemcpyAsync. */
static size_t base_len(const char *fn)
{
    size_t n = strlen(fn);
    static const char *const sfx[] = {"_ptsz", "_ptds", "_v2", "_v3", "_v4"};
    for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
        size_t k = strlen(sfx[i]);
        if (n > k && strcmp(fn + n - k, sfx[i]) == 0)
            n -= k;
    }
    return n;
}

static bool parse_rule(char *spec, struct fail_rule *r)
{
    char *call = strtok(spec, ":"), *nth = strtok(NULL, ":"), *err = strtok(NULL, ":");
    if (!call || !nth || strlen(call) >= sizeof r->call)
        return false;
    char *end;
    r->nth = strtoul(nth, &end, 10);
    r->onwards = *end == '+';
    if (r->nth == 0 || (*end && strcmp(end, "+") != 0))
        return false;
    bool ok = true;
    r->err = err ? error_by_name(err, &ok) : CUDA_ERROR_UNKNOWN;
    snprintf(r->call, sizeof r->call, "%.*s", (int)base_len(call), call);
    return ok;
}

static void read_rules(void)
{
    const char *env = getenv("SIMCUDA_FAIL");
    if (!env || !*env)
        return;
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char spec[256];
        snprintf(spec, sizeof spec, "%s", item);
        if (nrules == MAX_RULES || !parse_rule(spec, &rules[nrules])) {
            fprintf(stderr, "simcuda: SIMCUDA_FAIL: cannot use '%s' (want call:nth[+][:error])\n",
                    item);
            continue;
        }
        nrules++;
    }
}

/* Counts a call of fn against every rule that names it; returns the rule
 * that fails this call (and its count through *nth), or NULL. */
static struct fail_rule *count_call(const char *fn, unsigned long *nth)
{
    pthread_once(&rules_once, read_rules);
    size_t n = base_len(fn);
    struct fail_rule *fired = NULL;
    int n_rules = atomic_load(&nrules);
    for (int i = 0; i < n_rules; i++) {
        struct fail_rule *r = &rules[i];
        if (strlen(r->call) != n || strncmp(r->call, fn, n) != 0)
            continue;
        unsigned long k = atomic_fetch_add(&r->seen, 1) + 1;
        if (!fired && (k == r->nth || (r->onwards && k > r->nth))) {
            fired = r;
            *nth = k;
        }
    }
    return fired;
}

static CUresult injected(const struct fail_rule *r, unsigned long nth)
{
    const char *name = error_name(r->err);
    fprintf(stderr, "simcuda: injected failure of %s (call %lu): %s\n", r->call, nth,
            name ? name : "?");
    return r->err;
}

SIM_EXPORT void simcuda_fail_clear(void)
{
    pthread_once(&rules_once, read_rules);
    atomic_store(&nrules, 0);
}

CUresult sim_inject(const char *fn)
{
    unsigned long nth = 0;
    struct fail_rule *r = count_call(fn, &nth);
    return r ? injected(r, nth) : CUDA_SUCCESS;
}

/* For the simulated CUPTI, whose calls are injectable too. */
SIM_EXPORT int simcuda__inject(const char *fn);
int simcuda__inject(const char *fn)
{
    return (int)sim_inject(fn);
}

CUresult sim_enter(const char *fn, bool needs_ctx)
{
    unsigned long nth = 0;
    struct fail_rule *fail = count_call(fn, &nth);
    CUresult r = needs_ctx ? sim_check_ctx() : sim_check();
    if (r != CUDA_SUCCESS)
        return r;
    return fail ? injected(fail, nth) : CUDA_SUCCESS;
}

CUresult sim_enter_dev(const char *fn, int dev)
{
    unsigned long nth = 0;
    struct fail_rule *fail = count_call(fn, &nth);
    CUresult r = check_dev(dev);
    if (r != CUDA_SUCCESS)
        return r;
    return fail ? injected(fail, nth) : CUDA_SUCCESS;
}

void sim_fault(uintptr_t addr, const char *what)
{
    /* Named and counted before the error turns sticky: whoever sees the
     * sticky error sees the fault recorded too. */
    fprintf(stderr, "simcuda: illegal address 0x%llx in %s; the context is now unusable\n",
            (unsigned long long)addr, what);
    atomic_fetch_add(&sim_stats.faults, 1);
    int ok = CUDA_SUCCESS;
    atomic_compare_exchange_strong(&sticky[sim_running_device()], &ok, CUDA_ERROR_ILLEGAL_ADDRESS);
}

bool sim_device_faulted(int dev)
{
    return atomic_load(&sticky[dev]) != CUDA_SUCCESS;
}

int sim_refuse_driver(const char *name, int code)
{
    fprintf(stderr, "simcuda: %s is not supported by the simulated GPU\n", name);
    return code;
}

void sim_sleep_us(double us)
{
    if (us <= 0)
        return;
    struct timespec ts = {(time_t)(us / 1e6),
                          (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1e3)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static double sim_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* How much longer than the last ones a paced work may run and still end
 * on time. */
#define PACE_MARGIN 3

double sim_paced(struct sim_pace *p, double us, size_t bytes, bool (*work)(void *), void *arg)
{
    double start = sim_mono_us();
    sim_sleep_us(us - (double)bytes * p->us_per_byte * PACE_MARGIN);
    double t0 = sim_mono_us();
    if (!work(arg))
        return sim_mono_us() - start;
    double t1 = sim_mono_us();
    if (us > 0 && bytes >= 4096)
        p->us_per_byte = (p->us_per_byte * 3 + (t1 - t0) / (double)bytes) / 4;
    sim_sleep_us(us - (t1 - start)); /* never shorter than modelled */
    return sim_mono_us() - start;
}

/* ---- versions ---- */

SIM_EXPORT CUresult cuDriverGetVersion(int *v)
{
    CUresult r = sim_inject(__func__);
    if (r)
        return r;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = sim_driver_version();
    return CUDA_SUCCESS;
}

/* ---- error strings ---- */

/* The real driver's text where the simulator knows it; every other code of
 * the CUresult enum gets a description derived from its name. */
#define SIM_ERROR_TEXTS(X)                                                                         \
    X(CUDA_SUCCESS, "no error")                                                                    \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                                \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                   \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                          \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                            \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                                  \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                         \
    X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                                  \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                        \
    X(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed")                                      \
    X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                                 \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                        \
    X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")          \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                              \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                                    \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                      \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")               \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                        \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,                                                   \
      "part or all of the requested memory range is already mapped")                               \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,                                                       \
      "pointer does not correspond to a registered memory region")                                 \
    X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                                         \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                      \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                         \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                         \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing")   \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                                       \
      "operation failed due to a previous error during capture")                                   \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,                                                          \
      "operation would make the legacy stream depend on a capturing blocking stream")              \
    X(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                              \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

static const struct sim_error_name *error_entry(CUresult e)
{
    for (size_t i = 0; i < sim_cu_errors_count; i++)
        if (sim_cu_errors[i].code == (int)e)
            return &sim_cu_errors[i];
    return NULL;
}

static const char *error_name(CUresult e)
{
    const struct sim_error_name *n = error_entry(e);
    return n ? n->name : NULL;
}

/* Any CUresult name, or a positive number. */
static CUresult error_by_name(const char *name, bool *ok)
{
    *ok = true;
    for (size_t i = 0; i < sim_cu_errors_count; i++)
        if (strcmp(name, sim_cu_errors[i].name) == 0)
            return (CUresult)sim_cu_errors[i].code;
    char *end;
    long v = strtol(name, &end, 10);
    if (*end || v <= 0) {
        *ok = false;
        return CUDA_ERROR_UNKNOWN;
    }
    return (CUresult)v;
}

SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char **str)
{
    CUresult r = sim_inject(__func__);
    if (r)
        return r;
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
#define X(code, text)                                                                              \
    case code:                                                                                     \
        *str = text;                                                                               \
        return CUDA_SUCCESS;
        SIM_ERROR_TEXTS(X)
#undef X
    default:
        break;
    }
    const struct sim_error_name *n = error_entry(error);
    *str = n ? n->text : NULL;
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char **str)
{
    CUresult r = sim_inject(__func__);
    if (r)
        return r;
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    *str = error_name(error);
    return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress: returns the driver's own definitions, as the real
 * one does, so a caller can reach them past any interposer. ---- */

static void *self_handle(void)
{
    static void *self;
    if (!self) {
        Dl_info info;
        if (dladdr((void *)cuInit, &info) && info.dli_fname)
            self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    }
    return self;
}

/* The CUDA version that brought symbol in, for those newer than 12.0 that
 * the library asks for; 0 for the rest. */
static int introduced(const char *symbol)
{
    static const struct {
        const char *name;
        int since;
    } newer[] = {
        {"cuFuncGetName", 12030},      {"cuKernelGetName", 12030},
        {"cuFuncGetParamInfo", 12040}, {"cuKernelGetParamInfo", 12040},
        {"cuMemcpyBatchAsync", 12080}, {"cuMemcpy3DBatchAsync", 12080},
    };
    for (size_t i = 0; i < sizeof newer / sizeof *newer; i++)
        if (strcmp(symbol, newer[i].name) == 0)
            return newer[i].since;
    return 0;
}

/* The CUDA version that brought a versioned variant in, where the name's
 * older variants stay what older callers get (cudaTypedefs.h:
 * PFN_cuCtxCreate_v3020, _v11040, _v12050); 0 for the rest. */
static int variant_since(const char *symbol, const char *suffix)
{
    if (strcmp(symbol, "cuCtxCreate") != 0)
        return 0;
    return strcmp(suffix, "_v4") == 0 ? 12050 : strcmp(suffix, "_v3") == 0 ? 11040 : 0;
}

/* As cuda.h documents it: a cudaVersion newer than the driver is
 * CUDA_ERROR_INVALID_VALUE; a symbol the driver does not have is
 * CUDA_SUCCESS with *pfn NULL and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND. */
SIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    CUresult r = sim_inject(__func__);
    if (r)
        return r;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (cudaVersion > sim_driver_version())
        return CUDA_ERROR_INVALID_VALUE;
    int since = introduced(symbol);
    if (since > sim_driver_version() || since > cudaVersion) {
        if (status)
            *status = since > sim_driver_version() ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                                                   : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_SUCCESS;
    }
    void *self = self_handle(), *stub = NULL;
    char name[256], stub_name[300];
    static const char *const suffixes[] = {"_v4", "_v3", "_v2", ""};
    /* With the per-thread flag, the _ptsz/_ptds variant where there is one. */
    static const char *const threads[] = {"_ptsz", "_ptds", ""};
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    /* The newest implemented version; a stub only if nothing is implemented. */
    for (size_t i = 0; self && i < 3 * sizeof suffixes / sizeof *suffixes; i++) {
        size_t t = per_thread ? i % 3 : 2;
        if (!per_thread && i % 3 != 2)
            continue;
        if (variant_since(symbol, suffixes[i / 3]) > cudaVersion)
            continue;
        snprintf(name, sizeof name, "%s%s%s", symbol, suffixes[i / 3], threads[t]);
        snprintf(stub_name, sizeof stub_name, "simcuda_stub_%s", name);
        void *f = dlsym(self, name);
        if (f && f == dlsym(self, stub_name)) {
            stub = stub ? stub : f;
            continue;
        }
        if (f) {
            *pfn = f;
            if (status)
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    if (stub) {
        *pfn = stub;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

/* ---- the API-callback hub ---- */

typedef void (*simcuda_api_hook)(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const CUpti_CallbackData *data);
static _Atomic(simcuda_api_hook) api_hook;
static void *_Atomic api_hook_user;

/* Called by the simulated CUPTI; NULL detaches. Internal ABI, not for tests. */
SIM_EXPORT void simcuda__set_api_hook(simcuda_api_hook hook, void *user);
void simcuda__set_api_hook(simcuda_api_hook hook, void *user)
{
    atomic_store(&api_hook_user, user);
    atomic_store(&api_hook, hook);
}

void sim_api_enter(struct sim_api_call *call, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                   const char *fname, const char *symbol, const void *params)
{
    simcuda_api_hook hook = atomic_load(&api_hook);
    call->active = hook != NULL;
    if (!hook)
        return;
    call->domain = domain;
    call->cbid = cbid;
    call->corr_data = 0;
    call->data = (CUpti_CallbackData){
        .callbackSite = CUPTI_API_ENTER,
        .functionName = fname,
        .functionParams = params,
        .functionReturnValue = NULL,
        .symbolName = symbol,
        .context = sim_ctx_current(),
        .contextUid = (uint32_t)sim_current_device() + 1,
        .correlationData = &call->corr_data,
        .correlationId = atomic_fetch_add(&corr_ids, 1) + 1,
    };
    hook(atomic_load(&api_hook_user), domain, cbid, &call->data);
}

void sim_api_exit(struct sim_api_call *call, void *ret)
{
    simcuda_api_hook hook = atomic_load(&api_hook);
    if (!call->active || !hook)
        return;
    call->data.callbackSite = CUPTI_API_EXIT;
    call->data.functionReturnValue = ret;
    hook(atomic_load(&api_hook_user), call->domain, call->cbid, &call->data);
}

/* Lets the simulated runtime wrap its own calls in API callbacks. */
SIM_EXPORT void simcuda__api_enter(struct sim_api_call *call, int domain, int cbid,
                                   const char *fname, const char *symbol, const void *params);
SIM_EXPORT void simcuda__api_exit(struct sim_api_call *call, void *ret);
void simcuda__api_enter(struct sim_api_call *call, int domain, int cbid, const char *fname,
                        const char *symbol, const void *params)
{
    sim_api_enter(call, (CUpti_CallbackDomain)domain, (CUpti_CallbackId)cbid, fname, symbol,
                  params);
}
void simcuda__api_exit(struct sim_api_call *call, void *ret)
{
    sim_api_exit(call, ret);
}

SIM_EXPORT void simcuda_get_stats(simcuda_stats_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    sim_mem_stats(&out->device_bytes_in_use, &out->device_bytes_peak, &out->host_bytes_in_use);
    out->copies_h2d = atomic_load(&sim_stats.copies_h2d);
    out->copies_d2h = atomic_load(&sim_stats.copies_d2h);
    out->bytes_h2d = atomic_load(&sim_stats.bytes_h2d);
    out->bytes_d2h = atomic_load(&sim_stats.bytes_d2h);
    out->launches = atomic_load(&sim_stats.launches);
    out->faults = atomic_load(&sim_stats.faults);
    out->us_h2d = atomic_load(&sim_stats.us_h2d);
    out->us_d2h = atomic_load(&sim_stats.us_d2h);
    out->bytes_hbm = atomic_load(&sim_stats.bytes_hbm);
    out->us_hbm = atomic_load(&sim_stats.us_hbm);
}

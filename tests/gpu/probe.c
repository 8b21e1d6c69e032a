/* probe.c — is there a usable GPU here? Loads the driver at run time (no
 * CUDA toolkit needed to build it), calls cuInit and counts the devices.
 * Prints one line; exits 0 with a device, 1 without.
 * Build: cc -o probe tests/gpu/probe.c -ldl
 */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_version_fn)(int *);

#define CC_MAJOR 75 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
#define CC_MINOR 76 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */

int main(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("no CUDA driver: %s\n", dlerror());
        return 1;
    }
    cu_init_fn init = (cu_init_fn)dlsym(lib, "cuInit");
    cu_count_fn count = (cu_count_fn)dlsym(lib, "cuDeviceGetCount");
    cu_get_fn get = (cu_get_fn)dlsym(lib, "cuDeviceGet");
    cu_name_fn name = (cu_name_fn)dlsym(lib, "cuDeviceGetName");
    cu_attr_fn attr = (cu_attr_fn)dlsym(lib, "cuDeviceGetAttribute");
    cu_version_fn version = (cu_version_fn)dlsym(lib, "cuDriverGetVersion");
    if (!init || !count || !get || !name || !attr || !version) {
        printf("the CUDA driver lacks the basic entry points\n");
        return 1;
    }
    int rc = init(0);
    if (rc != 0) {
        printf("cuInit failed: error %d\n", rc);
        return 1;
    }
    int n = 0, dev = 0, major = 0, minor = 0, drv = 0;
    char buf[256] = "";
    if (count(&n) != 0 || n < 1 || get(&dev, 0) != 0) {
        printf("cuInit succeeded but there is no device\n");
        return 1;
    }
    name(buf, (int)sizeof buf, dev);
    attr(&major, CC_MAJOR, dev);
    attr(&minor, CC_MINOR, dev);
    version(&drv);
    printf("%d device(s); device 0: %s, compute capability %d.%d, driver API %d.%d\n", n, buf,
           major, minor, drv / 1000, drv % 1000 / 10);
    return 0;
}

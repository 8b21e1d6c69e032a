/* dlsym_objs.c — the shared objects test_e2e_dlsym looks symbols up from,
 * one per OBJ_* definition: lookups whose answer depends on who asks.
 *
 * A and B, linked into the test in that order, both define sh_twice; A asks
 * for the next one. C, opened RTLD_LOCAL, asks the default scope for a
 * function of D, its own dependency, which only C's scope holds.
 */
#include <dlfcn.h>
#include <stddef.h>

int sh_twice(void);
int sh_next_twice(void);
int sh_local_probe(void);
int sh_only_in_d(void);

#if defined(OBJ_A)
int sh_twice(void)
{
    return 1;
}

int sh_next_twice(void)
{
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "sh_twice");
    return f ? f() : 0;
}
#elif defined(OBJ_B)
int sh_twice(void)
{
    return 2;
}
#elif defined(OBJ_C)
int sh_local_probe(void)
{
    int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "sh_only_in_d");
    return f ? f() : 0;
}
#elif defined(OBJ_D)
int sh_only_in_d(void)
{
    return 4;
}
#endif

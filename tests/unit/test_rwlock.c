/* test_rwlock.c — the region index's lock: readers share it, a writer has
 * it alone, a reader may take it again while a writer waits (no deadlock),
 * and under contention no reader ever sees a writer's half-done update. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/rwlock.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

static struct sh_rwlock lk;

static void test_readers_share(void **state)
{
    (void)state;
    sh_rw_init(&lk);
    sh_rw_rdlock(&lk);
    sh_rw_rdlock(&lk);
    assert_int_equal(atomic_load(&lk.state), 2);
    sh_rw_unlock(&lk);
    sh_rw_unlock(&lk);
    sh_rw_wrlock(&lk);
    assert_true(atomic_load(&lk.state) & SH_RW_WRITER);
    sh_rw_unlock(&lk);
    assert_int_equal(atomic_load(&lk.state), 0);
    sh_rw_destroy(&lk);
}

static atomic_int wrote;

static void *writer(void *arg)
{
    (void)arg;
    sh_rw_wrlock(&lk);
    atomic_store(&wrote, 1);
    sh_rw_unlock(&lk);
    return NULL;
}

/* A writer waiting does not stop a reader that holds the lock from taking
 * it again (glibc's default rwlock allows it; the pool relies on it). */
static void test_nested_read_with_writer_waiting(void **state)
{
    (void)state;
    sh_rw_init(&lk);
    atomic_store(&wrote, 0);
    sh_rw_rdlock(&lk);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, writer, NULL), 0);
    while (atomic_load(&lk.waiters) == 0)
        usleep(100);
    sh_rw_rdlock(&lk);
    assert_int_equal(atomic_load(&wrote), 0);
    sh_rw_unlock(&lk);
    sh_rw_unlock(&lk);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&wrote), 1);
    sh_rw_destroy(&lk);
}

/* Writers keep a and b equal; readers must never see them differ. */
static volatile long a, b;
static atomic_int torn, stop;

static void *mixed(void *arg)
{
    long id = (long)(intptr_t)arg;
    for (long i = 0; !atomic_load(&stop); i++) {
        if ((i + id) % 8 == 0) {
            sh_rw_wrlock(&lk);
            a = a + 1;
            sched_yield();
            b = b + 1;
            sh_rw_unlock(&lk);
        } else {
            sh_rw_rdlock(&lk);
            if (a != b)
                atomic_store(&torn, 1);
            sh_rw_unlock(&lk);
        }
    }
    return NULL;
}

static void test_writers_exclude_readers(void **state)
{
    (void)state;
    sh_rw_init(&lk);
    a = b = 0;
    atomic_store(&torn, 0);
    atomic_store(&stop, 0);
    pthread_t t[6];
    for (long i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, mixed, (void *)(intptr_t)i), 0);
    usleep(300 * 1000);
    atomic_store(&stop, 1);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&torn), 0);
    assert_true(a > 0);
    assert_int_equal(atomic_load(&lk.state), 0);
    assert_int_equal(atomic_load(&lk.waiters), 0);
    sh_rw_destroy(&lk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readers_share),
        cmocka_unit_test(test_nested_read_with_writer_waiting),
        cmocka_unit_test(test_writers_exclude_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

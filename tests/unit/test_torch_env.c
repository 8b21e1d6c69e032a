/* test_torch_env.c — telling from PyTorch's allocator settings whether its
 * native allocator maps its own memory (expandable_segments), as users
 * write them: spaces, other keys around it, the async backend that ignores
 * it, values PyTorch would not take. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "interpose/interpose.h"

static void test_expandable_on(void **state)
{
    (void)state;
    assert_true(sh_torch_expandable("expandable_segments:True"));
    assert_true(sh_torch_expandable("expandable_segments:true"));
    assert_true(sh_torch_expandable("max_split_size_mb:128,expandable_segments:True"));
    assert_true(sh_torch_expandable("expandable_segments:True,garbage_collection_threshold:0.6"));
    assert_true(sh_torch_expandable(" expandable_segments:True "));
    assert_true(sh_torch_expandable("backend:native,expandable_segments:True"));
}

static void test_expandable_off(void **state)
{
    (void)state;
    assert_false(sh_torch_expandable(NULL));
    assert_false(sh_torch_expandable(""));
    assert_false(sh_torch_expandable("expandable_segments:False"));
    assert_false(sh_torch_expandable("max_split_size_mb:128"));
    assert_false(sh_torch_expandable("backend:cudaMallocAsync"));
    /* the async backend ignores it: every tensor is a cudaMallocAsync */
    assert_false(sh_torch_expandable("backend:cudaMallocAsync,expandable_segments:True"));
    assert_false(sh_torch_expandable("expandable_segments:True,backend:cudaMallocAsync"));
    /* another key that merely starts alike */
    assert_false(sh_torch_expandable("expandable_segments_x:True"));
    assert_false(sh_torch_expandable("expandable_segments"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expandable_on),
        cmocka_unit_test(test_expandable_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

// A second module with a kernel of the same name as kparams.cu's k_ptrs and
// another parameter layout: tests/e2e/test_e2e_cubin.c registers both
// (regen.sh builds kclash.fatbin).

extern "C" __global__ void k_ptrs(int n, float *a)
{
}

// Kernels whose parameter layouts tests/unit/test_cubin.c checks against the
// cubin and fatbin fixtures built from this file by regen.sh. Nothing here is
// ever launched; the compiler records every parameter, used or not, so the
// bodies stay empty to keep the fixtures small.

struct Padded { // 24 bytes, 8-aligned: 7 padding bytes after a, 6 after c
    char a;
    double b;
    short c;
};

struct __align__(16) Vec16 { // 16 bytes, 16-aligned
    int x;
};

struct Big { // large enough for the compiler to emit KPARAM_INFO_V2 records
    char bytes[4400];
};

extern "C" __global__ void k_ptrs(float *a, const int *b, double *c)
{
}

extern "C" __global__ void k_scalars(char c, short s, int i, long long l, unsigned char u, double d,
                                     float *out)
{
}

__global__ void k_struct(int *p, Padded s, char t, Vec16 q)
{
}

#define K8(n)                                                                                      \
    int *p##n, char c##n, int i##n, short s##n, double d##n, unsigned char u##n, long long l##n,   \
        float f##n

__global__ void k_many(K8(0), K8(1), K8(2), K8(3), K8(4))
{
}

template <typename T> __global__ void k_tmpl(T *p, T v, int n)
{
}
template __global__ void k_tmpl<float>(float *, float, int);

extern "C" __global__ void k_none(void) {}

extern "C" __global__ void k_big(int *p, Big b, short s)
{
}

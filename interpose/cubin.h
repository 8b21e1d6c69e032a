/* cubin.h — kernel parameter layouts read from CUDA module images.
 *
 * The launch scanner needs each kernel's parameter offsets and sizes. The
 * driver reports them through cuFuncGetParamInfo / cuKernelGetParamInfo;
 * where it cannot, this module reads them from the module image itself: the
 * EIATTR_KPARAM_INFO records of the `.nv.info.<kernel>` section of an ELF
 * cubin, found directly or inside a fatbin container (see cubin.c for the
 * formats, as verified against nvcc 13 output).
 *
 * Inputs: an in-memory image, pointer and size, that is either an ELF cubin
 * (64-bit, EM_CUDA) or one fatbin container (magic 0xBA55ED50) holding PTX
 * and ELF entries. Compressed fatbin entries are not decoded: they are
 * skipped, and a search that only they could have answered ends in
 * SH_ENOTFOUND with a reason saying so. The image is only read, never
 * written, and never read outside [image, image + size).
 *
 * Malformed input (truncated, bad magic, tables or sections outside the
 * image, absurd counts, inconsistent records) returns SH_EINVAL; it never
 * crashes and never reads out of bounds.
 *
 * Results: 0 or a negative SH_E* code; values through out-parameters. Every
 * function that takes `why` sets *why (when `why` is not NULL) to a short
 * static description whenever it returns non-zero.
 *
 * Shared state: none. No CUDA call, no lock; each call works on its
 * arguments and on memory it allocates and frees itself, so calls may run
 * concurrently from any threads. The only process-wide effect is libelf's
 * one-time version handshake, made under pthread_once.
 */
#ifndef SH_CUBIN_H
#define SH_CUBIN_H

#include <stddef.h>
#include <stdint.h>

/* One parameter per byte of the largest parameter buffer CUDA allows
 * (32764 bytes since 12.1), rounded up: more records than this are taken
 * as malformed input. */
#define SH_CUBIN_MAX_PARAMS 32768

/* One kernel parameter: where it lies in the parameter buffer. */
struct sh_cubin_param {
    uint32_t offset; /* bytes from the start of the parameter buffer */
    uint32_t size;   /* bytes */
};

/* The number of bytes an image occupies, from its own headers: for a fatbin
 * its header's size field, for an ELF the furthest end of its headers,
 * header tables and sections. For callers that hold only a pointer (the
 * image of cuModuleLoadData, cuLibraryLoadData, or a fatbin wrapper's data
 * member). Reads nothing at or past image + limit (pass SIZE_MAX when the
 * extent is unknown and the image is trusted, e.g. after the driver accepted
 * it). SH_EINVAL for anything else (PTX text, a __fatBinC_Wrapper_t, bad
 * headers, an extent beyond limit). */
int sh_cubin_image_size(const void *image, size_t limit, size_t *size);

/* The parameters of the kernel called `name` (its mangled symbol name, as
 * cuFuncGetName reports it). Writes *count, then, when *count <= cap, the
 * parameters in ordinal order to params[0 .. *count-1]. In a fatbin the
 * first uncompressed ELF entry that defines the kernel answers (parameter
 * layouts follow the C ABI and do not differ between architectures).
 *
 * Returns 0; SH_ERANGE when *count > cap (nothing written to params; call
 * again with room for *count); SH_ENOTFOUND when no readable entry defines
 * the kernel, or it has no readable layout (why says which); SH_EINVAL for
 * bad arguments or malformed input. */
int sh_cubin_kernel_params(const void *image, size_t size, const char *name,
                           struct sh_cubin_param *params, size_t cap, size_t *count,
                           const char **why);

/* One kernel, as sh_cubin_list_kernels reports it. The pointers are valid
 * only during the callback: copy what you keep. */
struct sh_cubin_kernel {
    const char *name;                    /* mangled symbol name */
    unsigned arch;                       /* SM number of its ELF (90 for sm_90), 0 if unknown */
    size_t nparams;                      /* parameters, in ordinal order */
    const struct sh_cubin_param *params; /* NULL when nparams is 0 */
};

/* Return 0 to go on; any other value stops the listing and is returned. */
typedef int (*sh_cubin_visit_fn)(void *ctx, const struct sh_cubin_kernel *kernel);

/* Calls fn once for each kernel (entry function) of each uncompressed ELF in
 * the image that has a `.nv.info.<name>` section with a readable layout; a
 * fatbin with several architectures reports a kernel once per ELF entry,
 * with that entry's arch. Kernels without such a section are left out.
 *
 * Returns 0 when the listing ran to the end (whether or not it found
 * kernels); fn's non-zero value when fn stopped it; SH_ENOTFOUND when the
 * image holds no ELF that can be read (a fatbin of PTX only, or whose ELF
 * entries are all compressed; why says which); SH_ENOMEM; SH_EINVAL for bad
 * arguments or malformed input (fn may have been called for kernels met
 * before the fault). */
int sh_cubin_list_kernels(const void *image, size_t size, sh_cubin_visit_fn fn, void *ctx,
                          const char **why);

#endif

/* cubin.c — kernel parameter layouts from ELF cubins and fatbin containers.
 *
 * No shared state: see cubin.h. All multi-byte fields are little-endian
 * and are read byte by byte, only after a bounds check against the image.
 *
 * Formats, as produced by nvcc 13.0 (cuda_13.0.r13.0) for sm_75..sm_120 and
 * checked on the fixtures in tests/unit/cubin/ (hex dumps of the sections
 * with readelf -x, compared with the C ABI layout of each parameter list and
 * with the `.param` declarations of the same kernels in PTX):
 *
 * Fatbin container: a 16-byte header {u32 magic 0xBA55ED50, u16 version 1,
 * u16 header size (16), u64 size of the entries that follow the header},
 * then the entries back to back, each a header followed by its payload:
 *
 *   +0  u16 kind          1 PTX, 2 ELF
 *   +2  u16 (0x0101)
 *   +4  u32 header size   64 (ELF), 80 (PTX) seen; the payload follows it
 *   +8  u64 payload size  padded to 8; the next entry follows the payload
 *   +16 u32 compressed size (0 when stored plainly)
 *   +28 u32 arch          80, 90, ...
 *   +40 u64 flags         0x1 64-bit, 0x10 Linux, 0x8000 compressed: a zstd
 *                         frame (28 b5 2f fd), as nvcc writes for PTX entries
 *                         by default and for ELF entries with -Xfatbin
 *                         -compress-all; 0x2000 is the compression flag of
 *                         older toolchains, treated the same way
 *   +48 u64 (0)
 *   +56 u64 uncompressed size (when compressed)
 *
 * ELF cubin: ELFCLASS64, little-endian, e_machine EM_CUDA (190); the SM is
 * (e_flags >> 8) & 0xff for EI_ABIVERSION 8 (e_flags 0x6005a04 is sm_90),
 * e_flags & 0xff before. A kernel is an STT_FUNC symbol with STO_CUDA_ENTRY
 * (0x10) in st_other; device functions (with -rdc) have .nv.info.<name>
 * sections too but lack the flag. Its attributes are in section
 * `.nv.info.<name>`, type SHT_LOPROC (0x70000000): a sequence of records
 *
 *   u8 format, u8 attribute, then
 *     EIFMT_NVAL (1), EIFMT_BVAL (2), EIFMT_HVAL (3): u16 value (4 bytes in all)
 *     EIFMT_SVAL (4): u16 size, then that many bytes
 *
 * of which three describe parameters:
 *
 *   EIATTR_PARAM_CBANK (0x0a, SVAL, 8 bytes): u32 symbol of the
 *       .nv.constant0.<name> section, u16 offset of the parameters in it
 *       (0x210 on sm_90), u16 parameter buffer size.
 *   EIATTR_CBANK_PARAM_SIZE (0x19, HVAL): the parameter buffer size.
 *   EIATTR_KPARAM_INFO (0x17, SVAL, 12 bytes), one per parameter, emitted
 *       in descending ordinal order:
 *         +0 u32 index (0)   +4 u16 ordinal   +6 u16 offset
 *         +8 u32 packed: bits 0-7 pointee log2 alignment, 8-11 space,
 *            12-16 cbank (0x1f), 17 0, 18-31 size in bytes.
 *       e.g. the record of k_struct's Padded parameter (tests/unit/cubin/
 *       kparams.cu: 24 bytes at offset 8) is
 *         04 17 0c 00 | 00 00 00 00 | 01 00 | 08 00 | 00 f0 61 00
 *       and 0x0061f000 >> 18 = 24; a char is 0x0005f000 (1), a short
 *       0x0009f000 (2), an int 0x0011f000 (4), a pointer 0x0021f000 (8).
 *       Sizes up to 4200 bytes were seen in this form.
 *   EIATTR_KPARAM_INFO_V2 (0x45, SVAL, 12 bytes), used instead of 0x17 for
 *       every parameter of a kernel whose buffer passes about 4.3 KB (4208
 *       bytes still gave 0x17, 4408 gave 0x45):
 *         +0 u32 index (0)   +4 u16 ordinal   +6 u16 offset
 *         +8 u16 size in bytes   +10 u16 attributes (0 seen on sm_90)
 *       e.g. k_big's 4400-byte parameter at offset 8 is
 *         04 45 0c 00 | 00 00 00 00 | 01 00 | 08 00 | 30 11 00 00
 *
 * In every kernel seen, ordinals are dense from 0, offsets grow with the
 * ordinal as the C ABI lays the parameters out, and the last one ends at the
 * buffer size; a record set that breaks any of that is refused as malformed
 * rather than guessed at.
 */
#include "interpose/cubin.h"

#include "sh_err.h"

#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FATBIN_MAGIC      0xBA55ED50u
#define FATBIN_HDR        16u
#define FATBIN_ENTRY_MIN  64u
#define FATBIN_KIND_ELF   2u
#define FATBIN_COMPRESSED 0xA000u /* 0x2000 | 0x8000 */

#ifndef EM_CUDA
#define EM_CUDA 190
#endif
#define SHT_CUDA_INFO  0x70000000u
#define STO_CUDA_ENTRY 0x10u
#define INFO_PREFIX    ".nv.info."
#define INFO_PREFIX_N  (sizeof INFO_PREFIX - 1)

#define EIFMT_NVAL 1
#define EIFMT_BVAL 2
#define EIFMT_HVAL 3
#define EIFMT_SVAL 4

#define EIATTR_PARAM_CBANK      0x0a
#define EIATTR_KPARAM_INFO      0x17
#define EIATTR_CBANK_PARAM_SIZE 0x19
#define EIATTR_KPARAM_INFO_V2   0x45
#define KPARAM_PAYLOAD          12u
#define KPARAM_V1_SIZE_SHIFT    18
#define PARAM_CBANK_PAYLOAD     8u
#define SIZE_UNSEEN             UINT32_MAX

/* ---- small helpers ---- */

static void say(const char **why, const char *what)
{
    if (why)
        *why = what;
}

static uint16_t rd16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const unsigned char *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* [off, off + len) lies within [0, size). */
static bool within(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

static bool is_elf(const unsigned char *p, size_t n)
{
    return n >= SELFMAG && memcmp(p, ELFMAG, SELFMAG) == 0;
}

static bool is_fatbin(const unsigned char *p, size_t n)
{
    return n >= 4 && rd32(p) == FATBIN_MAGIC;
}

/* The NUL-terminated string at `off` of a string table, or NULL. */
static const char *str_at(const unsigned char *tab, size_t len, uint64_t off)
{
    if (!tab || off >= len || !memchr(tab + off, '\0', len - (size_t)off))
        return NULL;
    return (const char *)tab + off;
}

static pthread_once_t elf_once = PTHREAD_ONCE_INIT;
static bool elf_ok;

static void elf_init(void)
{
    elf_ok = elf_version(EV_CURRENT) != EV_NONE;
}

/* ---- ELF extent: headers read by hand, so that libelf only ever sees an
 * image whose tables have been bounds-checked ---- */

#define E64_HDR  64u
#define E64_SHDR 64u
#define E64_PHDR 56u

/* The furthest end of the headers, tables and sections of the 64-bit ELF
 * at p, reading nothing at or past p + limit. */
static int elf_extent(const unsigned char *p, size_t limit, uint64_t *end, const char **why)
{
    if (limit < E64_HDR || !is_elf(p, limit)) {
        say(why, "truncated ELF header");
        return SH_EINVAL;
    }
    if (p[EI_CLASS] != ELFCLASS64 || p[EI_DATA] != ELFDATA2LSB) {
        say(why, "not a 64-bit little-endian ELF");
        return SH_EINVAL;
    }
    uint64_t phoff = rd64(p + 0x20), shoff = rd64(p + 0x28);
    uint16_t ehsize = rd16(p + 0x34), phentsize = rd16(p + 0x36), phnum = rd16(p + 0x38);
    uint16_t shentsize = rd16(p + 0x3a);
    uint64_t shnum = rd16(p + 0x3c);
    uint64_t e = E64_HDR;
    if (ehsize < E64_HDR || ehsize > limit) {
        say(why, "bad ELF header size");
        return SH_EINVAL;
    }
    if (phnum) {
        if (phentsize != E64_PHDR || !within(phoff, (uint64_t)phnum * E64_PHDR, limit)) {
            say(why, "ELF program header table out of bounds");
            return SH_EINVAL;
        }
        if (phoff + (uint64_t)phnum * E64_PHDR > e)
            e = phoff + (uint64_t)phnum * E64_PHDR;
    }
    if (shoff) {
        if (shentsize != E64_SHDR || !within(shoff, E64_SHDR, limit)) {
            say(why, "ELF section header table out of bounds");
            return SH_EINVAL;
        }
        if (shnum == 0) /* extended numbering: the count is in section 0 */
            shnum = rd64(p + shoff + 0x20);
        if (shnum == 0 || shnum > limit / E64_SHDR || !within(shoff, shnum * E64_SHDR, limit)) {
            say(why, "ELF section header table out of bounds");
            return SH_EINVAL;
        }
        if (shoff + shnum * E64_SHDR > e)
            e = shoff + shnum * E64_SHDR;
        for (uint64_t i = 1; i < shnum; i++) {
            const unsigned char *sh = p + shoff + i * E64_SHDR;
            uint32_t type = rd32(sh + 4);
            uint64_t off = rd64(sh + 0x18), size = rd64(sh + 0x20);
            if (type == SHT_NOBITS || type == SHT_NULL)
                continue;
            if (!within(off, size, limit)) {
                say(why, "ELF section out of bounds");
                return SH_EINVAL;
            }
            if (off + size > e)
                e = off + size;
        }
    } else if (rd16(p + 0x3c)) {
        say(why, "ELF sections without a section header table");
        return SH_EINVAL;
    }
    *end = e;
    return 0;
}

int sh_cubin_image_size(const void *image, size_t limit, size_t *size)
{
    const unsigned char *p = image;
    if (!p || !size)
        return SH_EINVAL;
    if (is_fatbin(p, limit)) {
        if (limit < FATBIN_HDR)
            return SH_EINVAL;
        uint16_t hdr = rd16(p + 6);
        uint64_t body = rd64(p + 8);
        if (rd16(p + 4) != 1 || hdr < FATBIN_HDR || !within(hdr, body, limit))
            return SH_EINVAL;
        *size = (size_t)(hdr + body);
        return 0;
    }
    if (is_elf(p, limit < EI_NIDENT ? limit : EI_NIDENT)) {
        uint64_t end = 0;
        int rc = elf_extent(p, limit, &end, NULL);
        if (rc)
            return rc;
        *size = (size_t)end;
        return 0;
    }
    return SH_EINVAL;
}

/* ---- .nv.info records ---- */

struct info_scan {
    size_t nparams;   /* KPARAM_INFO(_V2) records */
    uint32_t bufsize; /* parameter buffer size, SIZE_UNSEEN if not stated */
};

/* Walks the records of one .nv.info.<kernel> section. With out != NULL
 * (room for scan->nparams entries), also places each parameter at its
 * ordinal. */
static int info_walk(const unsigned char *b, size_t len, struct info_scan *scan,
                     struct sh_cubin_param *out, const char **why)
{
    size_t pos = 0, n = 0;
    uint32_t total = SIZE_UNSEEN, cbank = SIZE_UNSEEN;
    while (pos < len) {
        if (len - pos < 4) {
            say(why, "truncated .nv.info record");
            return SH_EINVAL;
        }
        unsigned fmt = b[pos], attr = b[pos + 1];
        uint16_t val = rd16(b + pos + 2);
        const unsigned char *pl = b + pos + 4;
        if (fmt == EIFMT_SVAL) {
            if (len - pos - 4 < val) {
                say(why, "truncated .nv.info record");
                return SH_EINVAL;
            }
            pos += 4 + (size_t)val;
        } else if (fmt == EIFMT_NVAL || fmt == EIFMT_BVAL || fmt == EIFMT_HVAL) {
            pos += 4;
        } else {
            say(why, "unknown .nv.info record format");
            return SH_EINVAL;
        }

        if (attr == EIATTR_KPARAM_INFO || attr == EIATTR_KPARAM_INFO_V2) {
            if (fmt != EIFMT_SVAL || val != KPARAM_PAYLOAD) {
                say(why, "KPARAM_INFO record of unexpected shape");
                return SH_EINVAL;
            }
            if (++n > SH_CUBIN_MAX_PARAMS) {
                say(why, "too many KPARAM_INFO records");
                return SH_EINVAL;
            }
            if (!out)
                continue;
            uint32_t ord = rd16(pl + 4), off = rd16(pl + 6), packed = rd32(pl + 8);
            uint32_t size =
                attr == EIATTR_KPARAM_INFO ? packed >> KPARAM_V1_SIZE_SHIFT : packed & 0xffffu;
            if (ord >= scan->nparams) {
                say(why, "KPARAM_INFO ordinal out of range");
                return SH_EINVAL;
            }
            if (out[ord].size != SIZE_UNSEEN) {
                say(why, "duplicate KPARAM_INFO ordinal");
                return SH_EINVAL;
            }
            out[ord].offset = off;
            out[ord].size = size;
        } else if (attr == EIATTR_CBANK_PARAM_SIZE) {
            if (fmt != EIFMT_HVAL) {
                say(why, "CBANK_PARAM_SIZE record of unexpected shape");
                return SH_EINVAL;
            }
            total = val;
        } else if (attr == EIATTR_PARAM_CBANK) {
            if (fmt != EIFMT_SVAL || val != PARAM_CBANK_PAYLOAD) {
                say(why, "PARAM_CBANK record of unexpected shape");
                return SH_EINVAL;
            }
            cbank = rd16(pl + 6);
        }
    }
    scan->nparams = n;
    scan->bufsize = total != SIZE_UNSEEN ? total : cbank;
    return 0;
}

/* The layout of one kernel from its .nv.info.<kernel> section. Same results
 * as sh_cubin_kernel_params. */
static int info_params(const unsigned char *b, size_t len, struct sh_cubin_param *params,
                       size_t cap, size_t *count, const char **why)
{
    struct info_scan scan;
    int rc = info_walk(b, len, &scan, NULL, why);
    if (rc)
        return rc;
    *count = scan.nparams;
    if (scan.nparams == 0) {
        if (scan.bufsize != SIZE_UNSEEN && scan.bufsize != 0) {
            say(why, "kernel has parameter bytes but no KPARAM_INFO records");
            return SH_ENOTFOUND;
        }
        return 0;
    }
    if (scan.nparams > cap || !params) {
        say(why, "more parameters than the caller's array holds");
        return SH_ERANGE;
    }
    for (size_t i = 0; i < scan.nparams; i++)
        params[i].size = SIZE_UNSEEN;
    rc = info_walk(b, len, &scan, params, why);
    if (rc)
        return rc;
    uint64_t end = 0;
    for (size_t i = 0; i < scan.nparams; i++) {
        if (params[i].offset < end) {
            say(why, "parameters overlap or are out of order");
            return SH_EINVAL;
        }
        end = (uint64_t)params[i].offset + params[i].size;
        if (scan.bufsize != SIZE_UNSEEN && end > scan.bufsize) {
            say(why, "parameter runs past the parameter buffer");
            return SH_EINVAL;
        }
    }
    return 0;
}

/* ---- one ELF ---- */

struct elf_img {
    unsigned char *buf; /* private, aligned copy handed to libelf */
    size_t n;
    Elf *elf;
    size_t shnum;
    const unsigned char *shstr; /* section name table */
    size_t shstr_len;
    Elf_Data *syms; /* NULL when there is no symbol table */
    size_t nsyms;
    const unsigned char *symstr;
    size_t symstr_len;
    unsigned arch;
};

static void elf_close(struct elf_img *e)
{
    if (e->elf)
        elf_end(e->elf);
    free(e->buf);
    memset(e, 0, sizeof *e);
}

/* The file bytes of section idx, bounds-checked against the image. */
static int scn_bytes(const struct elf_img *e, size_t idx, GElf_Shdr *sh, const unsigned char **p,
                     size_t *len, const char **why)
{
    Elf_Scn *scn = elf_getscn(e->elf, idx);
    if (idx == 0 || idx >= e->shnum || !scn || !gelf_getshdr(scn, sh)) {
        say(why, "bad ELF section index");
        return SH_EINVAL;
    }
    if (sh->sh_type == SHT_NOBITS || !within(sh->sh_offset, sh->sh_size, e->n)) {
        say(why, "ELF section out of bounds");
        return SH_EINVAL;
    }
    *p = e->buf + sh->sh_offset;
    *len = (size_t)sh->sh_size;
    return 0;
}

static int elf_open(struct elf_img *e, const unsigned char *p, size_t n, const char **why)
{
    memset(e, 0, sizeof *e);
    uint64_t end = 0;
    int rc = elf_extent(p, n, &end, why);
    if (rc)
        return rc;
    pthread_once(&elf_once, elf_init);
    if (!elf_ok) {
        say(why, "libelf refused the ELF version");
        return SH_EINVAL;
    }
    /* libelf wants a writable image; give it a private copy so a read-only
     * module image is never at risk. */
    n = (size_t)end; /* what lies past the ELF's own extent is not its business */
    e->n = n;
    e->buf = malloc(n);
    if (!e->buf) {
        say(why, "out of memory");
        return SH_ENOMEM;
    }
    memcpy(e->buf, p, n);
    e->elf = elf_memory((char *)e->buf, n);
    GElf_Ehdr eh;
    if (!e->elf || elf_kind(e->elf) != ELF_K_ELF || !gelf_getehdr(e->elf, &eh)) {
        say(why, "libelf refused the ELF image");
        goto bad;
    }
    if (eh.e_machine != EM_CUDA) {
        say(why, "ELF is not for a CUDA device (e_machine)");
        goto bad;
    }
    e->arch = eh.e_ident[EI_ABIVERSION] >= 8 ? (eh.e_flags >> 8) & 0xff : eh.e_flags & 0xff;
    size_t shstrndx;
    if (elf_getshdrnum(e->elf, &e->shnum) != 0 || elf_getshdrstrndx(e->elf, &shstrndx) != 0 ||
        e->shnum == 0) {
        say(why, "ELF has no usable section table");
        goto bad;
    }
    GElf_Shdr sh;
    if (scn_bytes(e, shstrndx, &sh, &e->shstr, &e->shstr_len, why))
        goto bad;

    for (size_t i = 1; i < e->shnum; i++) {
        Elf_Scn *scn = elf_getscn(e->elf, i);
        if (!scn || !gelf_getshdr(scn, &sh)) {
            say(why, "bad ELF section header");
            goto bad;
        }
        if (sh.sh_type != SHT_SYMTAB)
            continue;
        const unsigned char *raw;
        size_t rawlen;
        if (scn_bytes(e, i, &sh, &raw, &rawlen, why))
            goto bad;
        size_t entsize = gelf_fsize(e->elf, ELF_T_SYM, 1, EV_CURRENT);
        if (entsize == 0 || sh.sh_entsize != entsize) {
            say(why, "ELF symbol table of unexpected entry size");
            goto bad;
        }
        GElf_Shdr strsh;
        if (scn_bytes(e, sh.sh_link, &strsh, &e->symstr, &e->symstr_len, why))
            goto bad;
        e->syms = elf_getdata(scn, NULL);
        if (!e->syms || e->syms->d_size < rawlen) {
            say(why, "libelf could not read the symbol table");
            goto bad;
        }
        e->nsyms = rawlen / entsize;
        if (e->nsyms > INT_MAX) {
            say(why, "ELF symbol table too large");
            goto bad;
        }
        break;
    }
    return 0;
bad:
    elf_close(e);
    return SH_EINVAL;
}

/* The name of symbol i when it is a kernel entry point, else NULL. */
static const char *entry_name(const struct elf_img *e, size_t i)
{
    GElf_Sym sym;
    if (!gelf_getsym(e->syms, (int)i, &sym))
        return NULL;
    if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || !(sym.st_other & STO_CUDA_ENTRY))
        return NULL;
    const char *name = str_at(e->symstr, e->symstr_len, sym.st_name);
    return name && *name ? name : NULL;
}

/* The kernel name that section i is the .nv.info section of, else NULL. */
static const char *info_target(const struct elf_img *e, size_t i, GElf_Shdr *sh)
{
    Elf_Scn *scn = elf_getscn(e->elf, i);
    if (!scn || !gelf_getshdr(scn, sh) || sh->sh_type != SHT_CUDA_INFO)
        return NULL;
    const char *name = str_at(e->shstr, e->shstr_len, sh->sh_name);
    if (!name || strncmp(name, INFO_PREFIX, INFO_PREFIX_N) != 0 || !name[INFO_PREFIX_N])
        return NULL;
    return name + INFO_PREFIX_N;
}

/* The layout of kernel `name` in this ELF; *defined says whether the ELF
 * defines the kernel at all (when it does not, the result is SH_ENOTFOUND
 * and why is left alone, so that a later entry of a fatbin may answer). */
static int elf_kernel_params(const struct elf_img *e, const char *name, bool *defined,
                             struct sh_cubin_param *params, size_t cap, size_t *count,
                             const char **why)
{
    *defined = false;
    for (size_t i = 0; e->syms && i < e->nsyms && !*defined; i++) {
        const char *s = entry_name(e, i);
        *defined = s && strcmp(s, name) == 0;
    }
    if (!*defined)
        return SH_ENOTFOUND;
    for (size_t i = 1; i < e->shnum; i++) {
        GElf_Shdr sh;
        const char *target = info_target(e, i, &sh);
        if (!target || strcmp(target, name) != 0)
            continue;
        const unsigned char *b;
        size_t len;
        int rc = scn_bytes(e, i, &sh, &b, &len, why);
        return rc ? rc : info_params(b, len, params, cap, count, why);
    }
    say(why, "kernel has no .nv.info section");
    return SH_ENOTFOUND;
}

/* ---- images: one ELF, or the ELF entries of a fatbin ---- */

/* Called for each readable ELF; 0 goes on, anything else stops the walk. */
typedef int (*elf_fn)(void *arg, const unsigned char *p, size_t n, const char **why);

struct walk {
    size_t elves;      /* ELF images handed to fn */
    size_t compressed; /* compressed ELF entries skipped */
};

static int walk_image(const void *image, size_t size, elf_fn fn, void *arg, struct walk *w,
                      const char **why)
{
    const unsigned char *p = image;
    memset(w, 0, sizeof *w);
    if (is_elf(p, size)) {
        w->elves = 1;
        return fn(arg, p, size, why);
    }
    if (!is_fatbin(p, size)) {
        say(why, "not an ELF cubin or a fatbin (bad magic)");
        return SH_EINVAL;
    }
    if (size < FATBIN_HDR) {
        say(why, "truncated fatbin header");
        return SH_EINVAL;
    }
    uint64_t off = rd16(p + 6), body = rd64(p + 8);
    if (rd16(p + 4) != 1) {
        say(why, "unknown fatbin version");
        return SH_EINVAL;
    }
    if (off < FATBIN_HDR || !within(off, body, size)) {
        say(why, "fatbin extends past the image");
        return SH_EINVAL;
    }
    uint64_t end = off + body;
    while (off < end) {
        const unsigned char *h = p + off;
        if (end - off < FATBIN_ENTRY_MIN) {
            say(why, "truncated fatbin entry header");
            return SH_EINVAL;
        }
        uint32_t hsize = rd32(h + 4);
        uint64_t psize = rd64(h + 8);
        if (hsize < FATBIN_ENTRY_MIN || hsize > end - off) {
            say(why, "fatbin entry header size out of range");
            return SH_EINVAL;
        }
        if (psize > end - off - hsize) {
            say(why, "fatbin entry runs past the container");
            return SH_EINVAL;
        }
        const unsigned char *payload = h + hsize;
        if (rd16(h) == FATBIN_KIND_ELF) {
            if (rd64(h + 40) & FATBIN_COMPRESSED) {
                w->compressed++;
            } else if (!is_elf(payload, (size_t)psize)) {
                say(why, "fatbin ELF entry does not hold an ELF image");
                return SH_EINVAL;
            } else {
                w->elves++;
                int rc = fn(arg, payload, (size_t)psize, why);
                if (rc)
                    return rc;
            }
        }
        off += hsize + psize;
    }
    return 0;
}

static int no_readable_elf(const struct walk *w, const char **why)
{
    if (w->compressed)
        say(why, "the image's ELF entries are compressed, which is not supported");
    else
        say(why, "the fatbin holds no ELF entry (PTX only)");
    return SH_ENOTFOUND;
}

/* ---- sh_cubin_kernel_params ---- */

#define FOUND 1 /* stops the walk: the kernel was found */

struct find {
    const char *name;
    struct sh_cubin_param *params;
    size_t cap, *count;
};

static int find_in_elf(void *arg, const unsigned char *p, size_t n, const char **why)
{
    struct find *f = arg;
    struct elf_img e;
    int rc = elf_open(&e, p, n, why);
    if (rc)
        return rc;
    bool defined;
    rc = elf_kernel_params(&e, f->name, &defined, f->params, f->cap, f->count, why);
    elf_close(&e);
    if (!defined)
        return 0; /* not in this ELF: go on */
    return rc == 0 ? FOUND : rc;
}

int sh_cubin_kernel_params(const void *image, size_t size, const char *name,
                           struct sh_cubin_param *params, size_t cap, size_t *count,
                           const char **why)
{
    if (!image || !name || !count || (cap && !params)) {
        say(why, "bad argument");
        return SH_EINVAL;
    }
    *count = 0;
    struct find f = {name, params, cap, count};
    struct walk w;
    int rc = walk_image(image, size, find_in_elf, &f, &w, why);
    if (rc == FOUND)
        return 0;
    if (rc)
        return rc;
    *count = 0;
    if (w.elves == 0)
        return no_readable_elf(&w, why);
    say(why, w.compressed ? "no kernel of that name in the uncompressed ELF entries (others are "
                            "compressed, which is not supported)"
                          : "no kernel of that name");
    return SH_ENOTFOUND;
}

/* ---- sh_cubin_list_kernels ---- */

struct list {
    sh_cubin_visit_fn fn;
    void *ctx;
    struct sh_cubin_param *params; /* reused across kernels */
    size_t cap;
};

struct entry {
    const char *name;
    bool seen;
};

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static int list_elf(struct list *l, const struct elf_img *e, struct entry *ents, size_t nents,
                    const char **why)
{
    for (size_t i = 1; i < e->shnum; i++) {
        GElf_Shdr sh;
        const char *target = info_target(e, i, &sh);
        if (!target)
            continue;
        struct entry key = {target, false};
        struct entry *k = bsearch(&key, ents, nents, sizeof *ents, entry_cmp);
        if (!k || k->seen)
            continue; /* a device function's section, or a duplicate */
        k->seen = true;
        const unsigned char *b;
        size_t len, count = 0;
        int rc = scn_bytes(e, i, &sh, &b, &len, why);
        if (rc)
            return rc;
        rc = info_params(b, len, l->params, l->cap, &count, why);
        if (rc == SH_ERANGE) {
            struct sh_cubin_param *np = realloc(l->params, count * sizeof *np);
            if (!np) {
                say(why, "out of memory");
                return SH_ENOMEM;
            }
            l->params = np;
            l->cap = count;
            rc = info_params(b, len, l->params, l->cap, &count, why);
        }
        if (rc == SH_ENOTFOUND)
            continue; /* no readable layout: left out */
        if (rc)
            return rc;
        struct sh_cubin_kernel k_out = {target, e->arch, count, count ? l->params : NULL};
        rc = l->fn(l->ctx, &k_out);
        if (rc) {
            say(why, "the callback stopped the listing");
            return rc;
        }
    }
    return 0;
}

static int list_in_elf(void *arg, const unsigned char *p, size_t n, const char **why)
{
    struct list *l = arg;
    struct elf_img e;
    int rc = elf_open(&e, p, n, why);
    if (rc)
        return rc;
    size_t nents = 0;
    struct entry *ents = NULL;
    if (e.nsyms) {
        ents = calloc(e.nsyms, sizeof *ents);
        if (!ents) {
            elf_close(&e);
            say(why, "out of memory");
            return SH_ENOMEM;
        }
        for (size_t i = 0; i < e.nsyms; i++) {
            const char *s = entry_name(&e, i);
            if (s)
                ents[nents++].name = s;
        }
        qsort(ents, nents, sizeof *ents, entry_cmp);
    }
    rc = nents ? list_elf(l, &e, ents, nents, why) : 0;
    free(ents);
    elf_close(&e);
    return rc;
}

int sh_cubin_list_kernels(const void *image, size_t size, sh_cubin_visit_fn fn, void *ctx,
                          const char **why)
{
    if (!image || !fn) {
        say(why, "bad argument");
        return SH_EINVAL;
    }
    struct list l = {fn, ctx, NULL, 0};
    struct walk w;
    int rc = walk_image(image, size, list_in_elf, &l, &w, why);
    free(l.params);
    if (rc)
        return rc;
    if (w.elves == 0)
        return no_readable_elf(&w, why);
    return 0;
}

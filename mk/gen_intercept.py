#!/usr/bin/env python3
"""Generates the interception table from the CUDA headers and
interpose/intercept.def.

Every entry point the headers declare that could enqueue device work or read
or write device memory (by its name, or because it takes a stream) must be
classified in intercept.def: wrapped (a wrapper is generated here), owned (a
hand-written hook exports it) or exempt (with the reason). Anything left
unclassified stops the build, so a new entry point in a new CUDA release
cannot be missed silently.

Usage: gen_intercept.py CC CUDA_INCLUDE DEF OUT_C OUT_SYMS [EXPORTS_MAP]
       gen_intercept.py --check CC CUDA_INCLUDE DEF [EXPORTS_MAP]
"""
import re
import subprocess
import sys

# Names that suggest device work; functions taking a stream are candidates too.
WORK = re.compile(r"Memcpy|Memset|Launch|Value(32|64)|MemOp|Prefetch|Discard|Semaphores|"
                  r"Decompress|GraphUpload|GraphLaunch")
# Graph-building calls record parameters but run nothing; graph.c reads
# graphs when they are instantiated and launched.
GRAPH_PARAMS = re.compile(r"^cu(da)?Graph(Add|Exec)?.*Node.*(Params|Node)|^cu(da)?GraphAdd")
ATTR = re.compile(r"__attribute__\s*\(\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)\)")
SUFFIX = r"(_v[0-9]+)?(_ptds|_ptsz)?"

HEADERS = [  # header, defines, return type, name prefix
    ("cuda.h", ["-D__CUDA_API_VERSION_INTERNAL"], "CUresult", "cu"),
    ("cuda_runtime_api.h", [], "cudaError_t", "cuda"),
    ("cuda_runtime_api.h", ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"], "cudaError_t", "cuda"),
]


def die(msg):
    sys.stderr.write("gen_intercept: %s\n" % msg)
    sys.exit(1)


def declarations(cc, inc, header, defines, rtype, prefix):
    src = "#include <%s>\n" % header
    out = subprocess.run([cc, "-E", "-P", "-I" + inc] + defines + ["-x", "c", "-"], input=src,
                         capture_output=True, text=True, check=True).stdout
    decl = re.compile(r"^\s*(?:extern\s+)?%s\s+(%s[A-Za-z0-9_]*)\s*\((.*)\)\s*$" % (rtype, prefix),
                      re.S)
    found = {}
    for stmt in ATTR.sub(" ", out.replace("\n", " ")).split(";"):
        m = decl.match(stmt)
        if m:
            found[m.group(1)] = (rtype, params(m.group(2), m.group(1)), header)
    return found


def params(text, name):
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    result = []
    for i, p in enumerate(out):
        p = re.sub(r"\s*=\s*[^,]*$", "", p)  # C++ default arguments
        array = p.endswith("]")
        p = re.sub(r"\[[^\]]*\]$", "", p).strip()
        m = re.match(r"^(.*?[\s*])([A-Za-z_][A-Za-z0-9_]*)$", p)
        if not m or m.group(1).strip() in ("", "const", "struct", "enum"):
            die("%s: cannot read parameter %d (%s)" % (name, i, p))
        ptype = m.group(1).strip() + (" *" if array else "")
        result.append((ptype, m.group(2)))
    return result


def read_def(path):
    """Lines: 'wrap NAME ACCESS', 'own NAME', 'exempt NAME... : REASON'.
    A NAME covers its versioned and per-thread variants (NAME_v2_ptsz...);
    '=NAME' covers that name only."""
    rules = []
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            kind, _, rest = line.partition(" ")
            rest = rest.strip()
            where = "%s:%d" % (path, lineno)
            if kind == "wrap":
                name, _, access = rest.partition(" ")
                rules.append((kind, [name], access.strip(), where))
            elif kind == "own":
                rules.append((kind, rest.split(), "", where))
            elif kind == "exempt":
                names, sep, reason = rest.partition(":")
                if not sep or not reason.strip():
                    die("%s: an exemption needs ': reason'" % where)
                rules.append((kind, names.split(), reason.strip(), where))
            else:
                die("%s: unknown rule '%s' (wrap, own or exempt)" % (where, kind))
    return rules


def matches(pattern, name):
    if pattern.startswith("="):
        return name == pattern[1:]
    return re.fullmatch(re.escape(pattern) + SUFFIX, name) is not None


def classify(decls, rules):
    """name -> (kind, access, where) for every declared name a rule covers."""
    out, exact = {}, set()
    # Exact names first: they override a family's rule for one variant.
    for pass_exact in (True, False):
        for kind, names, access, where in rules:
            for pattern in names:
                if pattern.startswith("=") != pass_exact:
                    continue
                hit = [n for n in decls if matches(pattern, n)]
                if not hit:
                    die("%s: %s matches nothing the headers declare" % (where, pattern))
                for name in hit:
                    if name in exact:
                        continue
                    if name in out and out[name][2] != where:
                        die("%s: %s is already classified at %s" % (where, name, out[name][2]))
                    out[name] = (kind, access, where)
                    if pass_exact:
                        exact.add(name)
    return out


def candidates(decls):
    for name, (_, plist, _) in decls.items():
        takes_stream = any(t in ("CUstream", "cudaStream_t") for t, _ in plist)
        if (WORK.search(name) or takes_stream) and not GRAPH_PARAMS.search(name):
            yield name


def check(decls, table, exports):
    missing = sorted(n for n in candidates(decls) if n not in table)
    if missing:
        die("not classified in interpose/intercept.def (wrap, own or exempt): " +
            " ".join(missing))
    if exports is not None:
        owned = sorted(n for n, (k, _, _) in table.items() if k == "own" and n not in exports)
        if owned:
            die("classified 'own' but no hook exports them: " + " ".join(owned))


STREAM_TYPES = ("CUstream", "cudaStream_t")


def wrapper(idx, name, rtype, plist, access):
    decl = ", ".join("%s %s" % p for p in plist) or "void"
    args = ", ".join(n for _, n in plist)
    types = ", ".join(t for t, _ in plist) or "void"
    stream = next((n for t, n in plist if t in STREAM_TYPES), "NULL")
    ptsz = 1 if re.search(r"_pt(sz|ds)$", name) else 0
    # $N in an access is the N-th parameter, whatever this variant calls it.
    access = re.sub(r"\$(\d+)", lambda m: plist[int(m.group(1)) - 1][1], access)
    missing = "CUDA_ERROR_NOT_FOUND" if rtype == "CUresult" else "cudaErrorSymbolNotFound"
    # Work that might reach memory the library cannot map again (sh_work_issue).
    refused = "CUDA_ERROR_OUT_OF_MEMORY" if rtype == "CUresult" else "cudaErrorMemoryAllocation"
    # A capture is counted even before the library manages anything.
    begin = "sh_work_begin_capture" if access.startswith("capture(") else "sh_work_begin"
    return """
EXPORT %(rtype)s %(name)s(%(decl)s);
%(rtype)s %(name)s(%(decl)s)
{
    %(rtype)s (*real)(%(types)s) = (%(rtype)s(*)(%(types)s))sh_icept_real(%(idx)d);
    if (!real)
        return %(missing)s;
    struct sh_work w;
    if (!%(begin)s(&w, (CUstream)%(stream)s, %(ptsz)d))
        return real(%(args)s);
    %(access)s;
    %(rtype)s r = sh_work_issue(&w) ? %(refused)s : real(%(args)s);
    sh_work_end(&w, (int)r);
    return r;
}
""" % dict(rtype=rtype, name=name, decl=decl, idx=idx, missing=missing, stream=stream, ptsz=ptsz,
           types=types, args=args, access=access, refused=refused, begin=begin)


def zero_call(idx, name, rtype, plist):
    args = ", ".join("(%s){0}" % t for t, _ in plist)
    return "static int call_%d(void) { return (int)%s(%s); }\n" % (idx, name, args)


def main(argv):
    checking = argv[1:2] == ["--check"]
    if checking:
        argv = argv[1:]
    if len(argv) < 4:
        die(__doc__)
    cc, inc, defpath = argv[1], argv[2], argv[3]
    decls = {}
    for header, defines, rtype, prefix in HEADERS:
        decls.update(declarations(cc, inc, header, defines, rtype, prefix))
    table = classify(decls, read_def(defpath))
    mapfile = argv[4] if checking and len(argv) > 4 else (argv[6] if len(argv) > 6 else None)
    exports = None
    if mapfile:
        with open(mapfile) as f:
            exports = set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*;", f.read(), re.M))
    check(decls, table, exports)
    if checking:
        return
    wrapped = sorted(n for n, (k, _, _) in table.items() if k == "wrap")
    out_c, out_syms = argv[4], argv[5]
    with open(out_c, "w") as f:
        f.write("/* Generated by mk/gen_intercept.py from the CUDA headers and\n"
                " * interpose/intercept.def; do not edit. */\n"
                "#define SH_ICEPT_VERBS\n#include \"interpose/intercept.h\"\n\n"
                "#define EXPORT __attribute__((visibility(\"default\")))\n"
                "/* Deprecated entry points are still called, so wrapped too. */\n"
                "#pragma GCC diagnostic ignored \"-Wdeprecated-declarations\"\n\n")
        f.write("const struct sh_icept_entry sh_icept_table[] = {\n")
        for name in wrapped:
            f.write("    {\"%s\", %d},\n" % (name, 1 if name.startswith("cuda") else 0))
        f.write("};\nconst size_t sh_icept_count = %d;\n" % len(wrapped))
        f.write("\n/* The wrappers' addresses, in table order. */\n")
        for idx, name in enumerate(wrapped):
            rtype, plist, _ = decls[name]
            f.write(wrapper(idx, name, rtype, plist, table[name][1]))
        f.write("\nvoid *const sh_icept_wrappers[] = {\n")
        for name in wrapped:
            f.write("    (void *)%s,\n" % name)
        f.write("};\n")
        f.write("\n#ifdef SH_ICEPT_CALLS\n/* For the gating test: each entry called with zero "
                "arguments. */\n")
        for idx, name in enumerate(wrapped):
            rtype, plist, _ = decls[name]
            f.write(zero_call(idx, name, rtype, plist))
        f.write("static int (*const sh_icept_calls[])(void) = {\n")
        for idx in range(len(wrapped)):
            f.write("    call_%d,\n" % idx)
        f.write("};\n#endif\n")
    with open(out_syms, "w") as f:
        for name in wrapped:
            f.write("    %s;\n" % name)


if __name__ == "__main__":
    main(sys.argv)

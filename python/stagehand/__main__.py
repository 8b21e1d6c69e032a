"""python -m stagehand: run a program under libstagehand, watch one, or record
a model's trace with no GPU.

    python -m stagehand run -- python train.py     # LD_PRELOAD and PyTorch's allocator variable
    python -m stagehand top [--once | --json ...]  # stagehand-top, with its own options
    python -m stagehand trace gpt:layers=24 -o gpt.trace.gz   # docs/TRACE.md, from the meta device
"""

import argparse
import os
import re
import shlex
import shutil
import sys

from . import _conf, _lib

USAGE = """usage: python -m stagehand run [--lib PATH] [--allocator async|native]
                                [--torch-version X.Y] [--print-env] [-q] -- COMMAND [ARG...]
       python -m stagehand top [stagehand-top options]
       python -m stagehand trace MODEL [--gpu CARD] [--mode async|preload|pluggable]
                                 [--steps N] [-o FILE] [--list] ...

run   runs COMMAND under libstagehand: LD_PRELOAD gains the library, and
      PyTorch's allocator variable gets backend:cudaMallocAsync (one region per
      tensor), in the variable the PyTorch that COMMAND uses reads.
top   runs stagehand-top, the live monitor (found next to the library, or on PATH).
trace records training steps of a PyTorch model on the meta device (no GPU) as
      the library would see them, with durations from a GPU's roofline, for
      stagehand-sim to replay (python -m stagehand trace --help).
"""


def _fail(msg, status=2):
    print("python -m stagehand: %s" % msg, file=sys.stderr)
    return status


def find_top(environ=None):
    """stagehand-top's path: beside the library (a build folder), PREFIX/bin for
    PREFIX/lib, the install's bin folder, then PATH. None when there is none."""
    places = []
    try:
        libdir = os.path.dirname(_lib.find_library(environ=environ))
        places += [libdir, os.path.join(os.path.dirname(libdir), "bin")]
    except _lib.StagehandError:
        pass
    try:
        from . import _paths  # written by make install
        places.append(_paths.BINDIR)
    except ImportError:
        pass
    for d in places:
        path = os.path.join(d, "stagehand-top")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("stagehand-top", path=(environ or os.environ).get("PATH"))


def top(argv, environ=None, execv=os.execv):
    path = find_top(environ)
    if path is None:
        return _fail("stagehand-top not found beside libstagehand.so or on PATH "
                     "(build it with make, or install it with make install)")
    execv(path, [path] + list(argv))
    return 0  # only when execv is a stand-in


def _python_of(command):
    """The interpreter a command runs, when it is a Python one (python, python3.11...)."""
    if command and re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
        return shutil.which(command[0]) or command[0]
    return None


def run_parser():
    p = argparse.ArgumentParser(
        prog="python -m stagehand run",
        usage="python -m stagehand run [options] -- COMMAND [ARG...]",
        description="Runs COMMAND under libstagehand.")
    p.add_argument("--lib", help="the library (default: $STAGEHAND_LIB, then beside the "
                                 "package, its install or build folder)")
    p.add_argument("--allocator", choices=("async", "native"), default="async",
                   help="async (default): PyTorch's cudaMallocAsync backend, one region per "
                        "tensor; native: leave PyTorch's allocator variables alone (one "
                        "region per caching-allocator segment)")
    p.add_argument("--torch-version", metavar="X.Y",
                   help="the PyTorch version COMMAND uses (default: read from the package "
                        "metadata of COMMAND's Python, or of this one)")
    p.add_argument("--print-env", action="store_true",
                   help="print the variables set and the command instead of running it")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def run(argv, environ=None, execvpe=os.execvpe, out=None):
    """The launcher; returns an exit status (when execvpe returns at all)."""
    environ = dict(os.environ if environ is None else environ)
    out = out or sys.stdout
    p = run_parser()
    if "--" in argv:  # everything after it is the command, whatever it looks like
        i = argv.index("--")
        args = p.parse_args(argv[:i])
        args.command = argv[i + 1:]
    else:
        args = p.parse_args(argv)
    if not args.command:
        p.error("no command to run: python -m stagehand run -- python train.py")
    try:
        lib = _lib.find_library(args.lib, environ)
    except _lib.StagehandError as e:
        p.error(str(e))
    if args.torch_version:
        version = _conf.parse_version(args.torch_version)
        if version is None:
            p.error("--torch-version %r: expected MAJOR.MINOR, e.g. 2.10" % args.torch_version)
        source = "for PyTorch %d.%d, as given" % version
    else:
        python = _python_of(args.command)
        found = _conf.installed_torch_version(python)
        version = _conf.parse_version(found)
        source = ("for PyTorch %s of %s" % (found, python or sys.executable) if version
                  else "no PyTorch found for %s: for any version" % (python or sys.executable))
    env = _conf.launch_env(environ, lib, version, args.allocator)
    changed = [k for k in sorted(env) if env.get(k) != environ.get(k)]
    if not args.quiet:
        print("stagehand run: %s (%s)" % (
            " ".join("%s=%s" % (k, env[k]) for k in changed) or "nothing to change", source),
            file=sys.stderr)
        for msg in _conf.problems(env, version):
            print("stagehand run: warning: %s" % msg, file=sys.stderr)
    if args.print_env:
        for k in changed:
            print("%s=%s" % (k, shlex.quote(env[k])), file=out)
        print(" ".join(shlex.quote(a) for a in args.command), file=out)
        return 0
    try:
        execvpe(args.command[0], args.command, env)
    except FileNotFoundError:
        return _fail("run: %s: command not found" % args.command[0], 127)
    except PermissionError:
        return _fail("run: %s: permission denied" % args.command[0], 126)
    return 0  # only when execvpe is a stand-in


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "run":
        return run(argv[1:])
    if argv[0] == "top":
        return top(argv[1:])
    if argv[0] == "trace":
        from .trace import cli
        return cli.main(argv[1:])
    return _fail("unknown command %r: run, top or trace\n%s" % (argv[0], USAGE))


if __name__ == "__main__":
    sys.exit(main())

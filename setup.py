"""Build of the knndirect._core extension.

SIMD kernels are compiled per function with target attributes and chosen at
run time; no CPU-specific compiler flag is ever passed, so a wheel built here
runs on any CPU of its platform. The io_uring backend is compiled when
liburing's header and library are found (set KNNDIRECT_NO_URING=1 to build
without it); otherwise the build has the thread-pool backend. liburing.a is
linked in when it is position-independent, so the extension needs no
liburing.so at run time (see liburing_link)."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from glob import glob

import numpy
from setuptools import Extension, setup


def _compiler():
    """The C compiler command: $CC, else the one Python was built with, else cc."""
    for cc in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc"):
        if cc and cc.split() and shutil.which(cc.split()[0]):
            return cc
    return None


def _links(cc, args, shared=False):
    """True when a probe calling liburing compiles and links with args
    (into a shared object, as the extension is, when shared)."""
    src = ("#include <liburing.h>\n"
           "int kd_probe(void){struct io_uring r; int e = io_uring_queue_init(1,&r,0);\n"
           "  if (!e) io_uring_queue_exit(&r); return e;}\n"
           "int main(void){return kd_probe() < -1000;}\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.c")
        with open(path, "w") as f:
            f.write(src)
        out = os.path.join(tmp, "probe.so" if shared else "probe")
        # -z defs: a shared object may otherwise link with symbols missing.
        flags = ["-shared", "-fPIC", "-Wl,-z,defs"] if shared else []
        try:
            return subprocess.run(cc.split() + flags + [path, "-o", out] + args,
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0
        except OSError:
            return False


def _liburing_archive(cc):
    """liburing.a: $KNNDIRECT_LIBURING_A, else where the compiler finds it."""
    path = os.environ.get("KNNDIRECT_LIBURING_A")
    if path:
        return path if os.path.isfile(path) else None
    try:
        found = subprocess.run(cc.split() + ["-print-file-name=liburing.a"],
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return os.path.normpath(found) if os.path.isabs(found) and os.path.isfile(found) else None


def liburing_link():
    """How to link liburing: ("static", archive), ("shared", None), or None
    (no liburing: the build has the thread-pool backend only).

    Static linking is preferred, so that the extension (and a wheel) needs no
    liburing.so at run time: liburing.a is used when its objects link into a
    shared object (they must be position-independent). KNNDIRECT_URING_STATIC
    =0 links liburing.so instead; =1 requires liburing.a (the wheel builds)."""
    if os.environ.get("KNNDIRECT_NO_URING", "0") not in ("", "0"):
        return None
    mode = os.environ.get("KNNDIRECT_URING_STATIC", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        sys.exit(f"knndirect: KNNDIRECT_URING_STATIC must be auto, 0 or 1, got {mode!r}")
    cc = _compiler()
    archive = _liburing_archive(cc) if cc and mode != "0" else None
    if archive and _links(cc, [archive, "-Wl,--exclude-libs," + os.path.basename(archive)],
                          shared=True):
        return "static", archive
    if mode == "1":
        sys.exit("knndirect: KNNDIRECT_URING_STATIC=1 but no liburing.a that links into a "
                 "shared object was found (" + (f"{archive} did not link; is it built with "
                 "-fPIC?" if archive else "set KNNDIRECT_LIBURING_A=/path/to/liburing.a")
                 + ")")
    if cc and _links(cc, ["-luring"]):
        return "shared", None
    return None


sources = sorted(glob("csrc/*.c")) + sorted(glob("csrc/pyext/*.c"))
define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("_GNU_SOURCE", "1")]
libraries = ["pthread", "m"]
uring_objects, uring_link_args = [], []
uring = liburing_link() if sys.platform.startswith("linux") else None
if uring:
    define_macros.append(("KD_HAVE_LIBURING", "1"))
    if uring[0] == "static":
        # Linked in, its symbols kept out of the extension's exports.
        uring_objects.append(uring[1])
        uring_link_args.append("-Wl,--exclude-libs," + os.path.basename(uring[1]))
        print(f"knndirect: building with io_uring (liburing linked statically from "
              f"{uring[1]})", file=sys.stderr)
    else:
        libraries.append("uring")
        print("knndirect: building with io_uring (liburing.so linked; no usable liburing.a)",
              file=sys.stderr)
else:
    print("knndirect: building without io_uring (liburing not found or KNNDIRECT_NO_URING "
          "set); vector reads use the thread-pool backend", file=sys.stderr)


def common_cflags():
    """The language and warning flags shared with tests/c/Makefile: the lines
    of csrc/cflags.txt that start with '-'."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "csrc", "cflags.txt")) as f:
        return [line.split()[0] for line in f if line.startswith("-")]


extra_compile_args = common_cflags() + ["-O3", "-fvisibility=hidden"]
extra_link_args = []
if os.environ.get("KNNDIRECT_SANITIZE"):
    # e.g. KNNDIRECT_SANITIZE=address,undefined (run Python with the runtime
    # preloaded: LD_PRELOAD=$(gcc -print-file-name=libasan.so)); linking with
    # the flag too brings in the runtimes the preload does not (libubsan).
    # KNNDIRECT_SANITIZE_OPT picks the optimization level (default -O1).
    extra_compile_args += ["-fsanitize=" + os.environ["KNNDIRECT_SANITIZE"], "-g",
                           os.environ.get("KNNDIRECT_SANITIZE_OPT", "-O1"),
                           "-fno-omit-frame-pointer"]
    extra_link_args += ["-fsanitize=" + os.environ["KNNDIRECT_SANITIZE"]]

setup(
    ext_modules=[
        Extension(
            "knndirect._core",
            sources=sources,
            include_dirs=["csrc", numpy.get_include()],
            define_macros=define_macros,
            libraries=libraries,
            extra_compile_args=extra_compile_args,
            extra_objects=uring_objects,
            extra_link_args=extra_link_args + uring_link_args,
        )
    ]
)

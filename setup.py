"""Build of the knndirect._core extension.

SIMD kernels are compiled per function with target attributes and chosen at
run time; no CPU-specific compiler flag is ever passed, so a wheel built here
runs on any CPU of its platform. The io_uring backend is compiled when
liburing's header and library are found (set KNNDIRECT_NO_URING=1 to build
without it); otherwise the build has the thread-pool backend."""
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


def have_liburing():
    """True when liburing's header compiles and its library links. Any
    failure (no compiler, no header, no library) means False: the build
    then has the thread-pool backend only."""
    if os.environ.get("KNNDIRECT_NO_URING", "0") not in ("", "0"):
        return False
    cc = _compiler()
    if cc is None:
        return False
    src = "#include <liburing.h>\nint main(void){struct io_uring r; return io_uring_queue_init(1,&r,0) < -1000;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.c")
        with open(path, "w") as f:
            f.write(src)
        cmd = cc.split() + [path, "-o", os.path.join(tmp, "probe"), "-luring"]
        try:
            return subprocess.run(cmd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0
        except OSError:
            return False


sources = sorted(glob("csrc/*.c")) + sorted(glob("csrc/pyext/*.c"))
define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("_GNU_SOURCE", "1")]
libraries = ["pthread", "m"]
if sys.platform.startswith("linux") and have_liburing():
    define_macros.append(("KD_HAVE_LIBURING", "1"))
    libraries.append("uring")
    print("knndirect: building with io_uring (liburing found)", file=sys.stderr)
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
            extra_link_args=extra_link_args,
        )
    ]
)

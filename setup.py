"""Build of the knndirect._core extension.

SIMD kernels are compiled per function with target attributes and chosen at
run time, so no -march flag is ever passed. The io_uring backend is compiled
when liburing's header and library are found (set KNNDIRECT_NO_URING=1 to
build without it)."""
import os
import shutil
import subprocess
import sys
import tempfile
from glob import glob

import numpy
from setuptools import Extension, setup


def have_liburing():
    if os.environ.get("KNNDIRECT_NO_URING", "0") not in ("", "0"):
        return False
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc.split()[0]) is None:
        return False
    src = "#include <liburing.h>\nint main(void){struct io_uring r; return io_uring_queue_init(1,&r,0) < -1000;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.c")
        with open(path, "w") as f:
            f.write(src)
        cmd = cc.split() + [path, "-o", os.path.join(tmp, "probe"), "-luring"]
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


sources = sorted(glob("csrc/*.c")) + sorted(glob("csrc/pyext/*.c"))
define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("_GNU_SOURCE", "1")]
libraries = ["pthread", "m"]
if sys.platform.startswith("linux") and have_liburing():
    define_macros.append(("KD_HAVE_LIBURING", "1"))
    libraries.append("uring")

extra_compile_args = ["-std=c11", "-O3", "-fno-strict-aliasing", "-fvisibility=hidden",
                      "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
                      "-Wno-cast-function-type"]
if os.environ.get("KNNDIRECT_SANITIZE"):
    extra_compile_args += ["-fsanitize=" + os.environ["KNNDIRECT_SANITIZE"], "-g", "-O1",
                           "-fno-omit-frame-pointer"]

setup(
    ext_modules=[
        Extension(
            "knndirect._core",
            sources=sources,
            include_dirs=["csrc", numpy.get_include()],
            define_macros=define_macros,
            libraries=libraries,
            extra_compile_args=extra_compile_args,
        )
    ]
)

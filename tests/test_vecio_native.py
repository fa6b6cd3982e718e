"""Runs the C test of the batch reader (tests/c/test_vecio.c): every backend
and record layout, the ramfs fallback, io_uring blocked by seccomp, short
reads. It needs a C compiler; it skips, saying why, without one."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ([os.path.join(ROOT, "csrc", "common.c")]
           + sorted(glob.glob(os.path.join(ROOT, "csrc", "vecio*.c")))
           + [os.path.join(ROOT, "tests", "c", "test_vecio.c")])


def _build(tmp_path, with_uring):
    if not all(os.path.exists(p) for p in SOURCES):
        pytest.skip("the C sources are not beside the tests (installed-package run)")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build tests/c/test_vecio.c")
    exe = str(tmp_path / ("test_vecio_uring" if with_uring else "test_vecio"))
    cmd = [cc, "-O1", "-g", "-std=c11", "-Wall", "-Wextra", "-Werror",
           "-I" + os.path.join(ROOT, "csrc")] + SOURCES + ["-lpthread", "-ldl", "-o", exe]
    if with_uring:
        cmd[1:1] = ["-DKD_HAVE_LIBURING"]
        cmd.insert(-2, "-luring")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and with_uring and "liburing" in r.stderr:
        pytest.skip("liburing headers are not installed")
    assert r.returncode == 0, r.stderr
    return exe


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only I/O paths")
@pytest.mark.parametrize("with_uring", [True, False], ids=["io_uring", "no_io_uring"])
def test_vecio_native(tmp_path, with_uring):
    exe = _build(tmp_path, with_uring)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert r.returncode == 0 and summary.endswith(" 0 failed"), r.stdout[-4000:] + r.stderr[-2000:]

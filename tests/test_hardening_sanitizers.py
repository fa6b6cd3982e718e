"""The C core under the sanitizers, through tests/c/stress_index.c:

- AddressSanitizer + LeakSanitizer + UBSan: six threads searching while one
  adds, removes and saves (in memory, then an opened file on every I/O
  backend); open/close and load/free cycles, failing reads and saves, damaged
  files (every error path frees what it took); batch, range and streamed
  reads of records beyond 2^31 rows and 4 GiB of offset on a sparse file.
- ThreadSanitizer: the threaded part.

Each skips, saying why, without gcc, liburing's header or the sanitizer
runtime. .ci/run runs the same targets (make -C tests/c stress-asan
stress-tsan) and the whole pytest suite against an ASan/UBSan build of the
extension; there these wrappers step aside (KNNDIRECT_SANITIZER_RUN)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CDIR = os.path.join(ROOT, "tests", "c")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("KNNDIRECT_SANITIZER_RUN")),
    reason="the sanitizer stage of .ci/run runs these targets itself")


def _probe(tmp_path, flag):
    """Whether gcc can build and run a program with `flag` and liburing."""
    src = tmp_path / "probe.c"
    src.write_text("#include <liburing.h>\nint main(void){return 0;}\n")
    exe = tmp_path / "probe"
    r = subprocess.run(["gcc", flag, str(src), "-luring", "-o", str(exe)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "build failed"
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    return None if r.returncode == 0 else "probe failed: " + r.stderr[-300:]


def _run(tmp_path, target, flag):
    if not (os.path.exists(os.path.join(CDIR, "stress_index.c"))
            and os.path.isdir(os.path.join(ROOT, "csrc"))):
        pytest.skip("the C sources are not beside the tests (installed-package run)")
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("gcc and make are needed to build tests/c/stress_index.c")
    why = _probe(tmp_path, flag)
    if why:
        pytest.skip("cannot build with %s and liburing: %s" % (flag, why))
    r = subprocess.run(["make", "-s", "-C", CDIR, target, "BIN=" + str(tmp_path),
                        "TMPDIR=" + str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "0 failed" in r.stdout, out[-6000:]
    for word in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                 "WARNING: ThreadSanitizer"):
        assert word not in out, out[-6000:]


def test_core_under_asan_lsan_ubsan(tmp_path):
    _run(tmp_path, "stress-asan", "-fsanitize=address,undefined")


def test_core_under_tsan(tmp_path):
    _run(tmp_path, "stress-tsan", "-fsanitize=thread")

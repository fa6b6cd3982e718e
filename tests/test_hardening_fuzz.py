"""The container parser under libFuzzer (tests/fuzz/fuzz_container.c):
header, footer, section table, metadata, graph and ids, through
kd_container_parse, kd_index_load (memory and piecewise readers) and
kd_index_open; what is accepted is then searched, read, verified, saved and
loaded back.

With clang: the committed corpus (tests/fuzz/corpus) is replayed, then a
short fuzz run (KNNDIRECT_FUZZ_SECONDS, default 10; .ci/run fuzzes 60 s).
Without clang the libFuzzer test skips, saying so, and the corpus is
replayed through a plain gcc + ASan build of the harness instead."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "tests", "fuzz")
CORPUS = os.path.join(FUZZ, "corpus")

pytestmark = [
    pytest.mark.skipif(not os.path.exists(os.path.join(FUZZ, "fuzz_container.c"))
                       or not os.path.isdir(os.path.join(ROOT, "csrc")),
                       reason="the fuzz harness or the C core is not beside the tests "
                              "(installed-package run)"),
    pytest.mark.skipif(bool(os.environ.get("KNNDIRECT_SANITIZER_RUN")),
                       reason="the fuzz stage of .ci/run runs the harness itself"),
]


def test_corpus_is_small_and_present():
    files = os.listdir(CORPUS)
    assert len(files) >= 10
    total = sum(os.path.getsize(os.path.join(CORPUS, f)) for f in files)
    assert total < 100 * 1024, "the committed corpus should stay small (%d bytes)" % total


def test_corpus_replays_cleanly_with_gcc(tmp_path):
    """Without clang: every committed input, through a gcc build of the
    harness with ASan and UBSan."""
    if shutil.which("clang") is not None:
        pytest.skip("clang is here: the libFuzzer run replays the corpus")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    exe = str(tmp_path / "replay")
    csrc = os.path.join(ROOT, "csrc")
    sources = sorted(os.path.join(csrc, f) for f in os.listdir(csrc) if f.endswith(".c"))
    r = subprocess.run(["gcc", "-O1", "-g", "-std=c11", "-D_GNU_SOURCE", "-DKD_FUZZ_STANDALONE",
                        "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                        "-I" + csrc] + sources + [os.path.join(FUZZ, "fuzz_container.c"),
                                                  "-lpthread", "-lm", "-o", exe],
                       capture_output=True, text=True)
    if r.returncode != 0 and "asan" in r.stderr.lower():
        pytest.skip("gcc cannot link AddressSanitizer here")
    assert r.returncode == 0, r.stderr[-3000:]
    files = sorted(os.path.join(CORPUS, f) for f in os.listdir(CORPUS))
    env = dict(os.environ, ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    r = subprocess.run([exe] + files, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "replayed %d inputs" % len(files) in r.stdout, \
        (r.stdout + r.stderr)[-4000:]


def test_libfuzzer_short_run(tmp_path):
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (apt-get install clang): the libFuzzer run needs it")
    secs = os.environ.get("KNNDIRECT_FUZZ_SECONDS", "10")
    env = dict(os.environ, KD_FUZZ_OUT=str(tmp_path))
    r = subprocess.run([os.path.join(FUZZ, "run.sh"), secs], capture_output=True, text=True,
                       env=env, timeout=900)
    out = r.stdout + r.stderr
    if r.returncode != 0 and "fsanitize=fuzzer" in out and "error" in out and \
            not (tmp_path / "fuzz_container").exists():
        pytest.skip("this clang cannot build with -fsanitize=fuzzer: " + out[-500:])
    assert r.returncode == 0, out[-6000:]
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-",
                                                                        "timeout-", "oom-"))]
    assert not crashes, crashes

"""Runs the C test of the 1-bit estimators and the distance kernels
(tests/c/test_quant.c): every estimator variant this CPU has returns estimates
bit-identical to the scalar reference, which tracks the true distances, and
every kernel variant (AVX2, AVX-512) agrees with the scalar kernels; the
estimator searches use (`kd.features()["estimate"]`) is among those checked, and
so is the refined codes' one (`kd.features()["refine"]`).
It needs a C compiler; it skips, saying why, without one."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "csrc", f) for f in ("common.c", "distance.c", "quant.c")] + [
    os.path.join(ROOT, "tests", "c", "test_quant.c")]


def test_estimators_match_scalar_reference(tmp_path):
    if not all(os.path.exists(p) for p in SOURCES):
        pytest.skip("the C sources are not beside the tests (installed-package run)")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build tests/c/test_quant.c")
    exe = str(tmp_path / "test_quant")
    r = subprocess.run([cc, "-O2", "-g", "-std=c11", "-Wall", "-Wextra", "-Werror",
                        "-I" + os.path.join(ROOT, "csrc")] + SOURCES
                       + ["-lpthread", "-lm", "-o", exe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines and lines[-1].endswith(" 0 failed"), r.stdout + r.stderr
    # What ran: a variant the CPU lacks is reported, not silently passed, and
    # every kernel variant that kd.features() reports ran.
    for line in lines[:-1]:
        assert line.startswith(("skip ", "ran ")), line
    import knndirect as kd
    feats = kd.features()
    for name in ("avx2", "avx512"):
        ran = f"ran {name} kernels:" in r.stdout
        assert ran == bool(feats[name]), (name, feats, r.stdout)
    # The 1-bit estimator searches use is one of those checked here.
    checked = {"scalar"} | {name for name in ("popcnt", "avx2", "avx512")
                            if f"skip {name}: " not in r.stdout}
    assert feats["estimate"] in checked, (feats, r.stdout)
    # So is the refined codes' estimator.
    checked = {"scalar"} | {name for name in ("avx2", "avx512")
                            if f"skip refined {name}: " not in r.stdout}
    assert feats["refine"] in checked, (feats, r.stdout)

"""`python -m knndirect doctor [PATH]`: the backend it names is the one
kd.open picks on PATH's filesystem, the SIMD level is kd.features()'s, the
alignment is the one an index opened there reports, tmpfs is reported as an
O_DIRECT fallback, the reasons for a missing io_uring are told apart, and a
short probe finishes in seconds leaving nothing behind."""
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import knndirect as kd
from knndirect import _doctor

SHORT = ("--probe-seconds", "0.2", "--probe-mib", "2")


def run(*args, env=None, timeout=120, check=True):
    full = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    p = subprocess.run([sys.executable, "-m", "knndirect", "doctor", *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, env=full, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def opened_info(directory, **kw):
    """info() of a small index saved in directory and opened as doctor does."""
    index = kd.Index(16, "l2", m=4, ef_construction=8)
    index.add(np.random.default_rng(0).standard_normal((64, 16), dtype=np.float32))
    path = os.path.join(directory, "small.kdx")
    index.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with kd.open(path, io_backend="auto", **kw) as opened:
            return opened.info()


def opened_info_shm():
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        return opened_info(d)


def test_json_report_matches_open_and_features(tmp_path):
    t0 = time.perf_counter()
    p = run(tmp_path, "--json", *SHORT)
    elapsed = time.perf_counter() - t0
    report = json.loads(p.stdout)
    info = opened_info(tmp_path)
    assert report["backend"] == info["io_backend"]
    assert report["direct_io"] == info["direct_io"]
    assert report["alignment"] == info["alignment"]
    assert report["fallbacks"] == info["fallbacks"]
    assert report["record_size"] == 4096
    assert report["simd"] == kd.features()["simd"]
    # The 1-bit estimator is timed once a process; on a near tie between two
    # variants the doctor's process may pick the other, and all give the
    # same estimates. Every other feature is fixed.
    here = json.loads(json.dumps(kd.features()))
    there = dict(report["features"])
    variants = {"scalar", "popcnt"} | {v for v in ("avx2", "avx512") if here[v]}
    assert there.pop("estimate") in variants and here.pop("estimate") in variants
    assert there == here
    assert report["io_uring"]["compiled"] == kd.features()["io_uring"]
    assert report["backend_reason"] and report["direct_io_reason"]
    probe = report["probe"]
    assert probe["qd1_reads"] > 0 and probe["qd1_p50_us"] > 0
    assert probe["batch_depth"] == 32 and probe["batch_reads"] >= 32 and probe["batch_iops"] > 0
    # One read per 4 KiB record (O_DIRECT rounds it up to the alignment;
    # buffered reads are the record).
    assert probe["bytes_per_read"] == (max(4096, report["alignment"]) if report["direct_io"]
                                       else 4096)
    # A process start, a 2 MiB index and 0.2 s of probe: seconds, even on a
    # loaded machine.
    assert elapsed < 30, elapsed
    # The temporary index is gone.
    assert sorted(os.listdir(tmp_path)) == ["small.kdx"]


def test_text_report_names_backend_simd_and_alignment(tmp_path):
    out = run(tmp_path, *SHORT).stdout
    info = opened_info(tmp_path)
    assert f"backend       {info['io_backend']} " in out
    assert f"SIMD          {kd.features()['simd']} " in out
    if info["direct_io"]:
        assert f"alignment {info['alignment']} B" in out
        assert "O_DIRECT reads" in out
    assert "QD1" in out and "IOPS" in out
    assert "why" in out


def test_io_uring_reason_agrees_with_the_syscall(tmp_path):
    report = _doctor.diagnose(tmp_path, probe=False)
    setup = report["io_uring"]["setup"]
    if report["backend"] == "io_uring":
        assert setup["ok"] is True
        assert "io_uring_setup works" in report["backend_reason"]
    elif not kd.features()["io_uring"]:
        assert "compiled without liburing" in report["backend_reason"]
    assert report["probe"] is None and report["probe_skipped"]


@pytest.mark.skipif(not kd.features()["io_uring"], reason="this build has no io_uring")
def test_disabled_io_uring_is_reported(tmp_path):
    report = json.loads(run(tmp_path, "--json", "--probe-seconds", "0",
                            env={"KNNDIRECT_DISABLE_IO_URING": "1"}).stdout)
    assert report["backend"] == "threads"
    assert "no_io_uring" in report["fallbacks"]
    assert "KNNDIRECT_DISABLE_IO_URING" in report["backend_reason"]


def test_tmpfs_reports_the_o_direct_fallback():
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    if _doctor.filesystem_of(shm)["fstype"] != "tmpfs":
        pytest.skip("/dev/shm is not tmpfs here")
    before = set(os.listdir(shm))
    p = run(shm, *SHORT)
    assert "direct I/O    no" in p.stdout
    assert "O_DIRECT fell back" in p.stdout and "tmpfs" in p.stdout
    assert "no_direct_io" in p.stdout
    report = json.loads(run(shm, "--json", "--probe-seconds", "0").stdout)
    assert report["direct_io"] is False and "no_direct_io" in report["fallbacks"]
    assert report["backend"] == opened_info_shm()["io_backend"]
    assert not {n for n in set(os.listdir(shm)) - before if n.startswith(".knndirect-doctor-")}


def test_index_path_is_opened_and_reported(tmp_path):
    info = opened_info(tmp_path)
    report = json.loads(run(tmp_path / "small.kdx", "--json", "--probe-seconds", "0").stdout)
    ix = report["index"]
    assert ix["alignment"] == info["alignment"] and ix["io_backend"] == info["io_backend"]
    assert ix["count"] == 64 and ix["dim"] == 16
    assert report["directory"] == str(tmp_path)
    assert "PATH index    64 x 16" in run(tmp_path / "small.kdx", "--probe-seconds", "0").stdout


def test_missing_path_is_an_error(tmp_path):
    p = run(tmp_path / "nope", check=False)
    assert p.returncode == 1
    assert "does not exist" in p.stderr and "Traceback" not in p.stderr


def test_unwritable_directory_skips_the_probe(tmp_path, monkeypatch):
    def refuse(*a, **kw):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(_doctor.tempfile, "mkdtemp", refuse)
    report = _doctor.diagnose(tmp_path, probe_seconds=0.1)
    assert report["probe"] is None and "cannot write" in report["probe_skipped"]
    assert "skipped: cannot write" in _doctor.format_report(report)


@pytest.mark.parametrize("setup,sysctl,expect", [
    ({"ok": False, "errno": 1, "error": "EPERM"}, 0, "seccomp"),
    ({"ok": False, "errno": 1, "error": "EPERM"}, 2, "io_uring_disabled = 2"),
    ({"ok": False, "errno": 1, "error": "EPERM"}, 1, "io_uring_disabled = 1"),
    ({"ok": False, "errno": 38, "error": "ENOSYS"}, None, "older than 5.1"),
    ({"ok": False, "errno": 12, "error": "ENOMEM"}, 0, "RLIMIT_MEMLOCK"),
])
def test_backend_reasons(setup, sysctl, expect, monkeypatch):
    monkeypatch.delenv("KNNDIRECT_DISABLE_IO_URING", raising=False)
    why = _doctor._backend_reason("threads", True, dict(setup, sysctl=sysctl))
    assert expect in why and "thread pool" in why
    assert "compiled without liburing" in _doctor._backend_reason(
        "threads", False, dict(setup, sysctl=sysctl))


def test_doctor_imports_nothing_optional():
    code = ("import sys, knndirect._doctor; "
            "bad = [m for m in ('h5py', 'tqdm', 'pytest', 'hypothesis', 'nbformat', "
            "'matplotlib') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

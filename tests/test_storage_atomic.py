"""Saving to a path never leaves a torn index: a full disk (ENOSPC on a tiny
tmpfs) or a process killed mid-save leaves the index already at the target
untouched and openable. A killed process cannot remove its temporary file
(PATH.tmp-PID-N); such a leftover never disturbs open or load."""
import errno
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import knndirect as kd
from conftest import assert_same_results, build, open_quiet, split


def _old_index(path):
    base, queries = split(300, 5, 32, seed=9300)
    idx = build(base, "l2", m=6, ef_construction=40)
    idx.save(path)
    expected = idx.search(queries, 5)
    idx.close()
    return queries, expected


def _check_old(path, queries, expected):
    for opener in (kd.load, lambda p: open_quiet(p, "threads")):
        got = opener(path)
        assert len(got) == 300
        assert_same_results(got.search(queries, 5), expected)
        assert got.verify() is True
        got.close()


@pytest.fixture
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % (r.stderr.strip() or r.returncode))
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_enospc_leaves_the_old_index(tiny_fs):
    target = tiny_fs / "index.kdx"
    queries, expected = _old_index(target)
    before = target.read_bytes()
    rng = np.random.default_rng(9301)
    big = kd.Index(256, "l2", m=4, ef_construction=16)
    big.add(rng.standard_normal((4000, 256), dtype=np.float32))   # ~4.5 MB file
    for attempt in (lambda: big.save(target), lambda: big.save(str(target))):
        with pytest.raises(OSError) as ei:
            attempt()
        assert ei.value.errno == errno.ENOSPC, ei.value
        assert "index.kdx" in str(ei.value)
        assert sorted(os.listdir(tiny_fs)) == ["index.kdx"], "a temporary file was left"
        assert target.read_bytes() == before
        _check_old(target, queries, expected)
    big.close()


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import knndirect as kd
    x = np.random.default_rng(9302).standard_normal((12, 1 << 19), dtype=np.float32)
    index = kd.Index(1 << 19, "l2", m=4, ef_construction=8)
    index.add(x)
    print("built", flush=True)
    index.save(sys.argv[1])
    print("saved", flush=True)
""")


def _kill_mid_save(target):
    """Start a child saving a ~34 MB index over target; SIGKILL it as soon as
    its temporary file appears. Returns the leftover temporary files."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target)],
                             stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"built"
        pattern = str(target) + ".tmp-*"
        deadline = time.monotonic() + 60
        while not glob.glob(pattern):
            assert child.poll() is None, "the child ended before saving"
            assert time.monotonic() < deadline, "no temporary file appeared"
            time.sleep(0.0005)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    return glob.glob(str(target) + ".tmp-*")


def test_killed_mid_save_leaves_the_old_index(tmp_path):
    target = tmp_path / "index.kdx"
    queries, expected = _old_index(target)
    killed_mid_write = 0
    for _ in range(3):
        leftovers = _kill_mid_save(target)
        got = kd.load(target)
        if len(got) == 300:
            # The rename had not happened: the old index, intact.
            got.close()
            _check_old(target, queries, expected)
            assert leftovers, "a killed save leaves its temporary file behind"
            killed_mid_write += 1
        else:
            # The rename had happened just before the kill: the new index, whole.
            assert len(got) == 12 and got.dim == 1 << 19
            got.close()
            target.unlink()
            _old_index(target)
        # Leftovers never disturb the index, and can simply be removed.
        o = open_quiet(target, "threads")
        o.close()
        for p in leftovers:
            os.unlink(p)
        if killed_mid_write:
            break
    assert killed_mid_write, "the child was never caught mid-save"
    assert sorted(os.listdir(tmp_path)) == ["index.kdx"]


def test_failed_save_into_missing_directory(tmp_path):
    idx = build(split(50, 1, 8, seed=9303)[0], "l2")
    with pytest.raises(FileNotFoundError):
        idx.save(tmp_path / "missing" / "x.kdx")
    assert os.listdir(tmp_path) == []
    with pytest.raises(IsADirectoryError):
        idx.save(tmp_path)
    idx.close()

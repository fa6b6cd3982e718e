"""A collection survives crashes and full disks at its last commit.

kill -9: a child process (collection_child.py writer) adds, removes, upserts,
commits and merges in a loop, and reports each commit (generation and a
digest of the committed ids and vectors) with fsync before going on; it
writes an "intent" line with the digest of the next commit first. The test
kills it at random moments, then a reader must hold exactly the last
reported commit (or the intended one, when the kill came after the manifest
rename and before the report), and a writable open must leave the directory
holding nothing but LOCK, the newest manifest and the files it names.

ENOSPC: the fault hook (knndirect._core._inject_fault) makes the writes of a
save fail, in a commit's flush, in a flush inside add, and in merges; and a
real 4 MiB tmpfs fills up. The disk stays at the last commit, and the writer
keeps its pending changes for a later commit.
"""
import errno
import gc
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import knndirect as kd
from knndirect import _core

import collection_child as child

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collection_child.py")
DIM = child.DIM


# -- helpers --------------------------------------------------------------------

def create(path, merges):
    kd.Collection.create(path, DIM, m=8, ef_construction=32, memory_budget=child.BUDGET,
                         merge_policy="tiered" if merges else None).close()


def open_reader(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # tmpfs: no O_DIRECT
        return kd.Collection.open(path)


def state(col):
    """(generation, digest, count) of what col holds."""
    dig, count = child.collection_digest(col)
    return col.generation, dig, count


def disk_state(path):
    """state() of a reader opened on path now."""
    reader = open_reader(path)
    try:
        return state(reader)
    finally:
        reader.close()


def clean_and_check(path, was=None):
    """A writable open removes orphans; the commit itself is untouched."""
    if was is None:
        was = disk_state(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kd.Collection.open(path, writable=True).close()
    child.assert_only_committed_files(path)
    assert disk_state(path) == was, "a writable open changed the commit"


def read_report(report):
    """The last commit (gen, digest, count), the intent after it (lo, hi,
    digest, count) or None, and counts: commits and merges the children
    reported, merges they started."""
    last, intent = None, None
    done = {"commit": 0, "merged": 0, "noted": 0, "merge_intents": 0}
    with open(report) as f:
        for line in f:
            parts = line.split()
            if not line.endswith("\n"):
                break   # torn by the kill (the child fsyncs whole lines)
            if parts[0] in done:   # noted: written by the test after a kill
                last = (int(parts[1]), parts[2], int(parts[3]))
                intent = None
                done[parts[0]] += 1
            elif parts[0] == "intent":
                intent = (int(parts[1]), int(parts[2]), parts[3], int(parts[4]))
                done["merge_intents"] += intent[1] > intent[0]
    return last, intent, done


def check_after_kill(path, report, stats):
    (gen, dig, count), intent, _ = read_report(report)
    col = open_reader(path)
    got_gen, got_dig, got_count = state(col)
    assert col.verify() is True
    col.close()
    if got_gen == gen:
        want = (dig, count)
    else:
        assert intent is not None and intent[0] <= got_gen <= intent[1] and got_gen > gen, (
            f"the collection is at generation {got_gen}; the child last reported commit "
            f"{gen} and intended {intent}")
        want = (intent[2], intent[3])
        stats["renamed_unreported"] += 1
    if intent is not None:
        stats["killed_in_commit"] += 1
        stats["killed_in_merge"] += intent[1] > intent[0]
    assert (got_dig, got_count) == want, (
        f"generation {got_gen} holds {got_count} live ids that differ from the committed "
        f"state ({want[1]} ids): a lost commit, a half-applied change or a removed id back")
    if got_gen != gen:
        # The commit the child could not report is the next child's base.
        child.append_line(report, f"noted {got_gen} {got_dig} {got_count}")
    clean_and_check(path, (got_gen, got_dig, got_count))


def run_and_kill(path, report, seed, merges, delay, errlog):
    """Start a writer child, let it run `delay` seconds after it is ready,
    SIGKILL it."""
    args = [sys.executable, CHILD, "writer", path, report, str(seed)]
    if merges:
        args.append("--merges")
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err)
        try:
            ready = proc.stdout.readline()
            if ready.strip() == b"ready":
                time.sleep(delay)
            alive = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    if ready.strip() != b"ready" or not alive:
        with open(errlog, errors="replace") as f:
            pytest.fail(f"the writer child failed on its own (seed {seed}):\n{f.read()[-4000:]}")


# -- kill -9 --------------------------------------------------------------------

def _kill_loop(tmp_path, merges, kills, seed):
    rng = np.random.default_rng(seed)
    stats = {"kills": 0, "killed_in_commit": 0, "killed_in_merge": 0, "renamed_unreported": 0,
             "commits": 0, "merges": 0}
    per_dir = 10 if merges else 5
    for start in range(0, kills, per_dir):
        # A fresh collection now and then bounds its size (and, without
        # merges, its number of segments).
        path = str(tmp_path / f"col{start}")
        report = str(tmp_path / f"report{start}")
        create(path, merges)
        child.append_line(report, f"commit 0 {child.empty_digest()} 0")
        for _ in range(min(per_dir, kills - start)):
            run_and_kill(path, report, int(rng.integers(1 << 30)), merges,
                         float(rng.uniform(0.0, 0.4)), str(tmp_path / "stderr"))
            stats["kills"] += 1
            check_after_kill(path, report, stats)
        done = read_report(report)[2]
        stats["commits"] += done["commit"] - 1 + done["merged"]
        stats["merges"] += done["merge_intents"]
    print(f"merges={merges}: {stats}")
    assert stats["commits"] >= stats["kills"] // 3, f"the children hardly committed: {stats}"
    assert (stats["merges"] > 0) == merges, stats
    assert stats["killed_in_commit"] > 0, f"no kill landed between intent and report: {stats}"
    return stats


@pytest.mark.parametrize("merges,kills", [
    pytest.param(True, 30, id="merges"),
    pytest.param(False, 20, id="no-merges"),
    pytest.param(True, 300, id="merges-long", marks=pytest.mark.slow),
    pytest.param(False, 150, id="no-merges-long", marks=pytest.mark.slow),
])
def test_kill9_leaves_the_last_commit(tmp_path, merges, kills):
    """merges: the child also calls merge(max_segments=1..3) and the tiered
    background policy runs; no-merges runs without _core.merge."""
    _kill_loop(tmp_path, merges, kills, seed=7100 + kills + merges)


# -- ENOSPC from the fault hook ---------------------------------------------------

@pytest.fixture
def faults():
    _core._inject_fault("none")
    yield
    _core._inject_fault("none")


def _arm_enospc(after=0):
    _core._inject_fault("enospc", after=after, count=-1)


def _disarm():
    """Clears the fault; returns how many writes it failed."""
    return _core._inject_fault("none")[0]


def _vectors(rng, n):
    return rng.standard_normal((n, DIM)).astype(np.float32)


def _writer_state(col):
    return child.collection_digest(col)


@pytest.mark.parametrize("first,after", [(True, 0), (True, 1), (False, 0)],
                         ids=["first-commit-segment", "first-commit-quantizer",
                              "later-commit-segment"])
def test_enospc_in_commit_keeps_last_commit(tmp_path, faults, first, after):
    """first: the first commit writes a segment and the quantizer (after=1
    fails the quantizer after the segment was written); later: a commit
    with removes, upserts and a buffer to flush."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7200 + after + 2 * first)
    col = kd.Collection.create(path, DIM, m=8, ef_construction=32,
                               memory_budget=child.BUDGET, merge_policy=None)
    if not first:
        col.add(_vectors(rng, 1500))      # one flush inside add, one at commit
        col.commit()
        col.remove(rng.choice(1500, 100, replace=False))
        col.add(_vectors(rng, 20), rng.choice(col.ids(), 20, replace=False), upsert=True)
    col.add(_vectors(rng, 300), np.arange(5000, 5300))
    committed = disk_state(path)
    pending = _writer_state(col)
    for attempt in range(2):   # and again while the disk stays full
        _arm_enospc(after if attempt == 0 else 0)
        with pytest.raises(OSError) as ei:
            col.commit()
        assert _disarm() >= 1
        assert ei.value.errno == errno.ENOSPC, ei.value
        reader = open_reader(path)
        assert state(reader) == committed, "a failed commit changed the disk"
        reader.close()
        assert col.generation == committed[0]
        assert col.info()["pending"] is True
        assert _writer_state(col) == pending, "the writer lost its pending changes"
    gen = col.commit()
    assert gen == committed[0] + 1
    reader = open_reader(path)
    assert state(reader) == (gen,) + pending
    reader.close()
    col.close()
    clean_and_check(path)


def test_enospc_in_flush_inside_add(tmp_path, faults):
    """A full buffer is flushed inside add; when that save fails, add raises
    ENOSPC, the disk is at the last commit, and what the writer holds then
    (the commit plus a part of the batch, as added) is what the next commit
    writes."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7210)
    col = kd.Collection.create(path, DIM, m=8, ef_construction=32,
                               memory_budget=child.BUDGET, merge_policy=None)
    col.add(_vectors(rng, 700))
    col.commit()
    committed = disk_state(path)
    old_ids = col.ids()
    x, ids = _vectors(rng, 1500), np.arange(10000, 11500)
    _arm_enospc()
    with pytest.raises(OSError) as ei:
        col.add(x, ids)
    assert _disarm() >= 1
    assert ei.value.errno == errno.ENOSPC, ei.value
    assert disk_state(path) == committed
    held = col.ids()
    assert np.isin(old_ids, held).all(), "committed ids vanished from the writer"
    new = np.setdiff1d(held, old_ids)
    assert np.isin(new, ids).all()
    np.testing.assert_array_equal(col.get_vectors(new), x[new - 10000])
    pending = _writer_state(col)
    gen = col.commit()
    assert disk_state(path) == (gen,) + pending
    col.close()
    clean_and_check(path)


def _three_segments(path, rng, merge_policy=None):
    col = kd.Collection.create(path, DIM, m=8, ef_construction=32,
                               memory_budget=child.BUDGET, merge_policy=merge_policy)
    for b in range(3):
        col.add(_vectors(rng, 600), np.arange(b * 1000, b * 1000 + 600))
        col.commit()
    col.remove(np.concatenate([np.arange(0, 300, 3), np.arange(1000, 1040)]))
    col.commit()
    assert len(col.segments()) == 3
    return col


def test_enospc_in_merge_keeps_last_commit(tmp_path, faults):
    path = str(tmp_path / "col")
    col = _three_segments(path, np.random.default_rng(7220))
    _, dig, count = disk_state(path)
    _arm_enospc()
    with pytest.raises(OSError) as ei:
        col.merge(max_segments=1)
    fired = _disarm()
    assert ei.value.errno == errno.ENOSPC, ei.value
    assert fired >= 1
    del ei       # its traceback holds the merge's inputs (handles keep files)
    gc.collect()
    reader = open_reader(path)
    assert state(reader)[1:] == (dig, count)
    assert len(reader.segments()) == 3
    reader.close()
    assert _writer_state(col) == (dig, count)
    assert len(col.segments()) == 3
    col.close()
    clean_and_check(path)      # no output of the failed merge is left
    # The same merge, with room on the disk.
    col = kd.Collection.open(path, writable=True)
    assert col.info()["pending"] is False
    gen = col.merge(max_segments=1)
    col.close()
    reader = open_reader(path)
    assert state(reader) == (gen, dig, count)
    assert len(reader.segments()) == 1
    reader.close()
    clean_and_check(path)


def test_enospc_in_background_merge(tmp_path, faults):
    """The tiered policy rewrites a segment with 40% of it removed, in the
    background after a commit; that merge hits ENOSPC. The commit is
    intact, the next commit warns that the merge was dropped and succeeds,
    and a later merge succeeds."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7230)
    col = _three_segments(path, rng, merge_policy="tiered")
    # Let any merge planned so far finish with room on the disk.
    col.merge(max_segments=3)
    seg = col.segments()[0]
    victims = rng.choice(col.ids()[col.ids() < 1000], int(seg["live"] * 0.4), replace=False)
    col.remove(victims)
    _arm_enospc()
    gen = col.commit()          # tombstones and manifest only: no save
    deadline = time.monotonic() + 60
    while col.info()["merging"]:
        assert time.monotonic() < deadline, "the background merge never ended"
        time.sleep(0.01)
    fired = _disarm()
    if not fired:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            col.commit()
        pytest.fail("the background merge never wrote; warnings of the next commit: "
                    f"{[str(w.message) for w in caught]}")
    committed = disk_state(path)
    assert committed[0] == gen
    assert _writer_state(col) == committed[1:]
    with pytest.warns(RuntimeWarning, match="merge"):
        gen2 = col.commit()
    assert disk_state(path) == (gen2,) + committed[1:]
    gen3 = col.merge(max_segments=1)
    assert disk_state(path) == (gen3,) + committed[1:]
    col.close()
    clean_and_check(path)


# -- a real full disk ------------------------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs (root only); always unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % (r.stderr.strip() or r.returncode))
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_full_tmpfs_keeps_last_commit(small_fs):
    """Add, remove and commit on a 4 MiB tmpfs until a commit (or a flush
    inside add) fails with ENOSPC: a reader holds exactly the last commit,
    and a writable open afterwards leaves only that commit's files."""
    path = str(small_fs / "col")
    rng = np.random.default_rng(7240)
    col = kd.Collection.create(path, DIM, m=8, ef_construction=32,
                               memory_budget=child.BUDGET, merge_policy=None)
    committed = disk_state(path)
    next_id = 0
    for _ in range(200):
        try:
            col.add(_vectors(rng, 700), np.arange(next_id, next_id + 700))
            next_id += 700
            ids = col.ids()
            col.remove(rng.choice(ids, 50, replace=False))
            gen = col.commit()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            break
        committed = (gen,) + _writer_state(col)
    else:
        pytest.fail("the 4 MiB tmpfs never filled up")
    assert committed[0] >= 2, "the disk filled before two commits"
    reader = open_reader(path)
    assert state(reader) == committed
    reader.close()
    col.close()        # warns: uncommitted changes are dropped
    clean_and_check(path)

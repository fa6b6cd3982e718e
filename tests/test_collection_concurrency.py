"""One writer, many readers: readers in other processes and threads of this
process search while the writer adds, removes, commits and merges; a second
writer is refused; files of replaced segments stay on disk while a handle of
this process still needs them, and go when none does. Three races are also
played out in a fixed order: a refresh while the writer commits, a rollback
while a search holds a flushed segment, and merge() next to a background
merge that its own commit planned."""
import gc
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import knndirect as kd

import collection_child as child

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collection_child.py")
DIM = child.DIM


def create(path, merge_policy=None):
    return kd.Collection.create(path, DIM, m=8, ef_construction=32,
                                memory_budget=child.BUDGET, merge_policy=merge_policy)


def vectors(rng, n):
    return rng.standard_normal((n, DIM)).astype(np.float32)


# -- readers in other processes ------------------------------------------------------

# close() drops a background merge that swapped in after the last commit, with
# a warning about uncommitted changes.
@pytest.mark.filterwarnings("ignore:collection .* closed with uncommitted:RuntimeWarning")
@pytest.mark.parametrize("seconds", [pytest.param(3.0, id="short"),
                                     pytest.param(30.0, id="long", marks=pytest.mark.slow)])
def test_reader_processes_see_whole_commits(tmp_path, seconds):
    """Two reader processes search (graph and exact) and refresh while this
    process adds, removes, upserts, commits and merges. Each reader checks
    every result against its snapshot (ids live in it; exact results are its
    exact top k; distances are those of its vectors); here each snapshot it
    saw must be one the writer committed: the same generation, ids and
    vectors."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7300)
    col = create(path, merge_policy="tiered")
    col.add(vectors(rng, 1500))
    committed = {}

    def commit(merge=False):
        last = col.generation
        gen = col.commit()
        if merge:   # its commits between last + 1 and gen all hold the same ids
            gen = col.merge(max_segments=2)
        dig, count = child.collection_digest(col)
        for g in range(last + 1, gen + 1):
            committed[g] = (count, dig)

    commit()
    outs = [str(tmp_path / f"reader{i}.json") for i in range(2)]
    errs = [open(tmp_path / f"reader{i}.err", "wb") for i in range(2)]
    readers = [subprocess.Popen([sys.executable, CHILD, "reader", path, out, str(7310 + i),
                                 str(seconds)], stderr=err)
               for i, (out, err) in enumerate(zip(outs, errs))]
    try:
        deadline = time.monotonic() + seconds + 120  # readers wait up to 60 s for a commit
        step = 0
        while any(r.poll() is None for r in readers):
            assert time.monotonic() < deadline, "the readers never finished"
            step += 1
            live = col.ids()
            col.remove(rng.choice(live, int(rng.integers(1, 60)), replace=False))
            n = int(rng.integers(50, 300))
            col.add(vectors(rng, n))
            if step % 3 == 0:
                up = rng.choice(col.ids(), 10, replace=False)
                col.add(vectors(rng, 10), up, upsert=True)
            commit(merge=step % 7 == 0)
    finally:
        for r in readers:
            if r.poll() is None:
                r.kill()
            r.wait()
        for e in errs:
            e.close()
        col.close()
    for i, r in enumerate(readers):
        if r.returncode != 0:
            pytest.fail(f"reader {i} failed:\n"
                        f"{(tmp_path / f'reader{i}.err').read_text(errors='replace')[-4000:]}")
    assert step >= 5, f"the writer committed only {step} times"
    for i, out in enumerate(outs):
        with open(out) as f:
            summary = json.load(f)
        assert summary["searches"] > 0
        gens = [g for g, _, _ in summary["seen"]]
        assert gens == sorted(gens), f"reader {i}: generations went back: {gens}"
        for gen, count, dig in summary["seen"]:
            assert gen in committed, f"reader {i} saw generation {gen}, never committed"
            assert (count, dig) == committed[gen], (
                f"reader {i} at generation {gen} held {count} ids, the commit "
                f"{committed[gen][0]} (or other ids or vectors)")
        assert len(set(gens)) >= 2, f"reader {i} never moved to a newer commit: {gens}"
        print(f"reader {i}: {summary['searches']} searches, {len(set(gens))} generations")


# -- a second writer ----------------------------------------------------------------

def _try_writable_elsewhere(path):
    r = subprocess.run([sys.executable, CHILD, "lock", path], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_writer_is_refused(tmp_path):
    path = str(tmp_path / "col")
    col = create(path)
    col.add(vectors(np.random.default_rng(7320), 100))
    col.commit()
    got = _try_writable_elsewhere(path)
    assert got.get("error") == "CollectionLockedError", got
    assert path in got["message"], got
    with pytest.raises(kd.CollectionLockedError, match=re.escape(path)):
        kd.Collection.open(path, writable=True)
    with pytest.raises(kd.CollectionLockedError):
        kd.Collection.open(path, writable=True)   # a refused open left no lock behind
    reader = kd.Collection.open(path)             # readers take no lock
    assert len(reader) == 100
    reader.close()
    col.close()
    assert _try_writable_elsewhere(path) == {"ok": True}
    again = kd.Collection.open(path, writable=True)
    assert _try_writable_elsewhere(path).get("error") == "CollectionLockedError"
    again.close()


def test_lock_of_a_killed_writer_is_free(tmp_path):
    """A writer in another process holds the lock while it lives; once it
    is killed, a writable open works."""
    path = str(tmp_path / "col")
    create(path).close()
    proc = subprocess.Popen([sys.executable, CHILD, "writer", path, str(tmp_path / "report"),
                             "7330"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        with pytest.raises(kd.CollectionLockedError, match=re.escape(path)):
            kd.Collection.open(path, writable=True)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kd.Collection.open(path, writable=True).close()


# -- threads of one process ---------------------------------------------------------

class Ledger:
    """What the writer thread has done, for the searcher threads to check
    against. Ids are never reused and vectors never change."""

    def __init__(self):
        self.lock = threading.Lock()
        self.vec = {}            # id -> vector, set before the add starts
        self.added = []          # ids whose add returned
        self.removing = set()    # ids whose remove started
        self.removed_at = {}     # id -> position in the order removes returned
        self.done = threading.Event()


def _writer_thread(col, ledger, rng, seconds, errors):
    try:
        next_id = len(ledger.added)
        deadline = time.monotonic() + seconds
        step = 0
        while time.monotonic() < deadline:
            step += 1
            n = int(rng.integers(50, 300))
            x = vectors(rng, n)
            ids = np.arange(next_id, next_id + n)
            next_id += n
            with ledger.lock:
                for i, v in zip(ids.tolist(), x):
                    ledger.vec[i] = v
            col.add(x, ids)
            with ledger.lock:
                ledger.added.extend(ids.tolist())
                alive = [i for i in ledger.added if i not in ledger.removing]
                victims = rng.choice(alive, min(len(alive) - 20, int(rng.integers(1, 80))),
                                     replace=False).tolist()
                ledger.removing.update(victims)
            col.remove(victims)
            with ledger.lock:
                for i in victims:
                    ledger.removed_at[i] = len(ledger.removed_at)
            if step % 2 == 0:
                if step % 8 == 0:
                    col.merge(max_segments=2)
                else:
                    col.commit()
        col.commit()
    except BaseException as e:
        errors.append(("writer", e))
    finally:
        ledger.done.set()


def _searcher_thread(col, ledger, rng, errors, counts, k=5):
    try:
        while not ledger.done.is_set():
            with ledger.lock:
                removed_before = len(ledger.removed_at)
                alive = [i for i in ledger.added[-400:] if i not in ledger.removing]
                target = int(rng.choice(alive)) if alive else None
            q = ledger.vec[target] if target is not None else vectors(rng, 1)[0]
            for exact in (True, False):
                D, I = col.search(q, k=k, exact=exact)
                counts[exact] += 1
                assert D.shape == (k,) and I.shape == (k,)
                got = I[I >= 0].tolist()
                with ledger.lock:
                    gone = [i for i in got if ledger.removed_at.get(i, removed_before)
                            < removed_before]
                    target_removing = target in ledger.removing
                assert not gone, (f"ids {gone} were removed before the search started, and "
                                  f"returned (exact={exact})")
                assert all(i in ledger.vec for i in got), f"unknown ids in {I.tolist()}"
                # Reranked distances are those of the returned ids' vectors.
                want = [float(((ledger.vec[i] - q).astype(np.float64) ** 2).sum()) for i in got]
                np.testing.assert_allclose(D[I >= 0], want, rtol=1e-4, atol=1e-4)
                if exact:
                    assert len(got) == k, f"a padded exact result {I.tolist()}"
                    if target is not None and not target_removing:
                        assert target in got, (f"id {target}, added before the search and "
                                               f"not removed, is not its own nearest")
    except BaseException as e:
        errors.append(("searcher", e))


@pytest.mark.parametrize("seconds", [pytest.param(3.0, id="short"),
                                     pytest.param(30.0, id="long", marks=pytest.mark.slow)])
def test_threads_search_while_writer_changes(tmp_path, seconds):
    """Searcher threads and a writer thread share one writable collection.
    A search never returns an id whose remove returned before the search
    started; an id added (add returned) and not being removed is found by an
    exact search for its own vector; exact distances are those of the ids'
    vectors."""
    col = create(str(tmp_path / "col"), merge_policy="tiered")
    rng = np.random.default_rng(7340)
    ledger = Ledger()
    x = vectors(rng, 1000)
    for i, v in enumerate(x):
        ledger.vec[i] = v
    col.add(x, np.arange(1000))
    ledger.added.extend(range(1000))
    col.commit()
    errors = []
    counts = {True: 0, False: 0}
    threads = [threading.Thread(target=_searcher_thread,
                                args=(col, ledger, np.random.default_rng(7341 + i), errors,
                                      counts)) for i in range(2)]
    threads.append(threading.Thread(target=_writer_thread,
                                    args=(col, ledger, np.random.default_rng(7343), seconds,
                                          errors)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    if errors:
        who, e = errors[0]
        raise AssertionError(f"the {who} thread failed: {e!r}") from e
    assert counts[True] > 0 and counts[False] > 0, counts
    # What the writer holds is what it committed.
    live = sorted(set(ledger.added) - set(ledger.removed_at))
    np.testing.assert_array_equal(col.ids(), live)
    col.merge(max_segments=1)
    col.close()
    reader = kd.Collection.open(str(tmp_path / "col"))
    np.testing.assert_array_equal(reader.ids(), live)
    np.testing.assert_array_equal(reader.get_vectors(live),
                                  np.stack([ledger.vec[i] for i in live]))
    reader.close()


# -- files of replaced segments --------------------------------------------------------

@pytest.mark.parametrize("release", ["refresh", "close"])
def test_replaced_segment_files_live_while_a_reader_needs_them(tmp_path, release):
    """A reader of this process keeps the files of its commit: a merge into
    one segment retires them, but they stay on disk (and the reader's
    searches work on its snapshot) until the reader refreshes or closes."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7350)
    col = create(path)
    for b in range(3):
        col.add(vectors(rng, 500), np.arange(b * 1000, b * 1000 + 500))
        col.commit()
    col.remove(np.arange(0, 500, 4))
    col.commit()
    reader = kd.Collection.open(path)
    old = [os.path.join(path, s["name"]) for s in reader.segments()]
    assert len(old) == 3
    q = vectors(rng, 5)
    before = reader.search(q, k=10, exact=True)
    gen = col.merge(max_segments=1)
    (merged,) = col.segments()
    assert os.path.join(path, merged["name"]) not in old
    assert all(os.path.exists(p) for p in old), "a reader's segment file was deleted"
    assert reader.generation < gen
    after = reader.search(q, k=10, exact=True)
    np.testing.assert_array_equal(after[1], before[1])
    assert len(reader.segments()) == 3
    # A reader opened now sees the merged commit; the old files stay.
    fresh = kd.Collection.open(path)
    assert [s["name"] for s in fresh.segments()] == [merged["name"]]
    fresh.close()
    assert all(os.path.exists(p) for p in old)
    if release == "refresh":
        assert reader.refresh() == gen
        np.testing.assert_array_equal(reader.search(q, k=10, exact=True)[1], before[1])
        assert len(reader.segments()) == 1
    else:
        reader.close()
    del reader
    gc.collect()
    assert not [p for p in old if os.path.exists(p)], "files of replaced segments remain"
    col.close()
    child.assert_only_committed_files(path)


# -- races, made deterministic ---------------------------------------------------------

def test_refresh_racing_a_commit(tmp_path, monkeypatch):
    """A reader refreshes to commit 3 while the writer commits 4, which
    replaces a tombstone file of commit 3 before the reader reads it: the
    reader must retry and land whole on commit 4."""
    from knndirect import _collection
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7360)
    col = create(path)
    col.add(vectors(rng, 600), np.arange(600))
    col.commit()
    col.add(vectors(rng, 600), np.arange(1000, 1600))
    col.commit()
    reader = kd.Collection.open(path)
    col.remove([1, 2, 1001])                      # tombstones in both segments
    col.commit()
    second = col.segments()[1]["name"]
    real = _collection._read_tombstones

    def racing(p):
        if p.endswith(f"{second}.del-{3:012d}") and col.generation == 3:
            col.remove([1002])                    # commit 4 replaces that file
            col.commit()
        return real(p)

    monkeypatch.setattr(_collection, "_read_tombstones", racing)
    assert reader.refresh() == 4
    monkeypatch.setattr(_collection, "_read_tombstones", real)
    np.testing.assert_array_equal(reader.ids(), col.ids())
    assert len(reader) == len(col) == 1196
    reader.close()
    col.close()


def test_rollback_with_a_search_in_flight_keeps_committed_files(tmp_path):
    """A search in flight holds the segment handles it started with (the
    published view). A rollback retires a flushed, uncommitted segment that
    the search uses; a new segment flushed and committed afterwards must
    survive the end of that search."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7370)
    col = create(path)
    col.add(vectors(rng, 500), np.arange(500))
    col.commit()
    col.add(vectors(rng, 1100), np.arange(1000, 2100))   # flushes a full buffer
    in_flight = col._view        # what search() hands to _core.search_many
    col.rollback()
    x = vectors(rng, 1100)
    col.add(x, np.arange(5000, 6100))                    # flushes again
    col.commit()
    want = col.ids()
    del in_flight                # the search ends
    gc.collect()
    col.close()
    child.assert_only_committed_files(path)
    reader = kd.Collection.open(path)
    np.testing.assert_array_equal(reader.ids(), want)
    np.testing.assert_array_equal(reader.get_vectors(np.arange(5000, 6100)), x)
    reader.close()


def test_merge_and_background_merge_keep_ids_unique(tmp_path):
    """Three committed segments of 600, and 600 more buffered: merge()'s
    first commit makes the fourth segment of the tier, which plans a
    background merge of all four; merge(max_segments=3) merges two. Every id
    must stay in one place."""
    path = str(tmp_path / "col")
    rng = np.random.default_rng(7380)
    col = create(path, merge_policy="tiered")
    for b in range(4):
        col.add(vectors(rng, 600), np.arange(b * 1000, b * 1000 + 600))
        if b < 3:
            col.commit()
    col.merge(max_segments=3)
    deadline = time.monotonic() + 60
    while col.info()["merging"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        col.commit()
    ids = col.ids()
    assert len(col) == ids.size == np.unique(ids).size == 2400, (
        f"{ids.size} live entries for {np.unique(ids).size} ids")
    col.remove([5])
    assert 5 not in col.ids()
    col.commit()
    col.close()
    child.assert_only_committed_files(path)

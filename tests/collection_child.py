"""A child program for the collection crash and concurrency tests
(tests/test_collection_crash.py, tests/test_collection_concurrency.py).

    python collection_child.py writer PATH REPORT SEED [--merges] [--steps N]
        Opens the collection at PATH writable and loops: remove some live
        ids, add a batch (new ids and some re-added removed ones), sometimes
        upsert, commit, sometimes merge. It keeps its own model of the live
        vectors (id -> float32 vector). Before each commit it appends
        "intent LO HI DIGEST COUNT" to REPORT (fsynced): any generation in
        [LO, HI] holds the model's state; after commit() returns,
        "commit GEN DIGEST COUNT" (after merge(): "merged ..."), fsynced,
        before going on. Prints "ready"
        once its model is loaded. Runs until killed, or N steps.

    python collection_child.py reader PATH OUT SEED SECONDS
        Opens the collection read-only and searches (graph and exact) for
        SECONDS, refreshing every other round. Every result is checked
        against the reader's snapshot (the ids and vectors of the commit it
        is at). Writes a JSON summary to OUT: searches, and the (generation,
        live count, digest) of every snapshot it saw.

    python collection_child.py lock PATH
        Tries a writable open and prints one JSON line: {"ok": true} or
        {"error": type name, "message": str}.

The digest of a state is sha256 over its sorted int64 ids and, in that
order, their float32 vectors (see digest()).
"""
import hashlib
import json
import os
import re
import sys
import time
import warnings

import numpy as np

import knndirect as kd

DIM = 16
BUDGET = "64KiB"      # 1024 rows of dim 16: adds flush to segments too
MAX_LIVE = 2500       # past this, a step removes more than it adds
MANIFEST = re.compile(r"^manifest-\d{12}\.json$")


def digest(ids, vectors):
    ids = np.ascontiguousarray(ids, dtype="<i8")
    order = np.argsort(ids, kind="stable")
    h = hashlib.sha256()
    h.update(ids[order].tobytes())
    h.update(np.ascontiguousarray(np.asarray(vectors, dtype="<f4")[order]).tobytes())
    return h.hexdigest()


def collection_digest(col):
    """(digest, count) of what col holds: its live ids and their vectors."""
    ids = col.ids()
    vectors = col.get_vectors(ids) if ids.size else np.zeros((0, col.dim), np.float32)
    return digest(ids, vectors), int(ids.size)


def empty_digest(dim=DIM):
    return digest(np.zeros(0, np.int64), np.zeros((0, dim), np.float32))


def assert_only_committed_files(path):
    """LOCK, one manifest, and exactly the files that manifest names."""
    names = set(os.listdir(path))
    manifests = sorted(n for n in names if MANIFEST.match(n))
    assert len(manifests) == 1, f"{len(manifests)} manifests in {sorted(names)}"
    with open(os.path.join(path, manifests[0])) as f:
        doc = json.load(f)
    want = {"LOCK", manifests[0]}
    if doc["quantizer"]:
        want.add(doc["quantizer"])
    for entry in doc["segments"]:
        want.add(entry["name"])
        if entry["tombstones"]:
            want.add(entry["tombstones"])
    assert want <= names, f"the commit names missing files: {sorted(want - names)}"
    assert names == want, f"files no commit names: {sorted(names - want)}"


def append_line(path, line):
    """Append one line to path and fsync it before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Model:
    """id -> float32 vector of every live id."""

    def __init__(self, ids=(), vectors=()):
        self.vec = {int(i): np.asarray(v, np.float32) for i, v in zip(ids, vectors)}

    def ids(self):
        return np.array(sorted(self.vec), dtype=np.int64)

    def digest(self):
        ids = self.ids()
        if not ids.size:
            return empty_digest(), 0
        return digest(ids, np.stack([self.vec[i] for i in ids.tolist()])), int(ids.size)


def writer(path, report, seed, merges, steps):
    rng = np.random.default_rng(seed)
    col = kd.Collection.open(path, writable=True)
    live = col.ids()
    model = Model(live, col.get_vectors(live) if live.size else ())
    print("ready", flush=True)
    step = 0
    while steps is None or step < steps:
        step += 1
        live = model.ids()
        # Removes: a few, or many once the collection is large.
        if live.size:
            hi = live.size // 2 if live.size > MAX_LIVE else min(live.size, 80)
            gone = rng.choice(live, int(rng.integers(0, hi + 1)), replace=False)
            if gone.size:
                col.remove(gone)
                for i in gone.tolist():
                    del model.vec[i]
        # A batch: new ids and removed ones added back, any id not live below
        # the top of the id range plus the batch.
        n = int(rng.integers(20, 400))
        live = model.ids()
        top = int(live[-1]) + 1 if live.size else 0
        free = np.setdiff1d(np.arange(top + n, dtype=np.int64), live)
        new_ids = rng.choice(free, n, replace=False)
        x = rng.standard_normal((n, DIM)).astype(np.float32)
        col.add(x, new_ids)
        for i, v in zip(new_ids.tolist(), x):
            model.vec[i] = v
        # Upserts: live ids get new vectors (with a few new ids among them).
        if rng.random() < 0.3:
            live = model.ids()
            up = rng.choice(live, min(live.size, int(rng.integers(1, 40))), replace=False)
            up = np.concatenate([up, np.setdiff1d(top + n + np.arange(3), live)])
            ux = rng.standard_normal((up.size, DIM)).astype(np.float32)
            col.add(ux, up, upsert=True)
            for i, v in zip(up.tolist(), ux):
                model.vec[i] = v
        if rng.random() < 0.15:
            continue          # several steps in one commit
        dig, count = model.digest()
        gen = col.generation
        if merges and rng.random() < 0.2:
            # merge() commits, merges, commits: every generation it makes
            # (two today; up to four allowed) holds the same state.
            append_line(report, f"intent {gen + 1} {gen + 4} {dig} {count}")
            got = col.merge(max_segments=int(rng.integers(1, 4)))
            append_line(report, f"merged {got} {dig} {count}")
        else:
            append_line(report, f"intent {gen + 1} {gen + 1} {dig} {count}")
            got = col.commit()
            append_line(report, f"commit {got} {dig} {count}")
    col.close()


def reader(path, out, seed, seconds):
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        col = kd.Collection.open(path)
    seen = []
    searches = 0

    def snapshot():
        ids = col.ids()
        x = col.get_vectors(ids) if ids.size else np.zeros((0, DIM), np.float32)
        if len(col) != ids.size:
            raise AssertionError(f"len(col) {len(col)} != {ids.size} live ids")
        seen.append([col.generation, int(ids.size), digest(ids, x)])
        return ids, x

    ids, x = snapshot()
    # At least `seconds`, then on until a second commit is seen (the writer
    # commits while readers run): a slow machine (a sanitizer build, a
    # loaded CI) must not leave a reader with one generation. Bounded.
    start = time.monotonic()
    rounds = 0
    while True:
        spent = time.monotonic() - start
        moved = len({g for g, _, _ in seen}) >= 2
        if spent >= seconds and (moved or spent >= seconds + 60):
            break
        rounds += 1
        if rounds % 2 == 0:
            before = col.generation
            if col.refresh() < before:
                raise AssertionError(f"refresh went back from {before} to {col.generation}")
            if col.generation != seen[-1][0]:
                ids, x = snapshot()
        q = rng.standard_normal((3, DIM)).astype(np.float32)
        k = 10
        for exact in (False, True):
            D, I = col.search(q, k=k, exact=exact)
            searches += 1
            if D.shape != (3, k) or I.shape != (3, k) or I.dtype != np.int64:
                raise AssertionError(f"result shapes {D.shape} {I.shape} {I.dtype}")
            for row in I:
                got = row[row >= 0]
                if not np.isin(got, ids).all():
                    bad = got[~np.isin(got, ids)]
                    raise AssertionError(f"generation {col.generation}: ids {bad.tolist()} "
                                         f"are not live in this snapshot (exact={exact})")
                if np.unique(got).size != got.size:
                    raise AssertionError(f"duplicate ids in a result row: {row.tolist()}")
                if (row < 0).any() and ids.size >= k and exact:
                    raise AssertionError(f"padded row {row.tolist()} with {ids.size} live")
            if not ids.size:
                continue
            d2 = ((q[:, None, :].astype(np.float64) - x[None].astype(np.float64)) ** 2).sum(-1)
            kth = np.sort(d2, axis=1)[:, min(k, ids.size) - 1]
            for r in range(3):
                ok = I[r] >= 0
                pos = np.searchsorted(ids, I[r][ok])
                # Distances are those of the returned ids' vectors in this snapshot.
                np.testing.assert_allclose(D[r][ok], d2[r, pos], rtol=1e-4, atol=1e-4)
                if exact and (d2[r, pos] > kth[r] * (1 + 1e-4) + 1e-4).any():
                    raise AssertionError(f"exact search returned ids {I[r].tolist()} "
                                         f"outside the snapshot's top {k}")
    col.close()
    with open(out, "w") as f:
        json.dump({"searches": searches, "seen": seen}, f)


def lock(path):
    try:
        col = kd.Collection.open(path, writable=True)
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
        return
    col.close()
    print(json.dumps({"ok": True}), flush=True)


def main(argv):
    mode = argv[0]
    if mode == "writer":
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else None
        writer(argv[1], argv[2], int(argv[3]), "--merges" in argv, steps)
    elif mode == "reader":
        reader(argv[1], argv[2], int(argv[3]), float(argv[4]))
    elif mode == "lock":
        lock(argv[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""knndirect.ray on a local Ray cluster: build, open, search, faults."""
import json
import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="knndirect.ray needs ray: pip install 'knndirect[ray]'")
pa = pytest.importorskip("pyarrow", reason="knndirect.ray tests need pyarrow")
pytest.importorskip("ray.data", reason="knndirect.ray needs ray[data]")
import pyarrow.parquet as pq  # noqa: E402

import knndirect as kd  # noqa: E402
import knndirect.ray as kdr  # noqa: E402

# Under the sanitizer stage every process Ray starts (GCS, raylet, workers)
# inherits libasan through LD_PRELOAD; a CI run once stalled there for an hour in
# the first cluster start. knndirect.ray is Python over the core, which the
# collection tests drive under ASan; the other stages run these tests.
pytestmark = pytest.mark.skipif(bool(os.environ.get("KNNDIRECT_SANITIZER_RUN")),
                                reason="sanitizer run: Ray's own processes would inherit libasan")

N, DIM, NQ, K = 8000, 32, 200, 10


@pytest.fixture(scope="module")
def cluster():
    # Workers import knndirect from this checkout (also where it is not installed).
    root = os.path.dirname(os.path.dirname(os.path.abspath(kd.__file__)))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env},
             configure_logging=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def data():
    x = kd.datasets.clustered(N + NQ, DIM, seed=7)
    return np.ascontiguousarray(x[:N]), np.ascontiguousarray(x[N:])


def _fsl(x):
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory, data):
    x, _ = data
    path = str(tmp_path_factory.mktemp("pq") / "vectors.parquet")
    pq.write_table(pa.table({"id": np.arange(N, dtype=np.int64), "embedding": _fsl(x)}), path,
                   row_group_size=1500)
    return path


@pytest.fixture(scope="module")
def built(cluster, parquet_file, tmp_path_factory):
    """Parquet in, 4 shards out."""
    path = str(tmp_path_factory.mktemp("built") / "idx")
    seen = []
    doc = kdr.build(ray.data.read_parquet(parquet_file), path, id_column="id", num_shards=4,
                    memory_budget="256KiB", progress=lambda done, total: seen.append(done))
    assert seen[-1] == 4
    return path, doc


@pytest.fixture(scope="module")
def single(data, tmp_path_factory):
    x, _ = data
    col = kd.Collection.create(str(tmp_path_factory.mktemp("single") / "c"), DIM,
                               merge_policy=None)
    col.add(x)
    col.commit()
    col.merge(1)
    yield col
    col.close()


@pytest.fixture(scope="module")
def served(built):
    index = kdr.open(built[0])
    yield index
    index.close()


def test_manifest_and_shards(built, data):
    path, doc = built
    with open(os.path.join(path, "manifest.json")) as f:
        on_disk = json.load(f)
    assert on_disk["format"] == "knndirect-ray" and "checksum" in on_disk
    assert [s["name"] for s in doc["shards"]] == [f"shard-{i:04d}" for i in range(4)]
    assert [s["count"] for s in doc["shards"]] == [2000] * 4
    assert doc["count"] == N and doc["dim"] == DIM
    # Each shard is a collection kd.open opens alone, one segment, and all
    # shards share the quantizer fitted once.
    q = kd.load(os.path.join(path, doc["quantizer"]))
    for s in doc["shards"]:
        col = kd.open(os.path.join(path, s["name"]))
        assert len(col) == s["count"] and len(col.segments()) == 1
        seg = kd.open(os.path.join(path, s["name"], col.segments()[0]["name"]))
        assert seg._core.same_quantizer(q._core)
        col.close()


def test_exact_equals_single_collection(served, single, data):
    _, queries = data
    D, ids = served.search(queries, K, exact=True)
    D1, ids1 = single.search(queries, K, exact=True)
    np.testing.assert_array_equal(ids, ids1)
    np.testing.assert_array_equal(D, D1)
    d, i = served.search(queries[3], K, exact=True)
    assert d.shape == (K,) and i.shape == (K,)
    np.testing.assert_array_equal(i, ids1[3])
    assert served.info()["missing_shards"] == []


def test_graph_recall_matches_single(served, single, data):
    x, queries = data
    truth, _ = kd.datasets.ground_truth(x, queries, K)
    r_sharded = kd.datasets.recall_at_k(served.search(queries, K)[1], truth, K)
    r_single = kd.datasets.recall_at_k(single.search(queries, K)[1], truth, K)
    assert r_sharded >= r_single - 0.005, (r_sharded, r_single)


def test_recall_target_goes_to_every_shard(served, built, single, data):
    x, queries = data
    path, doc = built
    truth, _ = kd.datasets.ground_truth(x, queries, K)
    shards = [kd.open(os.path.join(path, s["name"])) for s in doc["shards"]]
    try:
        for target in (0.9, 0.99):
            D, ids = served.search(queries, K, recall=target)
            # The same target on each shard's collection, merged here.
            D1, ids1 = kdr._merge_top_k([c.search(queries, K, recall=target) for c in shards],
                                        K, "l2", len(queries))
            np.testing.assert_array_equal(ids, ids1)
            np.testing.assert_array_equal(D, D1)
            assert kd.datasets.recall_at_k(ids, truth, K) >= target - 0.02
    finally:
        for c in shards:
            c.close()
    with pytest.raises(ValueError, match="recall"):
        served.search(queries, K, recall=0.9, ef=32)
    with pytest.raises(ValueError, match="recall"):
        served.search(queries, K, recall=1.5)


def test_info_shards_actors(served):
    info = served.info()
    assert info["shards"] == 4 and info["count"] == N and info["metric"] == "l2"
    assert len(served.shards()) == 4 and served.shards()[0]["count"] == 2000
    handles = served.actors()
    assert len(handles) == 4 and all(len(h) == 1 for h in handles)
    with pytest.raises(ValueError):
        served.search(np.zeros((2, DIM + 1), np.float32))
    with pytest.raises(ValueError):
        served.search(np.zeros((2, DIM), np.float32), k=0)


def test_ip_metric_and_partial_padding(cluster, data, tmp_path):
    x, queries = data
    ds = ray.data.from_numpy(x[:600])
    path = str(tmp_path / "ip")
    kdr.build(ds, path, column="data", num_shards=3, metric="ip", m=8, ef_construction=64)
    truth, _ = kd.datasets.ground_truth(x[:600], queries[:20], 5, "ip")
    with kdr.open(path) as index:
        D, ids = index.search(queries[:20], 5, exact=True)
        np.testing.assert_array_equal(ids, truth)
        assert (np.diff(D, axis=1) <= 0).all()           # larger is better
        D, ids = index.search(queries[:2], 700, exact=True)
        assert (ids[:, 600:] == -1).all() and np.isneginf(D[:, 600:]).all()


def test_killed_actor_restarts_and_query_retried(served, single, data):
    _, queries = data
    want = single.search(queries, K, exact=True)[1]
    victim = served.actors()[1][0]
    ray.get(victim._stall.remote(1.0))       # the query is in flight when the kill lands
    before = served.info()["retried"]
    import threading
    killer = threading.Timer(0.3, lambda: ray.kill(victim, no_restart=False))
    killer.start()
    _, ids = served.search(queries, K, exact=True, timeout=60)
    killer.join()
    np.testing.assert_array_equal(ids, want)
    assert served.info()["retried"] > before


def test_timeout_names_shard_or_partial(served, single, data):
    _, queries = data
    ray.get(served.actors()[2][0]._stall.remote(3.0))
    with pytest.raises(kdr.ShardTimeoutError, match="shard-0002") as e:
        served.search(queries[:5], K, timeout=0.5)
    assert e.value.shards == ["shard-0002"]
    ray.get(served.actors()[2][0]._stall.remote(3.0))
    D, ids = served.search(queries[:5], K, timeout=0.5, allow_partial=True)
    assert served.info()["missing_shards"] == ["shard-0002"]
    assert not np.isin(ids, np.arange(4000, 6000)).any() and (ids >= 0).all()
    time.sleep(2.6)


def test_dead_shard_error_or_partial(cluster, built, data):
    _, queries = data
    index = kdr.open(built[0], max_restarts=0)
    try:
        ray.kill(index.actors()[3][0], no_restart=True)
        with pytest.raises(kdr.ShardUnavailableError, match="shard-0003"):
            index.search(queries[:5], K, timeout=30)
        D, ids = index.search(queries[:5], K, timeout=30, allow_partial=True)
        assert index.info()["missing_shards"] == ["shard-0003"]
        assert ids.shape == (5, K) and not np.isin(ids, np.arange(6000, 8000)).any()
    finally:
        index.close()


def test_replicas_serve_when_one_dies(cluster, built, single, data):
    _, queries = data
    with kdr.open(built[0], replicas=2, max_restarts=0) as index:
        assert all(len(h) == 2 for h in index.actors())
        ray.kill(index.actors()[0][0], no_restart=True)
        for _ in range(2):
            _, ids = index.search(queries, K, exact=True, timeout=30)
            np.testing.assert_array_equal(ids, single.search(queries, K, exact=True)[1])


def test_failed_build_leaves_no_manifest_and_rerun_succeeds(cluster, data, tmp_path):
    x, _ = data
    n = 2000
    ids = np.arange(n, dtype=np.int64)
    ids[1700] = ids[1600]                   # a duplicate id inside the last shard
    bad = ray.data.from_pandas(__import__("pandas").DataFrame(
        {"id": ids, "embedding": list(x[:n])}))
    path = str(tmp_path / "fail")
    with pytest.raises(Exception, match="duplicate id"):
        kdr.build(bad, path, id_column="id", num_shards=4)
    assert not os.path.exists(os.path.join(path, "manifest.json"))
    with pytest.raises(FileNotFoundError, match="no manifest"):
        kdr.open(path)
    good = ray.data.from_items([{"id": i, "embedding": x[i]} for i in range(n)])
    doc = kdr.build(good, path, id_column="id", num_shards=4)
    assert doc["count"] == n and sorted(os.listdir(path)) == [
        "manifest.json", "quantizer.kdx", "shard-0000", "shard-0001", "shard-0002",
        "shard-0003"]
    with kdr.open(path) as index:
        D, got = index.search(x[:3], 1, exact=True)
        np.testing.assert_array_equal(got[:, 0], [0, 1, 2])
    with pytest.raises(FileExistsError):
        kdr.build(good, path, id_column="id")


def test_map_batches_pipeline(served, single, parquet_file, data):
    _, queries = data
    qpath = os.path.join(os.path.dirname(parquet_file), "queries.parquet")
    pq.write_table(pa.table({"qid": np.arange(NQ), "embedding": _fsl(queries)}), qpath)
    index = served

    def search(batch):
        res = index.search(np.stack(batch["embedding"]), K, exact=True, output="arrow")
        return {"qid": batch["qid"], "ids": np.stack(res.column("ids").to_numpy(
            zero_copy_only=False))}

    out = ray.data.read_parquet(qpath).map_batches(search, batch_size=64,
                                                   batch_format="numpy").take_all()
    got = np.stack([np.asarray(r["ids"]) for r in sorted(out, key=lambda r: r["qid"])])
    np.testing.assert_array_equal(got, single.search(queries, K, exact=True)[1])


def test_read_vectors_parquet(parquet_file, data):
    x, _ = data
    y = kd.datasets.read_vectors(parquet_file, column="embedding")
    np.testing.assert_array_equal(y, x)
    with pytest.raises(ValueError, match="no column"):
        kd.datasets.read_vectors(parquet_file, column="nope")


def test_core_does_not_import_ray():
    import subprocess
    import sys
    code = "import sys, knndirect; assert 'ray' not in sys.modules and 'knndirect.ray' " \
           "not in sys.modules"
    root = os.path.dirname(os.path.dirname(os.path.abspath(kd.__file__)))
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "PYTHONPATH": root})


def test_tune_calibrates_every_shard_on_unlike_queries(cluster, tmp_path):
    """tune() measures each shard on the user's queries, commits, and the
    serving actors (every replica) move to the tuned commit."""
    base = kd.datasets.clustered(16000, DIM, seed=4300)
    queries = kd.datasets.clustered(600, DIM, seed=4301)    # other cluster centres
    truth, _ = kd.datasets.ground_truth(base, queries, K)
    held, rest, rest_truth = queries[:300], queries[300:], truth[300:]
    path = str(tmp_path / "tuned")
    kdr.build(ray.data.from_numpy(base), path, column="data", num_shards=2)
    with kdr.open(path, replicas=2) as index:
        assert index.info()["tune"] is None
        assert [s["tune"] for s in index.shards()] == [None, None]
        before = kd.datasets.recall_at_k(index.search(rest, K)[1], rest_truth, K)
        with pytest.raises(ValueError, match="at least 50 queries"):
            index.tune(held[:10])
        with pytest.raises(ValueError, match="queries"):
            index.tune(held[:, :8])
        out = index.tune(held, K)
        assert [s["name"] for s in out] == ["shard-0000", "shard-0001"]
        assert all(seg["calibration"] == "tune" for s in out for seg in s["segments"])
        assert index.info()["tune"] == {"queries": 300, "k": K}
        assert [s["bytes"] for s in index.shards()] == [
            sum(os.path.getsize(os.path.join(path, s["name"], seg["name"]))
                for seg in s["segments"]) for s in out]
        after = kd.datasets.recall_at_k(index.search(rest, K)[1], rest_truth, K)
        assert before < 0.93 and after >= 0.95, (before, after)
        # Every replica serves the tuned tables: the same answers as each
        # shard's collection opened here, merged.
        shards = [kd.Collection.open(os.path.join(path, s["name"])) for s in index.shards()]
        try:
            assert all(c.info()["tune"] == {"queries": 300, "k": K} for c in shards)
            want = kdr._merge_top_k([c.search(rest, K) for c in shards], K, "l2", len(rest))
            for _ in range(2):                                # both replicas, round-robin
                D, ids = index.search(rest, K)
                np.testing.assert_array_equal(ids, want[1])
        finally:
            for c in shards:
                c.close()
        # A shard held by another writer fails alone, by name; the other is tuned.
        with kd.Collection.open(os.path.join(path, "shard-0001"), writable=True):
            with pytest.raises(kdr.ShardError, match="shard-0001.*already open for writing") as e:
                index.tune(rest[:100], K)
        assert e.value.shards == ["shard-0001"]
        assert index.info()["tune"] is None            # the shards now differ
        assert [s["tune"]["queries"] for s in index.shards()] == [100, 300]
        with kdr.open(path, replicas=2) as again:      # the manifest carries them
            assert again.shards() == index.shards()
        with kd.Collection.open(os.path.join(path, "shard-0000")) as c0, \
                kd.Collection.open(os.path.join(path, "shard-0001")) as c1:
            assert c0.info()["tune"]["queries"] == 100 and c1.info()["tune"]["queries"] == 300
    index.close()
    with pytest.raises(ValueError, match="closed"):
        index.tune(held)

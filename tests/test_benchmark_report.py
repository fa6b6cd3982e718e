"""The benchmarks' own rules (benchmarks/report.py, bench_disk_peers.py):
Pareto fronts, interpolation at a recall, targets, and a sweep's stop rules."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import report  # noqa: E402


def run(recall, qps, **params):
    return {"recall": recall, "qps": qps, "params": params, "threads": 1}


def test_front_drops_dominated_points():
    runs = [run(0.90, 1000), run(0.92, 800), run(0.91, 1200), run(0.99, 300), run(0.95, 200)]
    front = report.pareto_front(runs)
    assert [(r["recall"], r["qps"]) for r in front] == [(0.91, 1200), (0.92, 800), (0.99, 300)]


def test_interpolation_is_linear_in_log_qps():
    front = [run(0.90, 1000), run(1.00, 10)]
    q = report.qps_at_recall(front, 0.95)
    assert math.isclose(q, 100.0, rel_tol=1e-9)


def test_not_reached_and_no_extrapolation():
    assert report.qps_at_recall([run(0.80, 1000), run(0.94, 500)], 0.95) is None
    assert report.qps_at_recall([], 0.95) is None
    # every point above the target: the fastest one, not an extrapolation
    assert report.qps_at_recall([run(0.97, 900), run(0.99, 400)], 0.95) == 900
    # exactly on the target
    assert math.isclose(report.qps_at_recall([run(0.90, 900), run(0.95, 400)], 0.95), 400)


def _result(kd_qps, hn_qps, peer_qps, kd_build=10.0, hn_build=8.0):
    def entry(q, build):
        e = {"status": "ok", "builds": [{"build_threads": 2, "build_s": build}],
             "search": {"runs": [run(0.90, q * 2), run(0.99, q / 2)]}}
        for r in e["search"]["runs"]:
            r["threads"] = 1
        return report.summarize_system(e, [1])
    res = {"dataset": {"n": 1000, "dim": 768},
           "config": {"threads": [1], "build_threads": [2], "k": 10},
           "systems": {"knndirect": entry(kd_qps, kd_build), "hnswlib": entry(hn_qps, hn_build),
                       "usearch": entry(peer_qps, 1.0)}}
    res["systems"]["knndirect"]["opened_resident_bytes"] = 1000 * 300
    return res


def test_targets_pass_and_fail():
    rows = {r["target"].split(",")[0]: r for r in report.evaluate_targets(_result(300, 100, 250))}
    assert rows["QPS@0.95 knndirect / hnswlib"]["pass"] is True
    assert math.isclose(rows["QPS@0.95 knndirect / hnswlib"]["measured"], 3.0)
    assert rows["QPS@0.95 knndirect / best peer"]["pass"] is True
    assert "usearch" in rows["QPS@0.95 knndirect / best peer"]["detail"]
    assert rows["build time knndirect / hnswlib"]["pass"] is False
    res = [r for r in report.evaluate_targets(_result(300, 100, 250))
           if r["target"].startswith("resident")][0]
    assert res["pass"] is True and math.isclose(res["measured"], 300 / 3072)
    rows = {r["target"].split(",")[0]: r for r in report.evaluate_targets(_result(120, 100, 400))}
    assert rows["QPS@0.95 knndirect / hnswlib"]["pass"] is False
    assert rows["QPS@0.95 knndirect / best peer"]["pass"] is False


def _disk_peers():
    import bench_disk_peers
    return bench_disk_peers


def test_a_stopped_point_rules_out_every_costlier_one():
    dp = _disk_peers()
    stop = {"nprobes": 80, "refine_factor": 5, "after_s": 120}
    assert dp.dominated({"nprobes": 80, "refine_factor": 5}, stop)
    assert dp.dominated({"nprobes": 160, "refine_factor": 20}, stop)
    assert not dp.dominated({"nprobes": 40, "refine_factor": 100}, stop)
    assert not dp.dominated({"nprobes": 160, "refine_factor": 1}, stop)
    assert not dp.dominated({"ef": None, "oversample": None, "default": True},
                            {"ef": 64, "oversample": 2, "after_s": 120})


def test_the_walk_skips_done_saturated_and_stopped_points():
    dp = _disk_peers()

    def m(p, r, recall):
        return {"nprobes": p, "refine_factor": r, "recall": recall, "qps": 100.0, "passes": 1}
    # refine 1 gains 0.001 from nprobes 5 to 10: the rest of its row is skipped;
    # refine 5 passed ENOUGH at nprobes 10; refine 10 was stopped at nprobes 40.
    measured = [m(5, 1, 0.200), m(10, 1, 0.201), m(5, 5, 0.90), m(10, 5, 0.996)]
    stopped = [{"nprobes": 40, "refine_factor": 10, "after_s": 120}]
    left = list(dp.walk("lancedb", measured, stopped))
    assert not [p for p in left if p["refine_factor"] in (1, 5)]
    assert [p["nprobes"] for p in left if p["refine_factor"] == 10] == [5, 10, 20]
    assert [p["nprobes"] for p in left if p["refine_factor"] == 100] == [5, 10, 20]
    # knndirect's rows have no saturation rule: a flat row goes on
    flat = [{"ef": e, "oversample": 2, "recall": 0.9, "qps": 1.0} for e in (32, 48)]
    assert {"ef": 64, "oversample": 2} in list(dp.walk("knndirect-disk", flat, []))

"""Synthetic data and exact ground truth, for the demo, tests and benchmarks."""
from __future__ import annotations

import numpy as np


def clustered(n, dim, *, n_clusters=64, spread=0.5, seed=0):
    """Clustered float32 data with a decaying spectrum: cluster centres and
    within-cluster noise both scale dimension i by 1/sqrt(1 + i/8), as real
    embeddings concentrate their variance in few directions."""
    rng = np.random.default_rng(seed)
    scale = (1.0 / np.sqrt(1.0 + np.arange(dim) / 8.0)).astype(np.float32)
    centres = rng.standard_normal((n_clusters, dim), dtype=np.float32) * scale
    out = np.empty((n, dim), dtype=np.float32)
    step = 65536
    for start in range(0, n, step):
        end = min(n, start + step)
        labels = rng.integers(0, n_clusters, end - start)
        noise = rng.standard_normal((end - start, dim), dtype=np.float32)
        out[start:end] = centres[labels] + spread * noise * scale
    return out


def ground_truth(data, queries, k, metric="l2", *, block=4096):
    """Exact top-k ids (and scores) by brute force in float64, best first."""
    data = np.asarray(data, dtype=np.float32)
    queries = np.asarray(queries, dtype=np.float32)
    if metric == "cosine":
        data = data / np.maximum(np.linalg.norm(data, axis=1, keepdims=True), 1e-30)
        queries = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-30)
    k = min(k, len(data))
    best_s = np.full((len(queries), k), np.inf)
    best_i = np.zeros((len(queries), k), dtype=np.int64)
    q64 = queries.astype(np.float64)
    qn = (q64 ** 2).sum(1)[:, None]
    for start in range(0, len(data), block):
        x = data[start:start + block].astype(np.float64)
        ip = q64 @ x.T
        s = qn - 2 * ip + (x ** 2).sum(1)[None] if metric == "l2" else -ip
        s = np.concatenate([best_s, s], axis=1)
        ids = np.concatenate([best_i, np.arange(start, start + len(x))[None].repeat(len(q64), 0)], 1)
        part = np.argpartition(s, k - 1, axis=1)[:, :k]
        best_s = np.take_along_axis(s, part, 1)
        best_i = np.take_along_axis(ids, part, 1)
    order = np.argsort(best_s, axis=1, kind="stable")
    best_s = np.take_along_axis(best_s, order, 1)
    best_i = np.take_along_axis(best_i, order, 1)
    return best_i, (best_s if metric == "l2" else -best_s)


def recall_at_k(found, truth, k=10):
    """Mean fraction of the true top-k ids found in the first k results."""
    found = np.asarray(found)[:, :k]
    truth = np.asarray(truth)[:, :k]
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth))
    return hits / float(truth.size)

"""Type stubs: py.typed and the .pyi files ship next to the modules, and a
usage snippet type-checks with mypy --strict (skipped when mypy is absent),
while misuse is caught."""
import os
import subprocess
import sys
import textwrap

import pytest

import knndirect as kd

PKG = os.path.dirname(os.path.abspath(kd.__file__))

GOOD = """
    import io
    import numpy as np
    import numpy.typing as npt
    import knndirect as kd
    from knndirect.datasets import read_vectors, recall_at_k, write_fvecs

    x: npt.NDArray[np.float32] = kd.datasets.clustered(1000, 16)
    index = kd.Index(16, "cosine", m=8, quantization="4bit")
    index.add(x, progress=lambda done, total: True)
    D, I = index.search(x[:5], 10, ef=64, oversample=4.0, filter=[1, 2, 3])
    d32: npt.NDArray[np.float32] = D
    i64: npt.NDArray[np.int64] = I
    n: int = len(index)
    record_size: int = index.info()["record_size"]
    st = index.stats(reset=True)
    per_query: float = st["read_bytes"] / max(1, st["queries"])
    buf = io.BytesIO()
    index.save(buf)
    with kd.load(buf.getvalue()) as loaded:
        v: npt.NDArray[np.float32] = loaded.get_vectors([1, 2])
    write_fvecs("x.fvecs", read_vectors("y.npy"))
    r: float = recall_at_k(I, I)
    uring: bool = kd.features()["io_uring"]
    opened = kd.open("x.kdx", io_backend="threads", preload=("graph",), io_depth=32)
    col = kd.Collection.create("c", 16, memory_budget="64MiB", merge_policy=None)
    col.add(x, upsert=True)
    gen: int = col.commit()
    Dc, Ic = col.search(x[:2], 5, exact=True)
    ic64: npt.NDArray[np.int64] = Ic
    with kd.Collection.open("c", writable=True) as w:
        w.remove([1, 2])
        w.merge(max_segments=2)
"""

BAD = """
    import knndirect as kd
    index = kd.Index(16, "hamming")
    index.search([0.0] * 16, k="10")
    kd.open("x.kdx", io_backend="uring")
    s: str = index.stats()["queries"]
"""


def test_stubs_and_marker_are_installed():
    for name in ("py.typed", "__init__.pyi", "_index.pyi", "_collection.pyi", "datasets.pyi"):
        assert os.path.isfile(os.path.join(PKG, name)), name


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mypy-cache")


def _mypy(tmp_path, cache_dir, source):
    pytest.importorskip("mypy", reason="mypy is not installed")
    path = tmp_path / "snippet.py"
    path.write_text(textwrap.dedent(source))
    env = dict(os.environ)
    root = os.path.dirname(PKG)
    if "site-packages" not in root and "dist-packages" not in root:
        env["MYPYPATH"] = root   # a source checkout (editable install)
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
                           "--cache-dir", str(cache_dir), str(path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_usage_type_checks(tmp_path, cache_dir):
    p = _mypy(tmp_path, cache_dir, GOOD)
    assert p.returncode == 0, p.stdout + p.stderr


def test_misuse_is_caught(tmp_path, cache_dir):
    p = _mypy(tmp_path, cache_dir, BAD)
    assert p.returncode != 0
    for needle in ("hamming", '"k"', "uring", "assignment"):
        assert needle in p.stdout, (needle, p.stdout)

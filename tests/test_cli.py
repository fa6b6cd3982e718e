"""The command line, `python -m knndirect`, run as a subprocess on small
generated data: build, search, info, verify, bench and Ctrl-C during build."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import knndirect as kd
from knndirect import __main__ as cli
from knndirect import datasets

N, DIM, NQ = 3000, 16, 50


def run(*args, cwd=None, timeout=120, check=True):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "knndirect", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    allv = datasets.clustered(N + NQ, DIM, seed=11)
    base, queries = allv[:N], allv[N:]
    truth, _ = datasets.ground_truth(base, queries, 10)
    datasets.write_fvecs(d / "base.fvecs", base)
    np.save(d / "base.npy", base)
    np.save(d / "queries.npy", queries)
    datasets.write_fvecs(d / "queries.fvecs", queries)
    datasets.write_ivecs(d / "truth.ivecs", truth)
    return d, base, queries, truth


@pytest.fixture(scope="module")
def built(data):
    d, base, _, _ = data
    out = d / "base.kdx"
    p = run("build", d / "base.fvecs", out, "--threads", 2)
    assert "built 3,000 vectors" in p.stdout
    return out


def test_build_from_fvecs_writes_a_loadable_index(built, data):
    _, base, _, _ = data
    with kd.load(built) as index:
        assert len(index) == N and index.dim == DIM and index.metric == "l2"
        np.testing.assert_array_equal(index.get_vectors([0, 7]), base[[0, 7]])


def test_build_from_npy_with_options_and_ids(data, tmp_path):
    d, base, _, _ = data
    ids = np.arange(N, dtype=np.int64) * 3 + 100
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "ip.kdx"
    run("build", d / "base.npy", out, "--metric", "ip", "--m", 8, "--ef-construction", 40,
        "--quantization", "4bit", "--ids", tmp_path / "ids.npy", "--no-progress")
    with kd.load(out) as index:
        info = index.info()
        assert (info["metric"], info["m"], info["ef_construction"], info["quantization"]) == \
            ("ip", 8, 40, "4bit")
        _, I = index.search(base[5], 1, exact=True)
        assert I[0] in ids


def test_build_from_bvecs(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (500, 8)).astype(np.uint8)
    datasets.write_bvecs(tmp_path / "b.bvecs", x)
    run("build", tmp_path / "b.bvecs", tmp_path / "b.kdx", "--limit", 300)
    with kd.load(tmp_path / "b.kdx") as index:
        assert len(index) == 300
        np.testing.assert_array_equal(index.get_vectors([299]), x[[299]].astype(np.float32))


def test_build_and_search_ann_hdf5(tmp_path, data):
    h5py = pytest.importorskip("h5py", reason="h5py is not installed")
    _, base, queries, truth = data
    path = tmp_path / "ann.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train", data=base[:1000])
        f.create_dataset("test", data=queries)
        f.create_dataset("neighbors", data=datasets.ground_truth(
            base[:1000], queries, 10, "cosine")[0].astype(np.int32))
        f.attrs["distance"] = "angular"
    run("build", path, tmp_path / "ann.kdx")
    with kd.load(tmp_path / "ann.kdx") as index:
        assert index.metric == "cosine" and len(index) == 1000
    p = run("search", tmp_path / "ann.kdx", path)
    recall = float(p.stdout.split("recall@10: ")[1].split()[0])
    assert recall >= 0.9


def test_build_progress_output(data, tmp_path):
    d, _, _, _ = data
    p = run("build", d / "base.npy", tmp_path / "p.kdx", "--progress")
    assert "3" in p.stderr and ("vec" in p.stderr or "%" in p.stderr)
    p = run("build", d / "base.npy", tmp_path / "q.kdx", "--no-progress")
    assert p.stderr == ""


def test_search_summary_recall_and_out(built, data, tmp_path):
    d, _, queries, truth = data
    out = tmp_path / "res.npz"
    p = run("search", built, d / "queries.npy", "--k", 10, "--gt", d / "truth.ivecs",
            "--out", out)
    assert "searched 50 queries, k=10" in p.stdout
    recall = float(p.stdout.split("recall@10: ")[1].split()[0])
    assert recall >= 0.9
    assert "reads per query" in p.stdout
    r = np.load(out)
    assert r["D"].shape == (NQ, 10) and r["D"].dtype == np.float32
    assert r["I"].shape == (NQ, 10) and r["I"].dtype == np.int64
    assert datasets.recall_at_k(r["I"], truth, 10) == pytest.approx(recall, abs=1e-4)


def test_search_exact_load_one_by_one(built, data):
    d, _, _, _ = data
    p = run("search", built, d / "queries.fvecs", "--k", 5, "--exact", "--load", "--one-by-one",
            "--gt", d / "truth.ivecs", "--limit", 20)
    assert "searched 20 queries, k=5" in p.stdout
    assert "recall@5: 1.0000" in p.stdout
    assert "p99" in p.stdout


def test_search_with_options(built, data):
    d, _, _, _ = data
    p = run("search", built, d / "queries.npy", "--ef", 100, "--oversample", 3,
            "--io-backend", "threads", "--threads", 1, "--io-depth", 8)
    assert "backend=threads" in p.stdout


def test_info_human_and_json(built):
    p = run("info", built)
    for word in ("count", "3,000", "io_backend", "alignment", "record_size",
                 "resident_bytes", "file_bytes", "KiB"):
        assert word in p.stdout, word
    info = json.loads(run("info", built, "--json").stdout)
    assert info["count"] == N and info["dim"] == DIM
    assert info["file_bytes"] == os.path.getsize(built)
    for key in ("io_backend", "alignment", "record_size", "resident_bytes", "fallbacks",
                "features"):
        assert key in info, key
    loaded = json.loads(run("info", built, "--json", "--load").stdout)
    assert loaded["storage"] == "memory"


def test_verify_ok_and_corrupt(built, data, tmp_path):
    _, base, _, _ = data
    p = run("verify", built)
    assert p.stdout.strip() == "ok"
    raw = bytearray(built.read_bytes())
    bad = tmp_path / "bad.kdx"
    bad.write_bytes(bytes(raw[: len(raw) // 2]))
    p = run("verify", bad, check=False)
    assert p.returncode != 0 and "ok" not in p.stdout
    assert "bad.kdx" in p.stderr
    # A flipped byte in a stored vector: open does not read the vectors,
    # verify does.
    at = bytes(raw).find(base[17].tobytes())
    assert at > 0
    raw[at + 5] ^= 0xFF
    bad.write_bytes(bytes(raw))
    p = run("verify", bad, check=False)
    assert p.returncode != 0, p.stdout


def test_errors_are_short_messages(data, tmp_path):
    d, _, _, _ = data
    p = run("search", tmp_path / "missing.kdx", d / "queries.npy", check=False)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr and "missing.kdx" in p.stderr
    p = run("build", tmp_path / "x.txt", tmp_path / "x.kdx", check=False)
    assert p.returncode == 1 and "x.txt" in p.stderr
    p = run("frobnicate", check=False)
    assert p.returncode == 2


def test_bench_runs_benchmarks_run_py_with_arguments(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "run.py").write_text(
        "import sys\nprint('bench args', sys.argv[1:])\nsys.exit(3)\n")
    p = run("bench", "--quick", "-k", 5, cwd=tmp_path, check=False)
    assert p.returncode == 3
    assert "bench args ['--quick', '-k', '5']" in p.stdout


def test_bench_without_suite_says_so(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_find_bench", lambda: None)
    assert cli.main(["bench"]) == 1
    assert "benchmarks/run.py not found" in capsys.readouterr().err


def test_console_script_entry_point(capsys):
    """The `knndirect` script named in pyproject.toml resolves to cli.main,
    which runs the command line in-process."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = os.path.join(os.path.dirname(__file__), os.pardir, "pyproject.toml")
    if not os.path.exists(pyproject):
        pytest.skip("no pyproject.toml beside the tests (installed package)")
    with open(pyproject, "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["knndirect"]
    module, _, attr = target.partition(":")
    assert getattr(__import__(module, fromlist=[attr]), attr) is cli.main
    with pytest.raises(SystemExit) as ei:
        cli.main(["--version"])
    assert ei.value.code == 0
    assert capsys.readouterr().out.strip() == "knndirect %s" % kd.__version__
    missing = os.path.join(os.sep, "nonexistent", "x.kdx")
    assert cli.main(["verify", missing]) == 1
    assert missing in capsys.readouterr().err
    p = run("--version")
    assert p.stdout.strip() == "knndirect %s" % kd.__version__


def _default_sigint():
    # A shell starts background jobs with SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored: give the child the terminal's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_build_exits_130_and_writes_nothing(tmp_path):
    x = datasets.clustered(200_000, 16, seed=5)
    np.save(tmp_path / "big.npy", x)
    out = tmp_path / "big.kdx"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "knndirect", "build", str(tmp_path / "big.npy"),
                             str(out), "--progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, preexec_fn=_default_sigint)
    try:
        # Wait for the first progress output: the build has started.
        first = os.read(proc.stderr.fileno(), 4096)
        assert first, "no progress output"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (stdout, stderr)
    assert b"interrupted" in stderr and b"not written" in stderr
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["big.npy"]

"""Packaging: Python range and extras in pyproject.toml, no CPU-specific
compiler flag in setup.py, the sdist carries the C sources, tests and the
example notebook, and the wheel ships the type stubs."""
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import knndirect as kd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(os.path.abspath(kd.__file__))


def _source(name):
    path = os.path.join(ROOT, name)
    if not os.path.isfile(path):
        pytest.skip(f"{name} is not here (tests run outside the source tree)")
    with open(path, encoding="utf-8") as f:
        return f.read()


def _pyproject():
    text = _source("pyproject.toml")
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            pytest.skip("no TOML parser (Python < 3.11 without tomli)")
    return tomllib.loads(text)


def test_features_keys():
    f = kd.features()
    assert set(f) >= {"io_uring", "avx2", "avx512", "simd", "format_version"}
    assert isinstance(f["io_uring"], bool) and isinstance(f["simd"], str)


def test_setup_py_never_targets_the_build_cpu():
    text = _source("setup.py")
    assert "-march" not in text and "-mtune" not in text and "native" not in text
    assert "KNNDIRECT_NO_URING" in text


def test_pyproject_python_range_and_extras():
    project = _pyproject()["project"]
    assert project["requires-python"] == ">=3.9"
    versions = {c.rsplit(":: ", 1)[1] for c in project["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert versions == {"3.9", "3.10", "3.11", "3.12", "3.13"}
    extras = project["optional-dependencies"]
    assert extras["hdf5"] == ["h5py"]
    assert "tqdm" in extras["progress"]
    assert {"pytest>=7", "h5py", "nbclient", "nbformat", "ipykernel"} <= set(extras["test"])
    assert project["scripts"]["knndirect"] == "knndirect.__main__:main"
    data = _pyproject()["tool"]["setuptools"]["package-data"]["knndirect"]
    assert "py.typed" in data and "*.pyi" in data


def test_installed_package_has_stubs_and_marker():
    for name in ("py.typed", "__init__.pyi", "_index.pyi", "datasets.pyi"):
        assert os.path.isfile(os.path.join(PKG, name)), name


def test_sdist_carries_c_sources_tests_and_notebook(tmp_path):
    """Build an sdist from a copy of the source tree (no isolation, so no
    downloads) and list it."""
    _source("MANIFEST.in")
    pytest.importorskip("setuptools", reason="setuptools is not installed")
    # Probe from tmp_path: a build/ folder in the current directory would
    # shadow the package.
    probe = subprocess.run([sys.executable, "-c", "import build.__main__"], cwd=tmp_path,
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("the 'build' package is not installed")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("*.so", "*.o", "__pycache__", "*.egg-info", "build",
                                    "dist", ".pytest_cache", "results")
    for name in ("csrc", "python", "tests", "examples"):
        if os.path.isdir(os.path.join(ROOT, name)):
            shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                        "--outdir", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    if r.returncode != 0 and "setuptools" in r.stdout + r.stderr and "version" in r.stderr:
        pytest.skip("installed setuptools is too old for pyproject's build requirement")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("knndirect-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    c_sources = {os.path.relpath(os.path.join(d, f), ROOT)
                 for d, _, fs in os.walk(os.path.join(ROOT, "csrc")) for f in fs
                 if f.endswith((".c", ".h"))}
    assert c_sources and c_sources <= names, sorted(c_sources - names)
    data_dir = os.path.join(ROOT, "tests", "data")
    data = {"tests/data/" + f for f in (os.listdir(data_dir) if os.path.isdir(data_dir) else ())
            if f.endswith((".kdx", ".npz"))}
    assert data <= names, sorted(data - names)
    for name in ("setup.py", "pyproject.toml", "README.md", "tests/conftest.py",
                 "python/knndirect/py.typed", "python/knndirect/_index.pyi",
                 "examples/quickstart.ipynb"):
        assert name in names, name
    assert not any(n.endswith(".so") for n in names)

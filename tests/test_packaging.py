"""Packaging: Python range and extras in pyproject.toml, no CPU-specific
compiler flag in setup.py, the sdist carries the C sources, tests and the
example notebook, and the wheel ships the type stubs."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import knndirect as kd
from conftest import repo_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(os.path.abspath(kd.__file__))


def _pyproject():
    text = repo_text("pyproject.toml")
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
    text = repo_text("setup.py")
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
    repo_text("MANIFEST.in")
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
    for name in ("csrc", "python", "tests", "examples", "docs"):
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
                 "examples/quickstart.ipynb", "csrc/cflags.txt", "docs/api.md",
                 "docs/format.md"):
        assert name in names, name
    assert not any(n.endswith(".so") for n in names)


# -- wheels: static liburing, cibuildwheel, the wheel check --------------------

def _setup_py_says(env):
    """Run `setup.py --name` (module level only: the liburing probe, no
    build) and return (exit status, its knndirect: lines)."""
    repo_text("setup.py")
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("KNNDIRECT_URING", "KNNDIRECT_LIBURING", "KNNDIRECT_NO_URING"))}
    full.update(env)
    r = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=full,
                       capture_output=True, text=True, timeout=120, check=False)
    return r.returncode, [line for line in (r.stdout + r.stderr).splitlines()
                          if line.startswith("knndirect:")]


def _liburing_archive():
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    found = subprocess.run([cc, "-print-file-name=liburing.a"], capture_output=True,
                           text=True, check=True).stdout.strip()
    if not (os.path.isabs(found) and os.path.isfile(found)):
        pytest.skip("liburing.a is not installed (liburing-dev)")
    return found


def test_setup_py_links_liburing_statically_when_it_can():
    _liburing_archive()
    pytest.importorskip("setuptools")
    rc, lines = _setup_py_says({})
    assert rc == 0 and any("linked statically" in line for line in lines), lines
    rc, lines = _setup_py_says({"KNNDIRECT_URING_STATIC": "0"})
    assert rc == 0 and any("liburing.so linked" in line for line in lines), lines
    rc, lines = _setup_py_says({"KNNDIRECT_NO_URING": "1"})
    assert rc == 0 and any("without io_uring" in line for line in lines), lines


def test_setup_py_static_required_fails_without_an_archive(tmp_path):
    pytest.importorskip("setuptools")
    rc, lines = _setup_py_says({"KNNDIRECT_URING_STATIC": "1",
                                "KNNDIRECT_LIBURING_A": str(tmp_path / "missing.a")})
    assert rc != 0 and any("KNNDIRECT_URING_STATIC=1" in line for line in lines), lines


def test_cibuildwheel_config():
    cfg = _pyproject()["tool"]["cibuildwheel"]
    built = {p.split("-")[0] for p in cfg["build"].split()}
    assert built == {"cp39", "cp310", "cp311", "cp312", "cp313"}
    linux = cfg["linux"]
    assert {"x86_64", "aarch64"} <= set(linux["archs"])
    assert "tools/install_liburing.sh" in linux["before-all"]
    assert os.path.isfile(os.path.join(ROOT, "tools", "install_liburing.sh"))
    assert linux["environment"]["KNNDIRECT_URING_STATIC"] == "1"
    assert "auditwheel repair" in linux["repair-wheel-command"]
    assert "pytest" in cfg["test-command"] and "test" in cfg["test-extras"]
    # never a CPU-specific flag in the wheel build either
    assert "march" not in json.dumps(cfg) and "native" not in json.dumps(cfg)


def test_manifest_ships_build_inputs_and_wheel_tools():
    text = repo_text("MANIFEST.in")
    assert "recursive-include csrc *.txt" in text
    assert "recursive-include tools" in text


def _check_wheel():
    path = os.path.join(ROOT, "tools", "check_wheel.py")
    if not os.path.isfile(path):
        pytest.skip("tools/ is not here (tests run outside the source tree)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_wheel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_wheel_reads_the_extension_and_judges_liburing(tmp_path):
    import zipfile

    from knndirect import _core

    cw = _check_wheel()
    with open(_core.__file__, "rb") as f:
        elf = f.read()
    deps = cw.needed(elf)
    assert any(d.startswith("libc.so") for d in deps), deps
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", _core.__file__], capture_output=True,
                             text=True, check=True).stdout
        assert deps == re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    name = os.path.basename(_core.__file__)
    wheel = tmp_path / "knndirect-0.1.0-cp3-cp3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("knndirect/" + name, elf)
    ok, line = cw.check(str(wheel))
    assert ok == (not any("liburing" in d for d in deps)), line
    bad = tmp_path / "knndirect-0.1.0-cp3-cp3-linux_x86_64.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("knndirect/" + name, elf)
    ok, line = cw.check(str(bad))
    assert not ok and "not manylinux" in line

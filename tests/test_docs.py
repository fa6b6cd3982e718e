"""Every public call has a docstring that names each of its parameters, and
the README carries the guides the issue tracker asked for."""
import inspect
import os

import pytest

import knndirect as kd
from knndirect import datasets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _public():
    for name in kd.__all__:
        obj = getattr(kd, name)
        if inspect.isfunction(obj):
            yield f"kd.{name}", obj
    for name in datasets.__all__:
        yield f"kd.datasets.{name}", getattr(datasets, name)
    yield "kd.Index", kd.Index
    for name, member in vars(kd.Index).items():
        if name.startswith("_") and name not in ("__len__",):
            continue
        if isinstance(member, property):
            yield f"Index.{name}", member.fget
        elif inspect.isfunction(member):
            yield f"Index.{name}", member


@pytest.mark.parametrize("name,obj", list(_public()), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_public_call_documents_its_parameters(name, obj):
    doc = inspect.getdoc(obj)
    assert doc and len(doc) > 10, f"{name} has no docstring"
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
    missing = [p for p in params if p not in doc]
    assert not missing, f"{name}: docstring does not mention {missing}"


def test_readme_has_the_guides():
    path = os.path.join(ROOT, "README.md")
    if not os.path.isfile(path):
        pytest.skip("README.md is not here")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for heading in ("## Command line", "## Coming from faiss, hnswlib or usearch", "## Tuning",
                    "## Larger than RAM", "## Containers and io_uring"):
        assert heading in text, heading
    for word in ("ef", "oversample", "io_depth", "threads", "preload", "read_bytes",
                 "record_size", "seccomp", "io_uring_disabled", "fallbacks"):
        assert word in text, word

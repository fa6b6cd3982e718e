"""Every public call has a docstring that names each of its parameters, and
the documentation (README.md plus docs/*.md) carries the guides the issue
tracker asked for, links every page from the README and cites nothing
outside the repository."""
import glob
import inspect
import os
import re

import pytest

import knndirect as kd
from knndirect import datasets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


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


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _documentation():
    """README.md and docs/*.md, by path relative to the root; skips where
    they are not shipped (an installed package without its source tree)."""
    if not os.path.isfile(README) or not DOCS:
        pytest.skip("README.md or docs/ is not here")
    return {os.path.relpath(p, ROOT): _read(p) for p in [README] + DOCS}


def test_documentation_has_the_guides():
    text = "\n".join(_documentation().values())
    for heading in ("## Command line", "## Coming from faiss, hnswlib or usearch", "## Tuning",
                    "## Larger than RAM", "## Containers and io_uring", "## Hardening"):
        assert re.search("^" + re.escape(heading) + "$", text, re.M), heading
    for word in ("ef", "oversample", "io_depth", "threads", "preload", "read_bytes",
                 "record_size", "seccomp", "io_uring_disabled", "fallbacks"):
        assert re.search(r"\b" + re.escape(word) + r"\b", text), word


def test_readme_links_every_docs_page():
    readme = _documentation()["README.md"]
    for path in DOCS:
        rel = os.path.relpath(path, ROOT)
        assert f"]({rel})" in readme or f"]({rel}#" in readme, f"README does not link {rel}"


def test_docs_cite_no_file_outside_the_repository():
    # The product specification lives outside the repository: docs/api.md
    # is the contract the documentation points to.
    for name, text in _documentation().items():
        assert "shared/SPEC.md" not in text, name
        assert not re.search(r"\]\([^)]*SPEC\.md", text), f"{name} links SPEC.md"


def _anchors(text):
    """GitHub's anchors of a page's headings: lower case, punctuation
    dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_docs_links_resolve():
    """Relative links between the pages, and to files of the repository,
    point at something that exists, down to the heading they name."""
    docs = _documentation()
    for name, text in docs.items():
        base = os.path.dirname(os.path.join(ROOT, name))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(base, file)) if file else os.path.join(ROOT, name)
            assert path.startswith(ROOT + os.sep), f"{name}: {target} leaves the repository"
            assert os.path.exists(path), f"{name}: {target} does not exist"
            if anchor and path.endswith(".md"):
                page = docs.get(os.path.relpath(path, ROOT)) or _read(path)
                assert anchor in _anchors(page), f"{name}: {target}: no such heading"

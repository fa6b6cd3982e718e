"""The mutation audit (tests/mutations/) stays runnable: every mutation's
anchors occur exactly once in its file, and every test it names exists. The
audit itself rebuilds the extension per mutation and is not a CI stage, so
without this check a refactor leaves its anchors stale (reported, not run)
until someone runs it by hand."""
import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "mutations"))

from conftest import repo_text  # noqa: E402
from mutations import MUTATIONS  # noqa: E402


@pytest.mark.parametrize("m", MUTATIONS, ids=[m["name"] for m in MUTATIONS])
def test_anchor_occurs_once(m):
    text = repo_text(m["file"])
    for i, (original, replacement) in enumerate(m["edits"], 1):
        assert original != replacement, f"{m['name']} edit {i} changes nothing"
        assert text.count(original) == 1, (
            f"{m['name']} edit {i}: anchor found {text.count(original)} times in {m['file']}")


def _test_names(path):
    full = os.path.join(ROOT, path)
    assert os.path.exists(full), f"{path} does not exist"
    with open(full, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {n.name for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}


@pytest.mark.parametrize("m", MUTATIONS, ids=[m["name"] for m in MUTATIONS])
def test_named_tests_exist(m):
    assert m["tests"], f"{m['name']} names no test"
    for node in m["tests"]:
        path, _, rest = node.partition("::")
        names = _test_names(path)
        if rest:
            func = rest.split("::")[-1].split("[")[0]
            assert func in names, f"{m['name']}: {node} names no test function"

"""examples/quickstart.ipynb runs headless from top to bottom (nbclient and
ipykernel; skipped, saying why, when they are missing), so it cannot rot."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "quickstart.ipynb")


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    if not os.path.isfile(NOTEBOOK):
        pytest.skip("examples/quickstart.ipynb is not here (installed without the source tree)")
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed "
                                   "(pip install 'knndirect[test]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed "
                                   "(pip install 'knndirect[test]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed "
                        "(pip install 'knndirect[test]')")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = []
    for cell in nb.cells:
        # A print may reach the notebook as several stream outputs (the
        # kernel flushes on its own clock): a cell's stream text is joined
        # as it was written.
        text.append("".join(out.get("text", "") for out in cell.get("outputs", [])
                            if out.get("output_type") == "stream"))
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
            text.append(str(out.get("data", {}).get("text/plain", "")))
            text.append(str(out.get("data", {}).get("text/html", "")))
    joined = "\n".join(text)
    assert "knndirect.Index" in joined          # the index displayed itself
    found = re.search(r"recall@10: ([0-9.]+)", joined)
    assert found, joined
    assert float(found.group(1)) >= 0.9

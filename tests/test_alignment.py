"""Direct-I/O alignment: records below, equal to and above 4 KiB, read on a
512-byte-aligned file and on one that behaves as 4 KiB-aligned
(KNNDIRECT_DIO_ALIGN, a test-only switch for a coarser device). A record at
least as large as the alignment is one aligned read straight into the result;
a smaller one is read as its aligned block and copied out."""
import numpy as np
import pytest

from conftest import build_saved, clustered, open_quiet, same_bytes

# dim -> record stride: 100 -> 512 B, 1024 -> 4096 B, 1100 -> 8192 B
DIMS = [100, 1024, 1100]


@pytest.fixture(scope="module", params=DIMS)
def saved(request, tmp_path_factory):
    d = request.param
    base = clustered(600, d, seed=7000 + d)
    return d, base, build_saved(tmp_path_factory, f"align{d}", base, m=8, ef_construction=40)


@pytest.mark.parametrize("align", [None, 4096])
@pytest.mark.parametrize("backend", ["auto", "threads", "pread"])
def test_reads_at_alignment(saved, monkeypatch, align, backend):
    d, base, path = saved
    if align:
        monkeypatch.setenv("KNNDIRECT_DIO_ALIGN", str(align))
    with open_quiet(path, backend) as idx:
        info = idx.info()
        if not info["direct_io"]:
            pytest.skip("this filesystem does not take O_DIRECT")
        assert info["alignment"] == (align or info["alignment"])
        rs = info["record_size"]
        ids = np.array([5, 599, 0, 5, 321])
        idx.stats(reset=True)
        assert same_bytes(idx.get_vectors(ids), base[ids])
        st = idx.stats()
        # one read per record, of the record or of the aligned block holding it
        assert st["read_ops"] == len(ids)
        assert st["read_bytes"] == len(ids) * max(rs, info["alignment"])
        q = base[:3] + 0.01
        D, I = idx.search(q, 5, exact=True)
        assert (I[:, 0] == np.arange(3)).all()
        idx.stats(reset=True)
        D2, I2 = idx.search(q, 5)
        st = idx.stats()
        assert st["read_bytes"] == st["rerank_vectors"] * max(rs, info["alignment"])
        assert (I2[:, 0] == np.arange(3)).all()


def test_alignment_switch_never_goes_below_the_device(saved, monkeypatch):
    _, _, path = saved
    monkeypatch.setenv("KNNDIRECT_DIO_ALIGN", "64")
    with open_quiet(path) as idx:
        if idx.info()["direct_io"]:
            assert idx.info()["alignment"] >= 512

"""Write the seed corpus of fuzz_container.c into tests/fuzz/corpus/.

Seeds are tiny indexes (a few dimensions, metrics and quantizations, 0 to 24
vectors, some removed) in the harness's compact form (sections without their
4 KiB padding; flags byte 2, or 3 to have the harness recompute checksums
after mutation), and a few raw prefixes of a file (flags byte 0).
Run: python tests/fuzz/make_corpus.py (deterministic; needs knndirect)."""
import os
import struct
import sys

import numpy as np

import knndirect as kd
from knndirect._container import TAIL_BYTES, read_layout

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def compact(data, flags):
    """flags byte, header, section count, (id, crc, len, bytes) per section, tail."""
    layout = read_layout(data)
    out = [bytes([flags]), data[:64], bytes([len(layout)])]
    for s in layout:
        out.append(struct.pack("<III", s.id, s.crc, s.length))
        out.append(data[s.offset:s.end])
    out.append(data[-TAIL_BYTES:])
    return b"".join(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.unlink(os.path.join(OUT, name))
    rng = np.random.default_rng(2024)
    cases = [(1, "l2", "1bit", 0), (1, "l2", "1bit", 5), (3, "ip", "4bit", 12),
             (8, "cosine", "8bit", 24), (8, "l2", "1bit", 24), (17, "l2", "4bit", 9),
             (5, "cosine", "1bit", 16)]
    total = 0
    for n_case, (dim, metric, quant, n) in enumerate(cases):
        idx = kd.Index(dim, metric, m=2, ef_construction=4, quantization=quant, seed=n_case)
        if n:
            x = rng.standard_normal((n, dim)).astype(np.float32)
            ids = None if n_case % 2 else rng.choice(10**6, size=n, replace=False) - 500000
            idx.add(x, ids)
            if n > 4:
                live = np.arange(n) if ids is None else ids
                idx.remove(live[:2])
        data = idx.to_bytes()
        for flags in (2, 3):
            seed = compact(data, flags)
            path = os.path.join(OUT, "idx-%d-%s-%s-%d-f%d" % (dim, metric, quant, n, flags))
            with open(path, "wb") as f:
                f.write(seed)
            total += len(seed)
        if n_case == 4:
            for cut in (8, 64, 4096 + 17):
                with open(os.path.join(OUT, "raw-prefix-%d" % cut), "wb") as f:
                    f.write(b"\0" + data[:cut])
                total += cut + 1
            # Header block and tail alone: the table points into nothing.
            raw = b"\0" + data[:4096] + data[-32:]
            with open(os.path.join(OUT, "raw-head-tail"), "wb") as f:
                f.write(raw)
            total += len(raw)
    print("%d seeds, %d bytes" % (len(os.listdir(OUT)), total), file=sys.stderr)


if __name__ == "__main__":
    main()

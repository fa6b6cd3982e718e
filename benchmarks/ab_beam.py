"""Insertion's two beams on one set, interleaved: the core's choice against
the beam over the 8-bit build codes forced (the core's test hook
_set_beam_rule), one fresh process a build (2 threads, M 16,
ef_construction 200, index seed 0), the order alternating every round.

    python benchmarks/ab_beam.py minilm-wordnet --rounds 5

Prints each side's build times and the median and range of the per-round
ratios (the core's choice over the build codes'), and the rounds it won.
Where the core picks the build codes too (the centres explain most of the
rows' spread, below 384 dimensions, or within the cache), both sides build
the same graph and the ratio is noise.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_tradeoff import timed_build  # noqa: E402

BEAMS = {0: "", -1: "8bit"}  # the core's choice; the build codes' beam forced


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    times = {0: [], -1: []}
    for r in range(args.rounds):
        for rule in (-1, 0) if r % 2 == 0 else (0, -1):
            times[rule].append(timed_build(args.dataset, 200, BEAMS[rule]))
    ratios = [a / b for a, b in zip(times[0], times[-1])]
    print(f"{args.dataset}: build s, build codes' beam: "
          f"{', '.join(f'{t:.2f}' for t in times[-1])}; the core's choice: "
          f"{', '.join(f'{t:.2f}' for t in times[0])}")
    print(f"ratio (choice / build codes): median {statistics.median(ratios):.3f}, "
          f"{min(ratios):.3f}-{max(ratios):.3f}, won {sum(x < 1 for x in ratios)} "
          f"of {args.rounds}")


if __name__ == "__main__":
    main()

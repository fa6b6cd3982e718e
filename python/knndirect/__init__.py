"""knndirect: k-nearest-neighbour search over indexes larger than RAM.

A 1-bit quantized HNSW graph is searched in RAM; the shortlist is re-scored
against full-precision float32 vectors fetched from SSD as one batch of
parallel O_DIRECT reads (io_uring, or a thread pool) straight into a NumPy
buffer, with the GIL released throughout.
"""
from ._core import CorruptIndexError
from ._index import Index, load, open, features
from ._collection import Collection, CollectionLockedError
from . import datasets

__all__ = ["Index", "Collection", "load", "open", "features", "datasets", "CorruptIndexError",
           "CollectionLockedError"]
__version__ = "0.1.0"

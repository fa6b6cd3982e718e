from . import datasets as datasets
from ._index import Index as Index, features as features, load as load, open as open

class CorruptIndexError(ValueError):
    """The index data is truncated, damaged or not a knndirect index at all."""

__all__ = ["Index", "load", "open", "features", "datasets", "CorruptIndexError"]
__version__: str

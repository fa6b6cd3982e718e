from . import datasets as datasets
from ._index import Index as Index, features as features, load as load, open as open
from ._collection import Collection as Collection, \
    CollectionLockedError as CollectionLockedError

class CorruptIndexError(ValueError):
    """The index data is truncated, damaged or not a knndirect index at all."""

__all__ = ["Index", "Collection", "load", "open", "features", "datasets", "CorruptIndexError",
           "CollectionLockedError"]
__version__: str

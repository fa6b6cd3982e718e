from . import datasets as datasets
from ._index import Index as Index, features as features, load as load, open as open

__all__ = ["Index", "load", "open", "features", "datasets"]
__version__: str

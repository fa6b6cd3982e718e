import os
from types import TracebackType
from typing import Any, Callable, Dict, Iterable, List, Literal, Optional, Protocol, \
    Tuple, Type, TypedDict, Union

import numpy as np
import numpy.typing as npt

_Metric = Literal["l2", "ip", "cosine"]
_Quantization = Literal["1bit", "1bit+4bit", "4bit", "8bit"]
_IOBackend = Literal["auto", "io_uring", "threads", "pread", "mmap"]
_PreloadSection = Literal["graph", "codes", "ids", "vectors"]
_ProgressCallback = Callable[[int, int], Optional[bool]]
_Progress = Union[None, bool, _ProgressCallback]
_IdsLike = Union[int, npt.ArrayLike]
_PathLike = Union[str, "os.PathLike[str]"]

class _Writable(Protocol):
    def write(self, data: bytes, /) -> Any: ...

class _Readable(Protocol):
    def read(self) -> bytes: ...

class _Features(TypedDict):
    io_uring: bool
    avx2: bool
    avx512: bool
    simd: str
    estimate: str
    refine: str
    format_version: int
    min_format_version: int

class _IndexInfo(TypedDict, total=False):
    dim: int
    metric: _Metric
    count: int
    slots: int
    quantization: _Quantization
    m: int
    ef_construction: int
    seed: int
    path: Optional[str]
    storage: Literal["memory", "disk"]
    io_backend: str
    direct_io: bool
    record_size: int
    code_size: int
    alignment: int
    resident_bytes: int
    default_oversample: float
    default_ef: int
    calibration: Optional[Dict[str, Any]]
    fallbacks: List[str]
    source: Literal["new", "path", "file", "bytes"]
    preload: List[str]

class _IndexStats(TypedDict):
    queries: int
    exact_queries: int
    read_ops: int
    read_bytes: int
    rerank_vectors: int
    early_reads: int
    early_unused: int
    refined: int
    scored: int
    io_wait_seconds: float
    graph_seconds: float
    rerank_seconds: float

METRICS: Dict[str, int]
QUANTIZATIONS: Dict[str, int]
IO_BACKENDS: Dict[str, int]
PRELOAD_SECTIONS: Dict[str, Tuple[int, ...]]
FALLBACK_WARNINGS: Dict[str, str]
ADD_CHUNK: int
CHUNK_BYTES: int
PROGRESS_CHUNK: int

def features() -> _Features: ...

class Index:
    def __init__(self, dim: int, metric: _Metric = ..., *, m: int = ...,
                 ef_construction: int = ..., quantization: _Quantization = ...,
                 seed: int = ...) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def metric(self) -> _Metric: ...
    def __len__(self) -> int: ...
    def add(self, vectors: npt.ArrayLike, ids: Optional[npt.ArrayLike] = ..., *,
            threads: Optional[int] = ..., progress: _Progress = ...) -> None: ...
    def remove(self, ids: _IdsLike) -> None: ...
    def search(self, queries: npt.ArrayLike, k: int = ..., *, ef: Optional[int] = ...,
               oversample: Optional[float] = ..., recall: Optional[float] = ...,
               rerank: bool = ...,
               filter: Optional[npt.ArrayLike] = ..., exact: bool = ...,
               threads: Optional[int] = ...
               ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def tune(self, queries: npt.ArrayLike, k: int = ..., *,
             threads: Optional[int] = ...) -> Dict[str, Any]: ...
    def get_vectors(self, ids: _IdsLike) -> npt.NDArray[np.float32]: ...
    def save(self, target: Union[_PathLike, _Writable]) -> None: ...
    def to_bytes(self) -> bytes: ...
    def verify(self) -> bool: ...
    def info(self) -> _IndexInfo: ...
    def stats(self, reset: bool = ...) -> _IndexStats: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Index": ...
    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None: ...
    def __reduce__(self) -> Tuple[Any, ...]: ...
    def _repr_html_(self) -> str: ...

def load(source: Union[_PathLike, _Readable, bytes, bytearray, memoryview, Any]) -> Index: ...
def open(path: _PathLike, *, direct_io: bool = ..., io_backend: _IOBackend = ...,
         io_depth: int = ..., preload: Union[_PreloadSection, Iterable[_PreloadSection], None] = ...,
         threads: Optional[int] = ...) -> Index: ...

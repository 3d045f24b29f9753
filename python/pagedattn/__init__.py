"""pagedattn: paged-KV-cache attention for LLM inference on CPU.

Functions over CPU torch tensors or numpy arrays (zero-copy): :func:`write_kv`,
:func:`paged_attention`, :func:`varlen_attention`, :func:`merge_states`, :func:`copy_blocks`,
:func:`swap_blocks`, run on a :class:`Context` (the library's thread pool); caches in either of
two element orders (``layout="rows"`` or ``"tiled"``, :func:`kv_layout_preferred`). Backend
classes shaped like an inference engine's: :class:`PagedAttentionBackend`,
:class:`PagedAttentionImpl`, :class:`PagedAttentionMetadata`,
:class:`PagedAttentionMetadataBuilder`.
"""

from importlib.metadata import PackageNotFoundError, version

from ._ext import library_version
from .backend import AttentionType, PagedAttentionBackend
from .functions import (
    LAYOUTS,
    Context,
    Error,
    copy_blocks,
    default_context,
    kv_layout_preferred,
    merge_states,
    paged_attention,
    swap_blocks,
    varlen_attention,
    write_kv,
)
from .impl import PagedAttentionImpl
from .metadata import PagedAttentionMetadata, PagedAttentionMetadataBuilder

try:
    __version__ = version("pagedattn")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = library_version

__all__ = [
    "LAYOUTS",
    "AttentionType",
    "Context",
    "Error",
    "PagedAttentionBackend",
    "PagedAttentionImpl",
    "PagedAttentionMetadata",
    "PagedAttentionMetadataBuilder",
    "__version__",
    "copy_blocks",
    "default_context",
    "kv_layout_preferred",
    "library_version",
    "merge_states",
    "paged_attention",
    "swap_blocks",
    "varlen_attention",
    "write_kv",
]

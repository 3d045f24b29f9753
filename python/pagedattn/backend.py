"""The backend description an engine asks of an attention backend, with answers from the
library (name, head sizes, cache shape), and its block operations."""

from __future__ import annotations

from typing import Any

from . import _ext, functions


class AttentionType:
    """Attention types, as the engines name them (plain strings, so they compare equal to the
    engines' own constants)."""

    DECODER = "decoder"
    """Causal self-attention; K/V live in the paged cache."""
    ENCODER = "encoder"
    """Bidirectional self-attention of an encoder-decoder model's encoder; no cache."""
    ENCODER_ONLY = "encoder_only"
    """Bidirectional self-attention of an encoder-only model; no cache."""
    ENCODER_DECODER = "encoder_decoder"
    """Cross-attention: decoder queries over the encoder's K/V in a cache."""


# pa_dtype values of the activation dtypes, by torch dtype name.
_ACTIVATION_CODES = {"float16": 1, "bfloat16": 2, "float32": 0}
# The engines' names for a cache of one of them (vLLM's cache_dtype).
_UNQUANTIZED_CACHE_DTYPES = tuple(_ACTIVATION_CODES)


class PagedAttentionBackend:
    """The engine-facing description of pagedattn (every method is static or a class method)."""

    accept_output_buffer: bool = True

    @staticmethod
    def get_name() -> str:
        return _ext.backend_name()

    @staticmethod
    def get_supported_dtypes() -> list[Any]:
        """The activation dtypes, as torch dtypes: float16, bfloat16, float32."""
        import torch

        return [
            getattr(torch, name)
            for name, code in _ACTIVATION_CODES.items()
            if _ext.dtype_is_supported(code)
        ]

    @staticmethod
    def validate_head_size(head_size: int) -> None:
        """Raises :class:`pagedattn.Error` (a ValueError) naming head_size and the supported
        range when the library cannot serve it."""
        _ext.validate_head_size(functions.as_int(head_size, "head_size"))

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, int, int]:
        """``(2, num_blocks, block_size * num_kv_heads * head_size)``: index 0 keys, 1 values;
        each block ``num_kv_heads`` tiles of ``block_size * head_size`` elements, in the
        impl's layout (``PagedAttentionImpl.cache_layout``: ``"rows"``, the tile
        ``[block_size, head_size]``, or ``"tiled"``); the shape is the same for both.
        cache_dtype_str: a ``kv_cache_dtype``, or the name of an unquantized cache dtype as the
        engines pass it ("float16", "bfloat16", "float32"); the shape is the same for all."""
        if cache_dtype_str not in _UNQUANTIZED_CACHE_DTYPES:
            functions.kv_cache_dtype_code(cache_dtype_str)
        sizes = []
        for name, value, least in (
            ("num_blocks", num_blocks, 0),
            ("block_size", block_size, 1),
            ("num_kv_heads", num_kv_heads, 1),
            ("head_size", head_size, None),
        ):
            value = functions.as_int(value, name)
            if least is not None and value < least:
                raise functions.invalid(f"{name} = {value} must be >= {least}")
            sizes.append(value)
        _ext.validate_head_size(sizes[3])
        return _ext.kv_cache_shape(*sizes)

    @staticmethod
    def get_impl_cls() -> type:
        from .impl import PagedAttentionImpl

        return PagedAttentionImpl

    @staticmethod
    def get_metadata_cls() -> type:
        from .metadata import PagedAttentionMetadata

        return PagedAttentionMetadata

    @staticmethod
    def get_builder_cls() -> type:
        from .metadata import PagedAttentionMetadataBuilder

        return PagedAttentionMetadataBuilder

    @staticmethod
    def swap_blocks(src_kv_cache: Any, dst_kv_cache: Any, src_to_dst: Any) -> None:
        """Copies blocks ``src_to_dst`` (int64 ``[n, 2]`` or a dict) from one cache to another
        of the same geometry, keys and values. Whole blocks are copied as stored, so this
        serves caches of either layout as long as both caches' readers use the same one
        (:func:`pagedattn.swap_blocks` with ``layout=`` / ``dst_layout=`` checks that)."""
        functions.swap_blocks(src_kv_cache, dst_kv_cache, src_to_dst)

    @staticmethod
    def copy_blocks(kv_caches: Any, src_to_dists: Any) -> None:
        """Copies blocks within every layer's cache (copy-on-write); whole blocks are copied as
        stored, so this serves caches of either layout."""
        functions.copy_blocks(kv_caches, src_to_dists)

    @staticmethod
    def use_cascade_attention(*args: Any, **kwargs: Any) -> bool:
        return False

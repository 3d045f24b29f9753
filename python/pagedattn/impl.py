"""The attention layer's implementation, shaped like the engines' backend impls: one
``forward`` per layer and step, for a batch mixing prefills, chunked prefills and decodes."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _ext
from .backend import AttentionType
from .functions import (
    LAYOUTS,
    Context,
    attn_type_code,
    cache_dtype_name,
    check_tensor,
    default_context,
    invalid,
    kv_cache_dtype_code,
    kv_layout_preferred,
    layer_ints,
)
from .metadata import PagedAttentionMetadata, step_key

Tensor = Any

_FP8_NAMES = ("fp8_e4m3", "fp8_e5m2")


def _scale_key(scale: Any, name: str) -> Any:
    """What identifies a scale's value: a torch tensor and its version (so that an engine
    recalibrating its scale in place is seen without reading it), else the value itself (a
    number or a numpy scalar or 0-d array)."""
    version = getattr(scale, "_version", None)
    if version is not None:
        return (id(scale), version)
    return _scale_value(scale, name)


def _scale_value(scale: Any, name: str) -> float:
    """A scale as a float (a number, or a one-element tensor or array)."""
    try:
        return float(scale)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a number or a one-element tensor, not {type(scale).__name__}"
        ) from None


class PagedAttentionImpl:
    """One attention layer.

    num_heads, head_size, scale: the layer's; num_kv_heads None means num_heads; alibi_slopes,
    sinks: ``[num_heads]`` floats or None; sliding_window, logits_soft_cap: None or 0 for none;
    kv_cache_dtype: "auto", "fp8", "fp8_e4m3" or "fp8_e5m2"; attn_type: an
    :class:`AttentionType`; kv_sharing_target_layer_name: the layer whose cache this one reads
    (it then writes none); ctx: the context to run on (None: the process's default).
    A configuration the library cannot serve raises here, not at the first forward.

    kv_cache_layout: the order of the elements inside the cache's tiles, ``"rows"`` (the
    default: the C API's block layout, which PYTHON.md's cache has and what
    :func:`pagedattn.write_kv` and the functions read and write), ``"tiled"`` (block_size and
    head_size multiples of 16) or ``"auto"``:
    :func:`pagedattn.kv_layout_preferred` for the first step's activation dtype, the cache's
    dtype, block size and head size, the layout this machine's kernels read fastest. The
    choice is made at the first forward over a non-empty cache and kept for the impl's life
    (``cache_layout`` says it; None before). Only this impl's forward gives the cache's bytes
    a meaning: a cache written in one layout must be read in the same, so layers that share a
    cache (``kv_sharing_target_layer_name``) need the same kv_cache_layout ("auto" resolves
    alike for alike caches), and anything else that reads the tensor must untile it.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: Any = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: Any = None,
        ctx: Context | None = None,
        kv_cache_layout: str = "rows",
    ) -> None:
        if kv_cache_layout != "auto" and kv_cache_layout not in LAYOUTS:
            raise invalid(f"kv_cache_layout = {kv_cache_layout!r} is not 'auto', 'rows' or 'tiled'")
        num_heads, num_kv_heads, head_size, window = layer_ints(
            num_heads, num_kv_heads, head_size, sliding_window
        )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale) if scale is not None else head_size**-0.5
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self._cache_code = kv_cache_dtype_code(kv_cache_dtype)
        self._layer = _ext.Layer(
            num_heads,
            self.num_kv_heads,
            head_size,
            self.scale,
            alibi_slopes,
            window,
            logits_soft_cap or 0.0,
            sinks,
            attn_type_code(attn_type),
        )
        self._ctx = ctx if ctx is not None else default_context()
        self._geometry = (num_heads, self.num_kv_heads, head_size)
        self._paged = attn_type in (AttentionType.DECODER, AttentionType.ENCODER_DECODER)
        self._cross = attn_type == AttentionType.ENCODER_DECODER
        self._step_key = step_key(self._ctx, self._geometry, self._cross)
        self._writes = kv_sharing_target_layer_name is None
        self.kv_cache_layout = kv_cache_layout
        # The layout in use: kv_cache_layout, or what "auto" chose at the first cache.
        self.cache_layout: str | None = None if kv_cache_layout == "auto" else kv_cache_layout
        # The last cache seen: (kv_cache, its data pointer, scale keys (None unless FP8),
        # KVCache or None if empty).
        self._cache_entry: tuple | None = None

    def _scale_keys(self, layer: Any) -> tuple[Any, Any]:
        if layer is None:
            return (1.0, 1.0)
        return (
            _scale_key(layer._k_scale, "layer._k_scale"),
            _scale_key(layer._v_scale, "layer._v_scale"),
        )

    def _choose_layout(self, query: Tensor, kv_cache: Tensor) -> str:
        """What "auto" means for this cache: the layout the kernels read fastest for the
        activations' dtype, the cache's dtype and geometry ("rows" where the cache cannot be
        described: making its view then says why)."""
        per_block = self.num_kv_heads * self.head_size
        cache_dtype = cache_dtype_name(kv_cache.dtype, self.kv_cache_dtype)
        if kv_cache.ndim != 3 or kv_cache.shape[2] % per_block or cache_dtype is None:
            return "rows"
        return kv_layout_preferred(
            query.dtype, cache_dtype, kv_cache.shape[2] // per_block, self.head_size, ctx=self._ctx
        )

    def _library_cache(self, kv_cache: Tensor, layer: Any, query: Tensor) -> _ext.KVCache | None:
        """The library's view of the backend cache ``[2, num_blocks, block_size * num_kv_heads *
        head_size]`` (None for an empty one: a profiling run), remembered with what it was
        made from: the tensor, its data pointer and (FP8) the layer's scales. The first one
        fixes the layout for the impl's life."""
        # FP8 bytes by kv_cache_dtype, or an FP8 tensor under "auto": scaled either way.
        fp8 = cache_dtype_name(kv_cache.dtype, self.kv_cache_dtype) in _FP8_NAMES
        scales = (1.0, 1.0)
        if fp8 and layer is not None:
            scales = (
                _scale_value(layer._k_scale, "layer._k_scale"),
                _scale_value(layer._v_scale, "layer._v_scale"),
            )
        cache = None
        if _elements(kv_cache) > 0:
            if self.cache_layout is None:
                self.cache_layout = self._choose_layout(query, kv_cache)
            cache = _ext.KVCache.combined(
                kv_cache,
                self.num_kv_heads,
                self.head_size,
                self._cache_code,
                *scales,
                self.cache_layout,
            )
        keys = self._scale_keys(layer) if fp8 else None
        self._cache_entry = (kv_cache, _address(kv_cache), keys, cache)
        return cache

    def forward(
        self,
        layer: Any,
        query: Tensor,
        key: Tensor | None,
        value: Tensor | None,
        kv_cache: Tensor,
        attn_metadata: PagedAttentionMetadata | None,
        output: Tensor | None = None,
    ) -> Tensor:
        """Attention of one layer for the step.

        query: ``[num_tokens, num_heads * head_size]`` (or ``[num_tokens, num_heads,
        head_size]``), rows may be strided (a view into fused QKV); key, value: ``[num_tokens,
        num_kv_heads * head_size]`` or None (nothing to write), of the query's dtype; kv_cache:
        ``[2, num_blocks, block_size * num_kv_heads * head_size]`` (the activation dtype, float32,
        float16, bfloat16, or FP8 bytes per kv_cache_dtype; its tiles in ``cache_layout``) or
        empty (profiling); layer: None or an object with ``_k_scale`` / ``_v_scale``. Writes
        key/value into the cache (decoder: through ``slot_mapping``; cross-attention:
        ``cross_slot_mapping``), then attends. Returns ``output`` (written in place when given;
        a new one holds zeros in rows past the batch's) as ``[num_tokens, num_heads * head_size]``.
        """
        if attn_metadata is None:
            return query  # the engine's warm-up
        try:
            fresh = output is None
            if fresh:
                output = _empty_like_rows(query, self.num_heads * self.head_size)
            if self._paged:
                # The hot path: the cache view and the step's batch and plan are found, not made.
                entry = self._cache_entry
                if (
                    entry is not None
                    and entry[0] is kv_cache
                    and entry[1] == _address(kv_cache)
                    and (entry[2] is None or entry[2] == self._scale_keys(layer))
                ):
                    cache = entry[3]
                else:
                    cache = self._library_cache(kv_cache, layer, query)
                if cache is None:
                    written = self._without_cache(query, key, value, attn_metadata, output)
                else:
                    step = attn_metadata._objects.get(self._step_key)
                    if step is None:
                        step = attn_metadata.library_step(
                            self._step_key, self._ctx, self._layer, self._cross
                        )
                    if not self._writes:
                        key = value = None
                    written = _ext.forward(
                        self._ctx, self._layer, step[1], query, key, value, cache, step[0], output
                    )
            else:
                # Encoders attend over the batch's own rows.
                qsl = attn_metadata.query_start_loc
                written = _ext.varlen_attention(
                    self._ctx, self._layer, query, key, value, qsl, qsl, output, None
                )
            if fresh and written < output.shape[0]:
                output[written:] = 0  # padded rows, as the functions leave them
            return _as_rows(output)
        except AttributeError:
            # An argument of the wrong kind is named as such, found only once something failed
            # (no checks on the hot path).
            for name, arg, optional in (
                ("query", query, False),
                ("key", key, True),
                ("value", value, True),
                ("kv_cache", kv_cache, False),
                ("output", output, True),
            ):
                check_tensor(arg, name, optional)
            if not isinstance(attn_metadata, PagedAttentionMetadata):
                raise TypeError(
                    "attn_metadata must be a PagedAttentionMetadata or None, not "
                    f"{type(attn_metadata).__name__}"
                ) from None
            raise

    def _without_cache(
        self,
        query: Tensor,
        key: Tensor | None,
        value: Tensor | None,
        md: PagedAttentionMetadata,
        output: Tensor,
    ) -> int:
        """A profiling run's empty cache: every key must be one of the batch's new rows. Returns
        the rows written."""
        if key is None or value is None:
            raise invalid("kv_cache is empty and key/value are None: there are no keys to attend")
        if self._cross:
            import torch

            enc = md.encoder_seq_lens
            if enc is None:
                raise invalid("cross-attention needs encoder_seq_lens in the metadata")
            cu_k = torch.zeros(len(enc) + 1, dtype=torch.int32)
            torch.cumsum(torch.as_tensor(enc), 0, out=cu_k[1:])
        else:
            if not md._derived["all_keys_new"]:
                raise invalid(
                    "kv_cache is empty but some sequence has keys before its new tokens "
                    "(seq_lens > query lengths): they would come from the cache"
                )
            cu_k = md.query_start_loc
        return _ext.varlen_attention(
            self._ctx, self._layer, query, key, value, md.query_start_loc, cu_k, output, None
        )


def _elements(t: Any) -> int:
    """Elements of a torch tensor or a numpy array."""
    return int(t.numel()) if hasattr(t, "numel") else int(t.size)


def _address(t: Any) -> int:
    """Where a torch tensor's or a numpy array's data start."""
    return int(t.data_ptr()) if hasattr(t, "data_ptr") else int(t.ctypes.data)


def _empty_like_rows(query: Any, width: int) -> Any:
    """An uninitialised [rows, width] output of query's kind (torch or numpy) and dtype."""
    if isinstance(query, np.ndarray):
        return np.empty((query.shape[0], width), dtype=query.dtype)
    import torch

    return torch.empty((query.shape[0], width), dtype=query.dtype)


def _as_rows(output: Any) -> Any:
    """output as [rows, num_heads * head_size], the same memory (a 3-D output is dense in its
    last two dimensions: the library wrote it so)."""
    if output.ndim == 2:
        return output
    if isinstance(output, np.ndarray):
        return output.reshape(output.shape[0], -1)
    return output.view(output.shape[0], -1)

"""The vLLM attention impl: one layer's forward over vLLM's cache pages, through the library.

vLLM allocates each layer's cache tensor ``[num_blocks, num_kv_heads, block_size, 2 *
head_size]`` and hands it to the impl, which alone writes (in ``forward``) and reads it: vLLM
itself only zeroes, shares (prefix caching) and frees whole blocks. So the order inside each
(block, head) tile is the impl's to choose: ``PAGEDATTN_KV_LAYOUT`` = ``auto`` (the default:
:func:`pagedattn.kv_layout_preferred`, the layout the kernels read fastest for the layer's
dtypes and geometry), ``rows`` or ``tiled``. A layer keeps the layout its first step chose.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from .. import __version__, _ext
from ..functions import (
    ATTN_TYPES,
    LAYOUTS,
    Context,
    Error,
    cache_dtype_name,
    default_context,
    kv_layout_preferred,
    layer_ints,
)
from ..metadata import step_key
from .backend import KV_CACHE_DTYPES, PagedAttnMetadata

# Under "vllm." so that vLLM's handler prints it.
logger = init_logger("vllm.pagedattn")
_announced: set[str | None] = set()  # the layouts the log has named
_context: Context | None = None

LAYOUT_VARIABLE = "PAGEDATTN_KV_LAYOUT"

# kv_cache_dtype string -> the extension's code (-1: the cache tensor's own dtype).
_CACHE_CODES = {"fp8": 3, "fp8_e4m3": 3, "fp8_e5m2": 4}


def worker_context() -> Context:
    """The context of this worker's layers: on torch's OpenMP team, which vLLM binds to the
    worker's cores and on which the rest of the model runs (a pool of its own would spin
    against that team on the same cores); a pool of its own where no OpenMP runtime is loaded.
    """
    global _context
    if _context is None:
        try:
            _context = Context(threads="openmp")
        except Error as error:
            logger.warning("pagedattn: %s; running on a thread pool of its own", error)
            _context = default_context()
    return _context


def layout_setting() -> str:
    """``PAGEDATTN_KV_LAYOUT``: ``"auto"`` (unset or empty), ``"rows"`` or ``"tiled"``; another
    value is a ValueError naming the variable and the value."""
    raw = os.environ.get(LAYOUT_VARIABLE, "")
    value = raw.strip().lower() or "auto"
    if value != "auto" and value not in LAYOUTS:
        raise ValueError(
            f"pagedattn: the environment variable {LAYOUT_VARIABLE} = {raw!r} is not "
            "'rows', 'tiled' or 'auto'"
        )
    return value


def _announce(ctx: Context, layout: str | None) -> None:
    """The backend's log line, once per process and per layout in use (None: a layer with no
    cache, an encoder's)."""
    if layout in _announced or (layout is None and _announced):
        return
    _announced.add(layout)
    logger.info(
        "pagedattn: the PAGEDATTN backend %s serves CPU_ATTN (%d threads on %s, kernels %s, %s)",
        __version__,
        ctx.num_threads,
        "the OpenMP team" if ctx.threads == "openmp" else "its own pool",
        ctx.kernel_path,
        "no KV cache" if layout is None else f"KV cache layout {layout}",
    )


class PagedAttnImpl(AttentionImpl[PagedAttnMetadata]):
    """One attention layer. A configuration the library cannot serve raises ValueError here,
    at construction, naming what it refuses: the layer is never handed to another backend.

    ``kv_cache_layout`` is ``PAGEDATTN_KV_LAYOUT`` as it was at construction; ``cache_layout``
    the layout in use, chosen at the first step over the cache ("auto": for that step's
    activation dtype and the cache's dtype and block size) and kept for the layer's life.
    Layers that share a cache (``kv_sharing_target_layer_name``) choose alike.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **extra: Any,
    ) -> None:
        if extra:
            raise ValueError(f"pagedattn: unsupported attention arguments {sorted(extra)}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"pagedattn: kv_cache_dtype = {kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}"
            )
        if attn_type not in ATTN_TYPES:
            raise ValueError(
                f"pagedattn: attn_type = {attn_type!r} is not one of {list(ATTN_TYPES)}"
            )
        self.kv_cache_layout = layout_setting()
        self.cache_layout: str | None = (
            None if self.kv_cache_layout == "auto" else self.kv_cache_layout
        )
        num_heads, num_kv_heads, head_size, self._window = layer_ints(
            num_heads, num_kv_heads, head_size, sliding_window
        )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.ctx = worker_context()
        self._cache_code = _CACHE_CODES.get(kv_cache_dtype, -1)
        self._alibi_slopes = alibi_slopes
        # Sinks are the layer's weights: at construction their tensor holds whatever its
        # allocation held (NaN included), so the layer checked here takes zeros in their place,
        # and the one that serves takes their values once loaded (process_weights_after_loading,
        # or the first step for a caller that loads them otherwise), and again whenever the
        # tensor changes in place (a weight reload that skips process_weights_after_loading).
        self._sinks = sinks
        self._sinks_version: int | None = None  # the tensor's _version the copy was made from
        # Decoder layers of a non-causal batch (vLLM's bidirectional decoders) see every key
        # of their sequence, or those of a window on both sides as vLLM's CPU_ATTN masks them:
        # the library's encoder-only masking over the cache, made when first needed.
        self._bidirectional: Any = None
        try:
            self.layer = self._make_layer(attn_type)
        except ValueError as error:
            raise ValueError(f"pagedattn cannot serve this attention layer: {error}") from error
        self.step_key = step_key(self.ctx, (num_heads, self.num_kv_heads, head_size), False)
        self._paged = attn_type in (AttentionType.DECODER, AttentionType.ENCODER_DECODER)
        self._writes = kv_sharing_target_layer_name is None
        self._cache_entry: tuple | None = None

    def _make_layer(self, attn_type: str) -> Any:
        sinks = None
        if self._sinks is not None:
            # Zeros of the sinks' own length until loaded, so that a wrong length is refused
            # at construction.
            sinks = (
                self._sinks.float().tolist()
                if self._sinks_version is not None
                else [0.0] * int(self._sinks.numel())
            )
        if attn_type == AttentionType.ENCODER:
            # vLLM's CPU_ATTN masks every non-causal window on both sides of a query, an
            # encoder's too: the library's encoder-only masking (the two differ in nothing
            # else).
            attn_type = AttentionType.ENCODER_ONLY
        return _ext.Layer(
            self.num_heads,
            self.num_kv_heads,
            self.head_size,
            self.scale,
            self._alibi_slopes,
            self._window,
            self.logits_soft_cap or 0.0,
            sinks,
            ATTN_TYPES[attn_type],
        )

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """Sinks are the layer's weights, loaded after construction: the library's copy of
        them is made from the loaded values (non-finite ones raise pagedattn.Error)."""
        if self._sinks is not None:
            self._sinks_version = self._sinks._version
            self.layer = self._make_layer(self.attn_type)
            self._bidirectional = None

    def _choose_layout(self, query: torch.Tensor, kv_cache: torch.Tensor) -> str:
        """What "auto" means for these pages: the layout the kernels read fastest for the
        activations' dtype, the cache's dtype and block size ("rows" where the pages cannot be
        described: making their view then says why)."""
        cache_dtype = cache_dtype_name(kv_cache.dtype, self.kv_cache_dtype)
        if kv_cache.dim() != 4 or cache_dtype is None:
            return "rows"
        return kv_layout_preferred(
            query.dtype, cache_dtype, kv_cache.shape[2], self.head_size, ctx=self.ctx
        )

    def _pages(self, kv_cache: torch.Tensor, layer: Any, like: torch.Tensor) -> Any:
        """The library's view of the layer's pages: the one remembered for this tensor, its
        data pointer and (FP8) the layer's scales, else a new one (the first fixes the layout,
        from `like`'s activation dtype)."""
        entry = self._cache_entry
        if (
            entry is not None
            and entry[0] is kv_cache
            and entry[1] == kv_cache.data_ptr()
            and (self._cache_code == -1 or entry[2] == (layer._k_scale_float, layer._v_scale_float))
        ):
            return entry[3]
        scales = (1.0, 1.0)
        if self._cache_code != -1:
            scales = (float(layer._k_scale_float), float(layer._v_scale_float))
        if self.cache_layout is None:
            self.cache_layout = self._choose_layout(like, kv_cache)
        cache = _ext.KVCache.pages(
            kv_cache, self.head_size, self._cache_code, *scales, self.cache_layout
        )
        self._cache_entry = (kv_cache, kv_cache.data_ptr(), scales, cache)
        _announce(self.ctx, self.cache_layout)
        return cache

    def _layer_for(self, causal: bool) -> Any:
        if causal or self.attn_type != AttentionType.DECODER:
            return self.layer
        if self._bidirectional is None:
            self._bidirectional = self._make_layer(AttentionType.ENCODER_ONLY)
        return self._bidirectional

    def do_kv_cache_update(
        self,
        layer: Any,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Writes key/value [T, num_kv_heads, head_size] into the pages through slot_mapping
        (int64 [T], negative: padding), in ``cache_layout``, for callers that fill a layer's
        cache apart from its forward (vLLM's DFlash drafter). Encoder layers have no cache."""
        if self._paged:
            _ext.write_kv(self.ctx, self._pages(kv_cache, layer, key), key, value, slot_mapping)

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: PagedAttnMetadata | None,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, num_heads, head_size], key/value [T, num_kv_heads, head_size] or None,
        kv_cache [num_blocks, num_kv_heads, block_size, 2 * head_size] (empty for encoders;
        each (block, head) page its K tile then its V tile, in ``cache_layout``), output [T,
        num_heads, head_size]: writes the new K/V (decoder and cross-attention layers), then
        attends; rows past the batch's are left as they are."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("pagedattn: fused output quantization is not supported")
        if attn_metadata is None:
            return output  # the engine's warm-up
        sinks = self._sinks
        if sinks is not None and sinks._version != self._sinks_version:
            self.process_weights_after_loading(query.dtype)
        md = attn_metadata
        if not self._paged:  # encoders: bidirectional over the batch's own rows
            if not _announced:
                _announce(self.ctx, None)
            qsl = md.query_start_loc
            _ext.varlen_attention(self.ctx, self.layer, query, key, value, qsl, qsl, output, None)
            return output
        cache = self._pages(kv_cache, layer, query)
        plan = md.plans.get(self.step_key)
        if plan is None:
            plan = md.plans[self.step_key] = _ext.Plan(self.ctx, self.layer, md.batch)
        if not self._writes:
            key = value = None
        lib_layer = self.layer if md.causal else self._layer_for(False)
        _ext.forward(self.ctx, lib_layer, plan, query, key, value, cache, md.batch, output)
        return output

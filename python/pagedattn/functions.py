"""pagedattn's functions over tensors: write K/V into a paged cache, attend over it or over
dense ragged K/V, merge partial results, copy and swap blocks.

Tensors are CPU ``torch.Tensor``s or numpy arrays, read and written in place: an argument the
library cannot use as it is (another device, a wrong dtype, a non-unit stride in its last
dimension) raises :class:`pagedattn.Error`; nothing is ever copied. See ``PYTHON.md`` for the
contract.

Cache layouts: a cache's ``[block_size, head_size]`` tiles hold their elements in one of two
orders, named by ``layout=``. ``"rows"`` (the default, ``PA_KV_ROWS``): token t's element e at
``t * head_size + e``, so a ``[num_blocks, num_kv_heads, block_size, head_size]`` view indexes
tokens and elements. ``"tiled"`` (``PA_KV_TILED``): the order AMX tiles load without packing,
keys in 16-token groups of element pairs, values in 16-element groups of token pairs
(``include/pagedattn.h`` gives the formula); it needs block_size and head_size multiples of 16.
The tensors' shapes and strides are the same for both; the view's indices then no longer name
tokens and elements. The bytes of a cache mean something only in the layout they were written
in: every call that writes or reads one cache must pass the same ``layout``.
:func:`kv_layout_preferred` says which layout this machine's kernels read fastest.
"""

from __future__ import annotations

import operator
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _ext
from ._ext import Context, Error

__all__ = [
    "LAYOUTS",
    "Context",
    "Error",
    "copy_blocks",
    "default_context",
    "kv_layout_preferred",
    "merge_states",
    "paged_attention",
    "swap_blocks",
    "varlen_attention",
    "write_kv",
]

Tensor = Any  # a torch.Tensor or a numpy.ndarray

# pa_dtype values of the FP8 formats, and pa_attn_type values.
_FP8_E4M3, _FP8_E5M2 = 3, 4
KV_CACHE_DTYPES = {"auto": -1, "fp8": _FP8_E4M3, "fp8_e4m3": _FP8_E4M3, "fp8_e5m2": _FP8_E5M2}
ATTN_TYPES = {"decoder": 0, "encoder": 1, "encoder_only": 2, "encoder_decoder": 3}
LAYOUTS = ("rows", "tiled")
"""The cache layouts, as ``layout=`` names them: ``PA_KV_ROWS`` and ``PA_KV_TILED``."""

# The library's dtype names, by the names torch, numpy and kv_cache_dtype give them.
_DTYPE_NAMES = {
    "float32": "f32",
    "f32": "f32",
    "float16": "f16",
    "f16": "f16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2",
}


def invalid(message: str) -> Error:
    """A :class:`pagedattn.Error` with status ``"invalid_argument"``."""
    error = Error(message)
    error.status = "invalid_argument"
    return error


def kv_cache_dtype_code(kv_cache_dtype: str) -> int:
    """The extension's code for a ``kv_cache_dtype`` string."""
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype must be a str, not {type(kv_cache_dtype).__name__}")
    try:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    except (KeyError, TypeError):
        raise invalid(
            f"kv_cache_dtype = {kv_cache_dtype!r} is not one of "
            f"{', '.join(map(repr, KV_CACHE_DTYPES))}"
        ) from None


def dtype_name(dtype: Any, name: str) -> str:
    """The library's name (``"f32"``, ``"f16"``, ``"bf16"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``) of
    a torch dtype, a numpy dtype or a name (``"bfloat16"``, ``"bf16"``, ``"fp8"``, ...)."""
    if isinstance(dtype, str):
        key = dtype.removeprefix("torch.")
    elif type(dtype).__module__ == "torch":  # a torch.dtype: "torch.bfloat16"
        key = str(dtype).removeprefix("torch.")
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    found = _DTYPE_NAMES.get(key)
    if found is None:
        hint = ""
        if key == "uint8":
            hint = " (a uint8 cache holds FP8 bytes: name the format, 'fp8_e4m3' or 'fp8_e5m2')"
        raise invalid(
            f"{name} = {dtype!r} is not float32, float16, bfloat16, fp8_e4m3 or fp8_e5m2{hint}"
        )
    return found


def kv_layout_preferred(
    act_dtype: Any,
    cache_dtype: Any,
    block_size: int,
    head_size: int,
    *,
    ctx: Context | None = None,
) -> str:
    """The cache layout (``"rows"`` or ``"tiled"``) whose reads are fastest on the context's
    kernel path (``pa_kv_layout_preferred``) for activations of ``act_dtype`` over a cache of
    ``cache_dtype`` with this block size and head size: ``"tiled"`` where the kernels read the
    tiles in place (the ``amx`` path: bf16 activations over a bf16 or FP8 cache, f16 over an
    FP8 cache, head sizes multiples of 32), ``"rows"`` elsewhere and for a geometry a tiled
    cache cannot have. Dtypes: torch or numpy dtypes or
    names (``"bfloat16"``, ``"bf16"``, ``"fp8_e4m3"``, ...); an FP8 cache is named by its
    format (``"fp8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``), not ``uint8``.

    Both layouts give the same results on every path; this only picks the faster one.
    """
    ctx = ctx or default_context()
    return ctx.kv_layout_preferred(
        dtype_name(act_dtype, "act_dtype"),
        dtype_name(cache_dtype, "cache_dtype"),
        operator.index(block_size),
        operator.index(head_size),
    )


def cache_dtype_name(tensor_dtype: Any, kv_cache_dtype: str) -> str | None:
    """The library's name of what a cache tensor of ``tensor_dtype`` holds under
    ``kv_cache_dtype`` (None where that is not a cache dtype: the call that uses the cache
    says why)."""
    if kv_cache_dtype != "auto":
        return _DTYPE_NAMES.get(kv_cache_dtype)
    try:
        return dtype_name(tensor_dtype, "cache_dtype")
    except Error:
        return None


def attn_type_code(attn_type: str) -> int:
    """The library's pa_attn_type for an attention type name (``AttentionType`` values)."""
    if not isinstance(attn_type, str):
        raise TypeError(f"attn_type must be a str, not {type(attn_type).__name__}")
    try:
        return ATTN_TYPES[attn_type]
    except (KeyError, TypeError):
        raise invalid(
            f"attn_type = {attn_type!r} is not one of {', '.join(map(repr, ATTN_TYPES))}"
        ) from None


_default_lock = threading.Lock()
_default_context: Context | None = None


def default_context() -> Context:
    """The per-process context that calls with ``ctx=None`` use, made on first use."""
    global _default_context
    ctx = _default_context
    if ctx is None:
        with _default_lock:
            if _default_context is None:
                _default_context = Context()
            ctx = _default_context
    return ctx


def _forget_default_context() -> None:
    # A forked child has none of the parent's pool threads: it makes its own context.
    global _default_context, _default_lock
    _default_context = None
    _default_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_context)


def as_int(value: Any, name: str) -> int:
    """An integer argument as a Python int: an int, a numpy integer or an integer 0-d tensor
    or array, not a bool (nor a bool tensor or array)."""
    is_bool = isinstance(value, (bool, np.bool_)) or "bool" in str(getattr(value, "dtype", ""))
    if not is_bool and getattr(value, "ndim", 0) == 0:
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an int, not {type(value).__name__}")


def layer_ints(
    num_heads: Any, num_kv_heads: Any, head_size: Any, sliding_window: Any
) -> tuple[int, int, int, int]:
    """A layer's integer settings as Python ints (see :func:`as_int`); num_kv_heads None is
    num_heads, sliding_window None is 0."""
    heads = as_int(num_heads, "num_heads")
    return (
        heads,
        heads if num_kv_heads is None else as_int(num_kv_heads, "num_kv_heads"),
        as_int(head_size, "head_size"),
        0 if sliding_window is None else as_int(sliding_window, "sliding_window"),
    )


def check_tensor(value: Any, name: str, optional: bool = False) -> None:
    """TypeError naming `name` unless `value` is a torch tensor or a numpy array (or None,
    where optional). torch, optional, is only asked once imported."""
    torch = sys.modules.get("torch")
    if (
        isinstance(value, np.ndarray)
        or (torch is not None and isinstance(value, torch.Tensor))
        or (optional and value is None)
    ):
        return
    kinds = (
        "a torch.Tensor, a numpy array or None" if optional else "a torch.Tensor or a numpy array"
    )
    raise TypeError(f"{name} must be {kinds}, not {type(value).__name__}") from None


def _shape(tensor: Tensor, name: str, ndim: int, layout: str) -> tuple[int, ...]:
    try:
        shape = tuple(tensor.shape)
    except AttributeError:
        raise TypeError(
            f"{name} must be a torch.Tensor or a numpy array, not {type(tensor).__name__}"
        ) from None
    if len(shape) != ndim:
        raise invalid(f"{name} has shape {list(shape)}; it must be {layout}")
    return shape


def _empty(like: Tensor, shape: tuple[int, ...], float32: bool = False) -> Tensor:
    """A new tensor of `like`'s kind (torch or numpy) and dtype (or float32)."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=np.float32 if float32 else like.dtype)
    import torch

    return torch.empty(shape, dtype=torch.float32 if float32 else like.dtype)


def _finish(out: Tensor, lse: Tensor | None, written: int, fresh: bool, fresh_lse: bool) -> None:
    # Rows past the batch's (a padded query) belong to no sequence: a new output holds zeros
    # there and -inf in its lse, as a row that sees no key does.
    if written < out.shape[0] and fresh:
        out[written:] = 0
    if lse is not None and written < lse.shape[0] and fresh_lse:
        lse[written:] = -np.inf


def _scale(value: Any, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a float or a 0-d tensor, not {type(value).__name__}"
        ) from None


def _opt(value: Any) -> Any:
    return 0 if value is None else value


_layers: dict[tuple, _ext.Layer] = {}
_layers_lock = threading.Lock()
_LAYER_CACHE_SIZE = 256


def layer_for(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    scale: float | None,
    attn_type: str,
    alibi_slopes: Any = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: Any = None,
) -> _ext.Layer:
    """The extension's Layer for these parameters; reused across calls when the layer has no
    per-head arrays (ALiBi slopes and sinks are read afresh at each call)."""
    code = attn_type_code(attn_type)
    scale = 0.0 if scale is None else scale
    num_heads, num_kv_heads, head_size, window = layer_ints(
        num_heads, num_kv_heads, head_size, sliding_window
    )
    cap = _opt(logits_soft_cap)
    if alibi_slopes is not None or sinks is not None:
        return _ext.Layer(
            num_heads, num_kv_heads, head_size, scale, alibi_slopes, window, cap, sinks, code
        )
    key = (num_heads, num_kv_heads, head_size, scale, code, window, cap)
    layer = _layers.get(key)
    if layer is None:
        layer = _ext.Layer(num_heads, num_kv_heads, head_size, scale, None, window, cap, None, code)
        with _layers_lock:
            if len(_layers) >= _LAYER_CACHE_SIZE:
                _layers.clear()
            _layers[key] = layer
    return layer


def kv_cache(
    key_cache: Tensor,
    value_cache: Tensor | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    layout: str = "rows",
) -> _ext.KVCache:
    """The extension's KVCache over two ``[num_blocks, num_kv_heads, block_size, head_size]``
    views (``value_cache`` given), for attention and writes; ``layout``: the order inside each
    tile, ``"rows"`` or ``"tiled"`` (the library checks the geometry at the call)."""
    return _ext.KVCache(
        key_cache,
        value_cache,
        kv_cache_dtype_code(kv_cache_dtype),
        _scale(k_scale, "k_scale"),
        _scale(v_scale, "v_scale"),
        layout,
    )


def write_kv(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    *,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    ctx: Context | None = None,
    layout: str = "rows",
) -> None:
    """Writes new tokens' keys and values into the cache.

    key, value: ``[num_tokens, num_kv_heads, head_size]`` (rows may be strided) of an
    activation dtype; key_cache, value_cache: ``[num_blocks, num_kv_heads, block_size,
    head_size]``, any cache dtype; slot_mapping: int64 ``[num_tokens]``, ``block * block_size +
    offset``, negative for padding. FP8 caches store ``x / k_scale`` (``v_scale``). layout:
    the order inside each tile, ``"rows"`` or ``"tiled"`` (block_size and head_size multiples
    of 16); read the cache back in the same layout.
    """
    cache = kv_cache(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout)
    _ext.write_kv(ctx or default_context(), cache, key, value, slot_mapping)


def paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    block_tables: Tensor,
    *,
    scale: float | None = None,
    attn_type: str = "decoder",
    alibi_slopes: Any = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: Any = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    out: Tensor | None = None,
    return_lse: bool = False,
    ctx: Context | None = None,
    layout: str = "rows",
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of a batch of sequences over the paged cache: prefill, chunked prefill and
    decode mixed (``"decoder"``, causal), or cross-attention (``"encoder_decoder"``).

    query: ``[num_tokens, num_heads, head_size]`` (f32, f16 or bf16); key_cache, value_cache:
    ``[num_blocks, num_kv_heads, block_size, head_size]`` (any cache dtype), whose tiles hold
    their elements in ``layout`` (``"rows"`` or ``"tiled"``, the layout they were written in);
    sequence s owns rows ``query_start_loc[s]:query_start_loc[s + 1]`` (int32 ``[num_seqs +
    1]``) and has ``seq_lens[s]`` keys in the cache (int32, its new ones included), in the
    blocks of ``block_tables[s]`` (int32 ``[num_seqs, max_blocks]``, its rows dense, possibly
    the first columns of a wider table). Returns ``out`` (shaped as
    query, written in place when given) and, with ``return_lse``, the float32 ``[num_tokens,
    num_heads]`` natural-log softmax denominators.
    """
    _, num_heads, head_size = _shape(query, "query", 3, "[num_tokens, num_heads, head_size]")
    kv_heads = _shape(
        key_cache, "key_cache", 4, "[num_blocks, num_kv_heads, block_size, head_size]"
    )[1]
    layer = layer_for(
        num_heads, kv_heads, head_size, scale, attn_type, alibi_slopes, sliding_window,
        logits_soft_cap, sinks,
    )  # fmt: skip
    cache = kv_cache(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout)
    batch = _ext.Batch(query_start_loc, seq_lens, block_tables)
    fresh = out is None
    if fresh:
        out = _empty(query, query.shape)
    lse = _empty(query, (query.shape[0], num_heads), float32=True) if return_lse else None
    written = _ext.paged_attention(
        ctx or default_context(), layer, None, query, cache, batch, out, lse
    )
    _finish(out, lse, written, fresh, True)
    return (out, lse) if return_lse else out


def varlen_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *,
    scale: float | None = None,
    attn_type: str = "encoder_only",
    alibi_slopes: Any = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: Any = None,
    out: Tensor | None = None,
    return_lse: bool = False,
    ctx: Context | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention over dense ragged K/V (no cache): encoders, or a prefill whose K/V are at hand.

    query: ``[num_tokens, num_heads, head_size]``; key, value: ``[num_keys, num_kv_heads,
    head_size]``, the query's dtype; sequence s owns query rows ``cu_seqlens_q[s]:cu_seqlens_q[s
    + 1]`` and key rows ``cu_seqlens_k[s]:cu_seqlens_k[s + 1]`` (int32 ``[num_seqs + 1]`` each).
    ``"decoder"`` is causal with the last query aligned to the last key; the other types are
    bidirectional. Returns as :func:`paged_attention`.
    """
    _, num_heads, head_size = _shape(query, "query", 3, "[num_tokens, num_heads, head_size]")
    kv_heads = _shape(key, "key", 3, "[num_keys, num_kv_heads, head_size]")[1]
    layer = layer_for(
        num_heads, kv_heads, head_size, scale, attn_type, alibi_slopes, sliding_window,
        logits_soft_cap, sinks,
    )  # fmt: skip
    fresh = out is None
    if fresh:
        out = _empty(query, query.shape)
    lse = _empty(query, (query.shape[0], num_heads), float32=True) if return_lse else None
    written = _ext.varlen_attention(
        ctx or default_context(), layer, query, key, value, cu_seqlens_q, cu_seqlens_k, out, lse
    )
    _finish(out, lse, written, fresh, True)
    return (out, lse) if return_lse else out


def merge_states(
    out_a: Tensor,
    lse_a: Tensor,
    out_b: Tensor,
    lse_b: Tensor,
    *,
    out: Tensor | None = None,
    ctx: Context | None = None,
    lse: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Combines two partial attention results over disjoint key sets of the same rows.

    out_a, out_b: ``[num_tokens, num_heads, head_size]`` of one activation dtype; lse_a, lse_b:
    float32 ``[num_tokens, num_heads]``. Returns ``(out, lse)``; ``out`` may be ``out_a`` or
    ``out_b``, ``lse`` may be ``lse_a`` or ``lse_b`` (merged in place). A row whose lse is -inf
    on one side takes the other side's.
    """
    rows, num_heads, head_size = _shape(out_a, "out_a", 3, "[num_tokens, num_heads, head_size]")
    if out is None:
        out = _empty(out_a, out_a.shape)
    if lse is None:
        lse = _empty(out_a, (rows, num_heads), float32=True)
    _ext.merge_states(
        ctx or default_context(), num_heads, head_size, out_a, lse_a, out_b, lse_b, out, lse
    )
    return out, lse


def block_cache(cache: Any, name: str, layout: str = "rows") -> _ext.KVCache:
    """A cache for whole-block copies: the backend's ``[2, num_blocks, block_elements]`` tensor,
    or a ``(key_cache, value_cache)`` pair of 4-D views, in ``layout``."""
    if isinstance(cache, (tuple, list)):
        if len(cache) != 2:
            raise invalid(f"{name} has {len(cache)} tensors; a pair is (key_cache, value_cache)")
        check_tensor(cache[0], f"{name}[0]")
        check_tensor(cache[1], f"{name}[1]")
        code = -1 if str(cache[0].dtype) not in ("uint8", "torch.uint8") else _FP8_E4M3
        return _ext.KVCache(cache[0], cache[1], code, 1.0, 1.0, layout)
    shape = _shape(cache, name, 3, "[2, num_blocks, block_elements] or a (key, value) pair")
    code = -1 if str(cache.dtype) not in ("uint8", "torch.uint8") else _FP8_E4M3
    del shape
    # Whole blocks move as they are, whatever the order inside them: a block is seen as one
    # tile of one head, of one-element tokens (rows), or of 16-element tokens (tiled: a
    # geometry that layout can have, so that the library compares the layouts of a swap).
    token = 16 if layout == "tiled" else 1
    return _ext.KVCache.combined(cache, 1, token, code, 1.0, 1.0, layout)


def block_pairs(block_mapping: Any) -> Tensor:
    """int64 ``[n, 2]`` (source, destination) pairs from a tensor, a sequence of pairs, or a
    dict ``{src: dst}`` / ``{src: [dst, ...]}``; pairs take effect in this order."""
    pairs: list[tuple[int, int]] = []
    if isinstance(block_mapping, (str, bytes)):
        raise TypeError(
            "block_mapping must be an int64 [n, 2] tensor, a sequence of (source, destination) "
            f"pairs or a dict, not {type(block_mapping).__name__}"
        )
    if isinstance(block_mapping, Mapping):
        for src, dst in block_mapping.items():
            # A 0-d tensor or array is iterable as far as Iterable knows, yet one id.
            one = not isinstance(dst, Iterable) or getattr(dst, "ndim", None) == 0
            targets = (dst,) if one else dst
            pairs.extend(_block_pair((src, d), f"block_mapping[{src!r}]") for d in targets)
    elif isinstance(block_mapping, Sequence):
        pairs = [_block_pair(p, f"block_mapping[{i}]") for i, p in enumerate(block_mapping)]
    else:
        return block_mapping  # a tensor: the extension checks its shape and dtype
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def _block_pair(pair: Any, name: str) -> tuple[int, int]:
    """(source, destination) block ids, exactly two integers."""
    if not hasattr(pair, "__len__") or isinstance(pair, (str, bytes)):
        raise TypeError(f"{name} = {pair!r} must be a (source, destination) pair of block ids")
    if len(pair) != 2:
        raise invalid(f"{name} = {pair!r} is not a (source, destination) pair of block ids")
    try:
        src, dst = operator.index(pair[0]), operator.index(pair[1])
    except TypeError:
        raise TypeError(f"{name} = {pair!r} must hold integer block ids") from None
    limit = np.iinfo(np.int64)
    if not (limit.min <= src <= limit.max and limit.min <= dst <= limit.max):
        raise invalid(f"{name} = {pair!r} holds a block id outside int64")
    return src, dst


def copy_blocks(
    kv_caches: Sequence[Any],
    block_mapping: Any,
    *,
    ctx: Context | None = None,
    layout: str = "rows",
) -> None:
    """Copies blocks within each layer's cache (copy-on-write), keys and values.

    kv_caches: per-layer caches, each the backend's ``[2, num_blocks, block_size * num_kv_heads
    * head_size]`` tensor or a ``(key_cache, value_cache)`` pair of ``[num_blocks,
    num_kv_heads, block_size, head_size]`` views; block_mapping: see :func:`block_pairs`.
    Whole tiles are copied as stored, so a block keeps its meaning in either layout; layout
    (``"rows"`` or ``"tiled"``) is the caches', checked by the library against their geometry.
    """
    if not isinstance(kv_caches, Sequence) or isinstance(kv_caches, (str, bytes)):
        raise TypeError(
            f"kv_caches must be a list of per-layer caches, not {type(kv_caches).__name__}"
        )
    caches = [block_cache(c, f"kv_caches[{i}]", layout) for i, c in enumerate(kv_caches)]
    _ext.copy_blocks(ctx or default_context(), caches, block_pairs(block_mapping))


def swap_blocks(
    src_kv_cache: Any,
    dst_kv_cache: Any,
    block_mapping: Any,
    *,
    ctx: Context | None = None,
    layout: str = "rows",
    dst_layout: str | None = None,
) -> None:
    """Copies blocks from one cache to another of the same geometry and dtype (e.g. between a
    working pool and a swap pool); caches and mapping as in :func:`copy_blocks`. layout: the
    source's layout, dst_layout the destination's (None: the same). Blocks are copied as
    stored, so the library refuses caches of different layouts."""
    dst_layout = layout if dst_layout is None else dst_layout
    src = block_cache(src_kv_cache, "src_kv_cache", layout)
    dst = block_cache(dst_kv_cache, "dst_kv_cache", dst_layout)
    _check_swap_forms(src_kv_cache, dst_kv_cache, src, dst)
    _ext.swap_blocks(ctx or default_context(), src, dst, block_pairs(block_mapping))


def _check_swap_forms(src_kv_cache: Any, dst_kv_cache: Any, src: Any, dst: Any) -> None:
    """The mismatches of a swap that the library, which sees a backend tensor's blocks as
    tiles of a geometry made up for them (block_cache), would describe in those terms."""
    pair = isinstance(src_kv_cache, (tuple, list)), isinstance(dst_kv_cache, (tuple, list))
    if pair[0] != pair[1]:
        forms = ("a [2, num_blocks, block_elements] tensor", "a (key_cache, value_cache) pair")
        raise invalid(
            f"src_kv_cache is {forms[pair[0]]} and dst_kv_cache {forms[pair[1]]}: a swap "
            "copies blocks between caches of one form"
        )
    if pair[0]:
        return  # the pairs' own geometries are the library's to compare
    src_block, dst_block = (c.block_size * c.head_size for c in (src, dst))
    if src_block != dst_block or src.dtype != dst.dtype:
        raise invalid(
            f"dst_kv_cache holds blocks of {dst_block} {dst.dtype} elements, src_kv_cache "
            f"blocks of {src_block} {src.dtype} elements: a swap copies blocks as they are"
        )

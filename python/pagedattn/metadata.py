"""Per-step attention metadata, as the engines build it: where each sequence's queries are, how
many keys it has, its blocks, and where its new tokens go. One metadata object serves every
layer of the step; the library's batch and plan are made from it once and reused."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _ext
from .functions import Context, Error, as_int, check_tensor, invalid

Tensor = Any  # a torch.Tensor or a numpy.ndarray


def _values(tensor: Tensor | None) -> list[int]:
    return [] if tensor is None else [int(v) for v in tensor.tolist()]


# The fields, each a tensor; the optional ones may be None.
_OPTIONAL = ("encoder_seq_lens", "cross_block_tables", "cross_slot_mapping")
_FIELDS = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping", *_OPTIONAL)


@dataclass(eq=False)
class PagedAttentionMetadata:
    """The step's batch. Decoder self-attention reads ``seq_lens`` keys of sequence s from its
    ``block_tables`` row; cross-attention reads ``encoder_seq_lens`` keys from
    ``cross_block_tables``; encoders attend over the batch's own rows.

    Derived, read-only: ``num_seqs``, ``num_prefills`` (sequences with more than one new token),
    ``num_prefill_tokens``, ``num_decode_tokens`` (sequences with one), ``max_query_len``,
    ``max_seq_len``. The library's batch and plans over these tensors are made once, at the
    step's first layer: build a new object for a new step (a field assigned anew is seen, a
    tensor changed in place is not). Slots and block tables name tokens and blocks, whatever
    the cache's layout (``"rows"`` or ``"tiled"``): one metadata object and its plan serve
    layers of either.
    """

    query_start_loc: Tensor  # int32 [num_seqs + 1]
    seq_lens: Tensor  # int32 [num_seqs]: keys of each sequence, new ones included
    block_tables: Tensor  # int32 [num_seqs, max_blocks]
    slot_mapping: Tensor  # int64 [num_tokens]
    encoder_seq_lens: Tensor | None = None  # int32 [num_seqs]: ENCODER_DECODER keys
    cross_block_tables: Tensor | None = None  # int32 [num_seqs, max_blocks]
    cross_slot_mapping: Tensor | None = None  # int64 [num_encoder_tokens]

    def __post_init__(self) -> None:
        for name in _FIELDS:
            check_tensor(getattr(self, name), name, name in _OPTIONAL)
        self._derive()

    def __setattr__(self, name: str, value: Any) -> None:
        # A field assigned after construction: the derived values and the library's objects
        # follow it.
        anew = "_objects" in self.__dict__ and name in _FIELDS
        if anew:
            check_tensor(value, name, name in _OPTIONAL)
        object.__setattr__(self, name, value)
        if anew:
            self._derive()

    def _derive(self) -> None:
        """Computes the derived values and forgets the library's batch and plans (kept in
        ``_objects``, made again when next asked for)."""
        starts, lens = _values(self.query_start_loc), _values(self.seq_lens)
        query_lens = [b - a for a, b in itertools.pairwise(starts)]
        prefills = [q for q in query_lens if q > 1]
        derived = {
            "num_seqs": len(lens),
            "num_prefills": len(prefills),
            "num_prefill_tokens": sum(prefills),
            "num_decode_tokens": sum(1 for q in query_lens if q == 1),
            "max_query_len": max(query_lens, default=0),
            "max_seq_len": max(lens, default=0),
            "num_actual_tokens": starts[-1] if starts else 0,
            # Every key is a new token: attention needs no cache (a profiling run).
            "all_keys_new": int(query_lens == lens),
        }
        object.__setattr__(self, "_derived", derived)
        object.__setattr__(self, "_objects", {})

    num_seqs = property(lambda self: self._derived["num_seqs"])
    num_prefills = property(lambda self: self._derived["num_prefills"])
    num_prefill_tokens = property(lambda self: self._derived["num_prefill_tokens"])
    num_decode_tokens = property(lambda self: self._derived["num_decode_tokens"])
    max_query_len = property(lambda self: self._derived["max_query_len"])
    max_seq_len = property(lambda self: self._derived["max_seq_len"])

    def library_batch(self, cross: bool = False) -> _ext.Batch:
        """The library's batch over these tensors, with the slots the step's new K/V go to
        (cross: the encoder's keys and cross_slot_mapping), made once."""
        batch = self._objects.get(cross)
        if batch is None:
            if cross:
                if self.encoder_seq_lens is None or self.cross_block_tables is None:
                    raise invalid(
                        "cross-attention needs encoder_seq_lens and cross_block_tables in the "
                        "metadata"
                    )
                batch = _ext.Batch(
                    self.query_start_loc,
                    self.encoder_seq_lens,
                    self.cross_block_tables,
                    self.cross_slot_mapping,
                )
            else:
                batch = _ext.Batch(
                    self.query_start_loc, self.seq_lens, self.block_tables, self.slot_mapping
                )
            self._objects[cross] = batch
        return batch

    def library_step(self, key: object, ctx: Context, layer: _ext.Layer, cross: bool) -> tuple:
        """(batch, plan) for the layers that share `key` (see :func:`step_key`): made by the
        step's first such layer, found by the others."""
        step = self._objects.get(key)
        if step is None:
            batch = self.library_batch(cross)
            step = self._objects[key] = (batch, _ext.Plan(ctx, layer, batch))
        return step


# By context, weakly: a context (and its threads) goes when its last user does.
_step_keys: weakref.WeakKeyDictionary[Context, dict[tuple, object]] = weakref.WeakKeyDictionary()


def step_key(ctx: Context, geometry: tuple[int, int, int], cross: bool) -> object:
    """One key object per (context, (num_heads, num_kv_heads, head_size), self or cross
    attention), shared by every layer with them: a step's metadata keeps under it the batch
    and plan those layers use (an object hashes by identity, cheaper than a tuple at each
    call)."""
    return _step_keys.setdefault(ctx, {}).setdefault((geometry, cross), object())


def _tensor(values: np.ndarray) -> Tensor:
    try:
        import torch
    except ImportError:
        return values
    return torch.from_numpy(values)


def _int_array(values: Any, name: str, dtype: type) -> np.ndarray:
    if hasattr(values, "numpy") and not isinstance(values, np.ndarray):
        values = values.numpy()
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a list of ints or an integer tensor: {error}") from None
    if array.ndim == 0:
        raise TypeError(
            f"{name} must be a list of ints or an integer tensor, not {type(values).__name__}"
        )
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, not {array.dtype}")
    if array.size and not np.can_cast(array.dtype, dtype):
        limits = np.iinfo(dtype)
        outside = np.nonzero((array < limits.min) | (array > limits.max))
        if outside[0].size:
            at = tuple(int(i[0]) for i in outside)
            where = "".join(f"[{i}]" for i in at)
            raise _out_of_range(f"{name}{where} = {array[at]} does not fit {np.dtype(dtype).name}")
    return np.ascontiguousarray(array, dtype=dtype)


def _table(rows: Any, name: str, num_seqs: int) -> np.ndarray:
    if hasattr(rows, "shape") and len(rows.shape) == 2:
        table = _int_array(rows, name, np.int32)
    else:
        rows = [list(_int_array(row, f"{name}[{s}]", np.int32)) for s, row in enumerate(rows)]
        width = max((len(r) for r in rows), default=0)
        table = np.zeros((len(rows), width), dtype=np.int32)
        for s, row in enumerate(rows):
            table[s, : len(row)] = row
    if table.shape[0] != num_seqs:
        raise invalid(f"{name} has {table.shape[0]} rows; there are {num_seqs} sequences")
    return table


def _slots(
    table: np.ndarray, firsts: np.ndarray, counts: np.ndarray, block_size: int, name: str
) -> np.ndarray:
    """Slots of positions [firsts[s], firsts[s] + counts[s]) of each sequence."""
    seq = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    positions = np.arange(int(counts.sum())) - np.repeat(starts, counts) + np.repeat(firsts, counts)
    entries = positions // block_size
    short = np.nonzero(entries >= table.shape[1])[0]
    if short.size:
        i = short[0]
        raise _out_of_range(
            f"{name}[{seq[i]}] has {table.shape[1]} entries; position {positions[i]} of sequence "
            f"{seq[i]} needs entry {entries[i]} (block_size {block_size})"
        )
    blocks = table[seq, entries]
    unowned = np.nonzero(blocks < 0)[0]
    if unowned.size:
        i = unowned[0]
        raise _out_of_range(
            f"{name}[{seq[i]}][{entries[i]}] = {blocks[i]} is not a block id (position "
            f"{positions[i]} of sequence {seq[i]} is written there)"
        )
    return blocks.astype(np.int64) * block_size + positions % block_size


def _out_of_range(message: str) -> Error:
    error = Error(message)
    error.status = "out_of_range"
    return error


class PagedAttentionMetadataBuilder:
    """Builds a step's :class:`PagedAttentionMetadata` from per-sequence lengths and block
    tables (lists or tensors)."""

    def __init__(self, block_size: int) -> None:
        block_size = as_int(block_size, "block_size")
        if block_size < 1:
            raise invalid(f"block_size = {block_size} must be >= 1")
        self.block_size = block_size

    def build(
        self,
        query_lens: Any,
        seq_lens: Any,
        block_tables: Any,
        slot_mapping: Any = None,
        *,
        encoder_seq_lens: Any = None,
        cross_block_tables: Any = None,
        cross_slot_mapping: Any = None,
    ) -> PagedAttentionMetadata:
        """query_lens[s]: new tokens of sequence s (its query rows); seq_lens[s]: its keys, new
        ones included; block_tables[s]: its blocks (ragged lists are padded). slot_mapping None:
        the new tokens' slots (the last query_lens[s] positions of each sequence) from the block
        tables; cross_slot_mapping None with cross_block_tables given: every encoder position's
        slot."""
        q = _int_array(query_lens, "query_lens", np.int32).astype(np.int64).reshape(-1)
        k = _int_array(seq_lens, "seq_lens", np.int32).astype(np.int64).reshape(-1)
        if q.shape != k.shape:
            raise invalid(f"query_lens has {q.size} entries; seq_lens has {k.size}")
        table = _table(block_tables, "block_tables", q.size)
        starts = np.concatenate(([0], np.cumsum(q)))
        if starts[-1] > np.iinfo(np.int32).max:
            raise _out_of_range(f"query_lens add up to {starts[-1]}, more than int32 rows")
        starts = starts.astype(np.int32)
        if slot_mapping is None:
            negative = np.nonzero(k < 0)[0]
            if negative.size:
                s = negative[0]
                raise invalid(f"seq_lens[{s}] = {k[s]} is negative")
            bad = np.nonzero((q < 0) | (q > k))[0]
            if bad.size:
                s = bad[0]
                raise invalid(
                    f"query_lens[{s}] = {q[s]} must be in [0, seq_lens[{s}] = {k[s]}] to place "
                    "the new tokens"
                )
            slots = _slots(table, k - q, q, self.block_size, "block_tables")
        else:
            slots = _int_array(slot_mapping, "slot_mapping", np.int64).reshape(-1)

        enc_lens = cross_table = cross_slots = None
        if encoder_seq_lens is None and cross_block_tables is not None:
            raise invalid("cross_block_tables is given without encoder_seq_lens")
        if encoder_seq_lens is not None:
            enc = _int_array(encoder_seq_lens, "encoder_seq_lens", np.int32).astype(np.int64)
            enc = enc.reshape(-1)
            if enc.size != q.size:
                raise invalid(
                    f"encoder_seq_lens has {enc.size} entries; there are {q.size} sequences"
                )
            enc_lens = _tensor(enc.astype(np.int32))
            if cross_block_tables is not None:
                cross = _table(cross_block_tables, "cross_block_tables", q.size)
                cross_table = _tensor(cross)
                if cross_slot_mapping is None:
                    if (enc < 0).any():
                        s = int(np.nonzero(enc < 0)[0][0])
                        raise invalid(f"encoder_seq_lens[{s}] = {enc[s]} is negative")
                    cross_slots = _tensor(
                        _slots(
                            cross, np.zeros_like(enc), enc, self.block_size, "cross_block_tables"
                        )
                    )
        if cross_slot_mapping is not None:
            cross_slots = _tensor(_int_array(cross_slot_mapping, "cross_slot_mapping", np.int64))

        return PagedAttentionMetadata(
            query_start_loc=_tensor(starts),
            seq_lens=_tensor(k.astype(np.int32)),
            block_tables=_tensor(table),
            slot_mapping=_tensor(slots),
            encoder_seq_lens=enc_lens,
            cross_block_tables=cross_table,
            cross_slot_mapping=cross_slots,
        )

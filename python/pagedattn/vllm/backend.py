"""The vLLM v1 attention backend: backend description, per-step metadata and its builder.

The builder turns vLLM's ``CommonAttentionMetadata`` into the library's batch once per step
and makes the plan every layer of the step's geometry reuses; layers find both, so a layer's
call allocates no tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    KVCacheLayout,
)

from .. import _ext

# vLLM's kv_cache_dtype strings this backend serves; the plain ones are the cache tensor's own.
KV_CACHE_DTYPES = ["auto", "float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2"]


class PagedAttnBackend(AttentionBackend):
    """pagedattn under vLLM's CPU_ATTN name (the CPU platform only selects that name)."""

    accept_output_buffer: bool = True
    # forward writes the new K/V and then attends, in one library call that checks both
    # before either writes.
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = KV_CACHE_DTYPES

    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"

    @staticmethod
    def get_impl_cls() -> type:
        from .impl import PagedAttnImpl

        return PagedAttnImpl

    @staticmethod
    def get_builder_cls() -> type:
        return PagedAttnMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]  # any block size

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(range(_ext.MIN_HEAD_SIZE, _ext.MAX_HEAD_SIZE + 1))

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Each (block, head) page, K tile then V tile, must be dense: heads outside tokens.
        # The order inside a tile (PAGEDATTN_KV_LAYOUT, rows or tiled) is the impl's alone:
        # vLLM only zeroes, shares and frees whole blocks.
        return (KVCacheLayout.LBHNC, KVCacheLayout.BLHNC)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type in (
            AttentionType.DECODER,
            AttentionType.ENCODER,
            AttentionType.ENCODER_ONLY,
            AttentionType.ENCODER_DECODER,
        )

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True


@dataclass
class PagedAttnMetadata:
    """One step's batch for the layers of one KV cache group."""

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]
    causal: bool
    batch: Any = None  # the library's batch (None for encoder-only groups: no cache)
    # Plans by impl step key (see pagedattn.metadata.step_key), made by the builder for the
    # group's geometry and by a first layer of any other.
    plans: dict[object, Any] = field(default_factory=dict)


def cross_slot_mapping(m: CommonAttentionMetadata, block_size: int) -> torch.Tensor:
    """The cache slots of the encoder's tokens for a cross-attention group: token j of request
    i at ``block_table_tensor[i, j // block_size]``, for the requests whose encoder output
    comes this step (``encoder_seq_lens_cpu`` not 0), in order.

    vLLM's cross-attention builder hands the decoder's ``slot_mapping`` to this builder and
    sets the encoder's on the metadata only after it returns; the batch, which writes the new
    K/V, must have the encoder's."""
    lens = torch.as_tensor(m.encoder_seq_lens_cpu, dtype=torch.int64)
    table = m.block_table_tensor.to(torch.int64)
    parts = []
    for i in torch.nonzero(lens).flatten().tolist():
        j = torch.arange(int(lens[i]), dtype=torch.int64)
        parts.append(table[i, j // block_size] * block_size + j % block_size)
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


class PagedAttnMetadataBuilder(AttentionMetadataBuilder[PagedAttnMetadata]):
    """Builds each step's :class:`PagedAttnMetadata`: the library batch over vLLM's tensors
    (no copy) and the plan for the group's layers."""

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        if vllm_config.kv_transfer_config is not None:
            # Connectors (NIXL, ...) move pages in CPU_ATTN's own order, which these pages do
            # not have: refused at startup rather than read as garbage.
            raise NotImplementedError(
                "pagedattn: KV transfer (kv_transfer_config) is not supported; "
                "PAGEDATTN_VLLM=0 leaves vLLM's own CPU_ATTN backend"
            )
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.encoder_only = isinstance(kv_cache_spec, EncoderOnlyAttentionSpec)
        layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names)
        from .impl import PagedAttnImpl

        self.impls = [
            layer.impl for layer in layers.values() if isinstance(layer.impl, PagedAttnImpl)
        ]

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PagedAttnMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError(
                "pagedattn: per-request causality (a tensor of causal flags) is not supported"
            )
        md = PagedAttnMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            causal=bool(m.causal),
        )
        if not self.encoder_only:
            slots = (
                cross_slot_mapping(m, self.kv_cache_spec.block_size)
                if isinstance(self.kv_cache_spec, CrossAttentionSpec)
                else m.slot_mapping
            )
            md.batch = _ext.Batch(m.query_start_loc, m.seq_lens, m.block_table_tensor, slots)
            # One plan per geometry of the group, made here once for every layer.
            for impl in self.impls:
                if impl.step_key not in md.plans:
                    md.plans[impl.step_key] = _ext.Plan(impl.ctx, impl.layer, md.batch)
        return md

"""Tiny random-weight models (token-id prompts) for what the real models do not reach: FP8
caches, ALiBi, soft-caps, sliding windows, tensor parallelism. The weights are drawn once from a
fixed seed by transformers and saved, so that every engine (and every tensor-parallel rank)
loads the same ones."""

from __future__ import annotations

import json
from pathlib import Path

COMMON = {
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

CONFIGS = {
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
    },
    # Soft-capped logits, and a sliding window on every other layer.
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 64,
        "sliding_window": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    },
    # ALiBi.
    "bloom": {
        "architectures": ["BloomForCausalLM"],
        "model_type": "bloom",
        "hidden_size": 256,
        "n_head": 8,
        "n_layer": 2,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
    },
    # Attention sinks, with sliding-window layers between full ones.
    "gpt_oss": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"],
        "rms_norm_eps": 1e-5,
    },
}


def write_model(root: Path, name: str) -> Path:
    """A directory holding the tiny model: config.json and seeded random f32 weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = root / f"tiny-{name}"
    config = {**COMMON, **CONFIGS[name]}
    stamp = path / "pagedattn-config.json"
    if stamp.exists() and json.loads(stamp.read_text()) == config:
        return path
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    model.save_pretrained(path, safe_serialization=True)
    stamp.write_text(json.dumps(config))
    return path

"""The decoder as a PyTorch user runs it: transformers' Qwen2ForCausalLM as shipped (sdpa
attention, its fp32 RMSNorm statistics and fp32 RoPE angles), in the case dtype, on the case's
device.
Its error against the float64 oracle is what the audit records as the reference's."""
import torch

from oracles.decoder import hf_model, sequence_logits


def decoder_logits(config: dict, weights: dict, dtype: torch.dtype, sequences: list, device="cpu") -> list:
    """Logits [T, V] of every position of each sequence (float64 copies of the dtype's values)."""
    return sequence_logits(hf_model(config, weights, dtype=dtype, exact=False, device=device), sequences)

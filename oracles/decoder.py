"""Float64 ground truth for the decoder: Hugging Face transformers' own Qwen2ForCausalLM, an
implementation nobody here wrote, in float64 on the device of the case (CPU or GPU).

transformers runs three steps of a float64 Qwen2 in fp32 on purpose (they keep half-precision
models stable): Qwen2RMSNorm casts its input to fp32, Qwen2RotaryEmbedding computes the RoPE
angles in fp32, and the eager attention takes its softmax in fp32. An fp32 step rounds by 2^-24,
the size of the errors an fp32 decoder is judged on, so the oracle is made float64 throughout:

- attention: attn_implementation="sdpa", PyTorch's scaled_dot_product_attention, which computes
  float64 inputs in float64 (eager's softmax would be fp32);
- RMSNorm: each Qwen2RMSNorm computes weight * x * rsqrt(mean(x^2) + eps) in float64, the
  formula of its own forward without the cast to fp32;
- RoPE: cos and sin of angles position * theta^(-2i/D) computed in float64 (HF: fp32 angles,
  which at position p are off by up to p * 2^-24 radians).

Everything else (projections, biases, rotate_half, GQA's repeat_kv, the causal mask, the MLP, the
residual adds, the tied head) is transformers' code as it ships. `exact=False` gives the
model as transformers ships it, in any dtype: the same-dtype reference (references/decoder.py),
and the test that the three changes above move float64 logits by fp32 roundings only.
"""
from __future__ import annotations

import types

import torch


def _rmsnorm_f64(self, hidden_states):
    x = hidden_states
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class _RotaryF64(torch.nn.Module):
    """cos, sin [B, T, D] of position * theta^(-2i/D), i < D/2, repeated for both halves (HF's
    neox layout), in float64."""

    def __init__(self, theta: float, head_dim: int):
        super().__init__()
        self.inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def hf_config(config: dict):
    """A transformers Qwen2Config from a config.json dict."""
    from transformers import Qwen2Config

    return Qwen2Config(**config)


def hf_model(config: dict, state_dict: dict, *, dtype=torch.float64, exact: bool = True, attn: str = "sdpa",
             device="cpu"):
    """transformers' Qwen2ForCausalLM with these weights, on `device`, in eval mode. exact: the
    float64 oracle described above (dtype must be float64)."""
    from transformers import Qwen2ForCausalLM

    if exact and dtype != torch.float64:
        raise ValueError("exact: the float64 oracle is float64 only")
    cfg = hf_config(config)
    cfg._attn_implementation = attn
    model = Qwen2ForCausalLM(cfg)
    missing, unexpected = model.load_state_dict({k: v.to(torch.float64) for k, v in state_dict.items()},
                                                strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"transformers' Qwen2: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model = model.to(device=device, dtype=dtype).eval()
    if exact:
        for module in model.modules():
            if type(module).__name__ == "Qwen2RMSNorm":
                module.forward = types.MethodType(_rmsnorm_f64, module)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or cfg.rope_theta
        model.model.rotary_emb = _RotaryF64(theta, head_dim)
    return model


def _ids(model, tokens) -> torch.Tensor:
    """One sequence of token ids as a [1, T] batch on the model's device."""
    return torch.as_tensor(tokens, dtype=torch.int64, device=model.device).view(1, -1)


@torch.no_grad()
def sequence_logits(model, sequences: list) -> list:
    """Logits [T, V] of every position of each sequence, run one sequence at a time (no padding),
    on the model's device."""
    return [model(_ids(model, s)).logits[0].to(torch.float64) for s in sequences]


@torch.no_grad()
def sequence_hidden(model, sequences: list) -> list:
    """The final normed hidden states [T, H] (the LM head's input) of each sequence."""
    return [model.model(_ids(model, s)).last_hidden_state[0].to(torch.float64) for s in sequences]


@torch.no_grad()
def greedy(model, prompt: list, steps: int) -> tuple[list, list]:
    """Greedy continuation recomputed from the whole sequence at every step (no cache):
    (tokens, logits [V] of each step)."""
    seq = list(prompt)
    tokens, logits = [], []
    for _ in range(steps):
        row = model(_ids(model, seq)).logits[0, -1].to(torch.float64)
        tok = int(row.argmax())
        tokens.append(tok)
        logits.append(row)
        seq.append(tok)
    return tokens, logits

"""The configuration of a Qwen2-style decoder, read from a Hugging Face `config.json`.

Only what the decoder implements is accepted: a config asking for something else (sliding
windows, scaled RoPE, another architecture) is refused with the key that asks for it, rather
than run with the wrong semantics.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Hugging Face's names for the activations the swiglu kernel fuses.
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Qwen2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"          # the swiglu kernel's name (silu, gelu, gelu_tanh)
    bos_token_id: int | None = None
    eos_token_ids: tuple = ()

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "Qwen2Config":
        def get(key, kind, default=None, required=False):
            if key not in d or d[key] is None:
                if required:
                    raise ConfigError(f"{where}: '{key}' is missing")
                return default
            value = d[key]
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}")
            if kind is bool and not isinstance(value, bool):
                raise ConfigError(f"{where}: '{key}' must be true or false, got {value!r}")
            return kind(value)

        model_type = d.get("model_type", "qwen2")
        if model_type != "qwen2":
            raise ConfigError(f"{where}: 'model_type' is {model_type!r}; this decoder implements 'qwen2'")
        sizes = {k: get(k, int, required=True) for k in
                 ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")}
        for k, v in sizes.items():
            if v < 1:
                raise ConfigError(f"{where}: '{k}' must be >= 1, got {v}")
        heads = sizes["num_attention_heads"]
        kv_heads = get("num_key_value_heads", int, heads)
        if kv_heads < 1 or heads % kv_heads:
            raise ConfigError(f"{where}: 'num_key_value_heads' ({kv_heads}) must divide 'num_attention_heads' ({heads})")
        head_dim = get("head_dim", int)
        if head_dim is None:
            if sizes["hidden_size"] % heads:
                raise ConfigError(f"{where}: 'hidden_size' ({sizes['hidden_size']}) is not a multiple of "
                                  f"'num_attention_heads' ({heads}) and no 'head_dim' is given")
            head_dim = sizes["hidden_size"] // heads
        if head_dim < 2 or head_dim % 2 or head_dim > 256:
            raise ConfigError(f"{where}: 'head_dim' must be even and in [2, 256] (RoPE rotates pairs; the attention "
                              f"kernels take up to 256), got {head_dim}")

        # RoPE: transformers >= 5 writes rope_parameters, older versions rope_theta and rope_scaling.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"{where}: 'rope_parameters' must be an object, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"{where}: RoPE type {rope_type!r} is not supported (only the default, unscaled RoPE)")
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise ConfigError(f"{where}: 'rope_theta' must be a number > 0, got {theta!r}")

        if d.get("use_sliding_window"):
            raise ConfigError(f"{where}: 'use_sliding_window' is true; sliding-window attention is not supported")
        layer_types = d.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise ConfigError(f"{where}: 'layer_types' asks for {sorted(set(layer_types))}; only full_attention "
                              f"is supported")
        act = d.get("hidden_act", "silu")
        if act not in ACTIVATIONS:
            raise ConfigError(f"{where}: 'hidden_act' {act!r} is not supported; expected one of {', '.join(ACTIVATIONS)}")
        eps = get("rms_norm_eps", float, 1e-6)
        if not eps >= 0:
            raise ConfigError(f"{where}: 'rms_norm_eps' must be >= 0, got {eps}")
        eos = d.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        return cls(**sizes, num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=eps, rope_theta=float(theta),
                   tie_word_embeddings=get("tie_word_embeddings", bool, False),
                   max_position_embeddings=get("max_position_embeddings", int, 32768),
                   hidden_act=ACTIVATIONS[act], bos_token_id=get("bos_token_id", int), eos_token_ids=eos)

    @classmethod
    def from_file(cls, path: str | Path) -> "Qwen2Config":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
        return cls.from_dict(d, where=str(path))

    def tensor_shapes(self) -> dict:
        """Every tensor of a Hugging Face Qwen2ForCausalLM checkpoint, name -> shape.
        lm_head.weight is listed only for untied embeddings."""
        H, inter = self.hidden_size, self.intermediate_size
        shapes = {"model.embed_tokens.weight": (self.vocab_size, H), "model.norm.weight": (H,)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (self.q_size, H), p + "self_attn.q_proj.bias": (self.q_size,),
                p + "self_attn.k_proj.weight": (self.kv_size, H), p + "self_attn.k_proj.bias": (self.kv_size,),
                p + "self_attn.v_proj.weight": (self.kv_size, H), p + "self_attn.v_proj.bias": (self.kv_size,),
                p + "self_attn.o_proj.weight": (H, self.q_size),
                p + "post_attention_layernorm.weight": (H,),
                p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                p + "mlp.down_proj.weight": (H, inter),
            })
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, H)
        return shapes

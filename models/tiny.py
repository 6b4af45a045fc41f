"""Tiny random Qwen2 checkpoints with a word-level tokenizer: for the tests and for trying the
generate command without downloading anything.

    python -m models.tiny DIR [--seed 0]

writes DIR/config.json, DIR/model.safetensors, DIR/generation_config.json, DIR/tokenizer.json
and DIR/tokenizer_config.json (with a ChatML-like chat template). The text it generates is
random words: the weights are random.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from models.config import Qwen2Config

SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]
WORDS = ["system", "user", "assistant", "hello", "world", "the", "cat", "sat", "on", "a", "mat"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")


def tiny_config(layers=1, hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64, vocab=64, tied=False,
                theta=10000.0, eos_token_id=None) -> dict:
    """A config.json dict of a Qwen2ForCausalLM."""
    return dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=vocab, hidden_size=hidden,
                intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=head_dim, tie_word_embeddings=tied, rms_norm_eps=1e-6,
                rope_theta=theta, max_position_embeddings=256, hidden_act="silu", eos_token_id=eos_token_id)


def random_weights(shapes: dict, gen: torch.Generator) -> dict:
    """float64 weights for every tensor of `shapes` (name -> shape), drawn in sorted name order so
    that activations stay O(1) and neither attention nor the next-token distribution is flat:
    linear weights N(0, 1/fan_in), embedding and LM head N(0, 1) (logits of a few tens, as trained
    models have), norm weights 1 + 0.2 N(0, 1), q/k/v biases 0.5 N(0, 1)."""
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if name.endswith("norm.weight"):
            out[name] = 1 + 0.2 * x
        elif name.endswith(".bias"):
            out[name] = 0.5 * x
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = x
        else:
            out[name] = x / math.sqrt(shape[1])
    return out


def save_checkpoint(path, config: dict, weights: dict, dtype: torch.dtype = torch.float32) -> Path:
    """config.json + model.safetensors (+ generation_config.json with the EOS id)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if config.get("eos_token_id") is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}) + "\n")
    save_file({k: v.to(dtype).contiguous() for k, v in weights.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return path


def save_tokenizer(path, vocab_size: int) -> dict:
    """A word-level tokenizer of vocab_size entries (the special tokens, a few words, then w0, w1,
    ...), split on whitespace, saved as tokenizer.json + tokenizer_config.json with a chat
    template. Returns the vocabulary (word -> id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = SPECIAL + WORDS
    if vocab_size < len(words):
        raise ValueError(f"vocab_size: expected at least {len(words)}, got {vocab_size}")
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE}, indent=1) + "\n")
    return vocab


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.tiny", description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    config = tiny_config(layers=args.layers, eos_token_id=SPECIAL.index("<|im_end|>"))
    gen = torch.Generator().manual_seed(args.seed)
    weights = random_weights(Qwen2Config.from_dict(config).tensor_shapes(), gen)
    save_checkpoint(args.path, config, weights)
    save_tokenizer(args.path, config["vocab_size"])
    print(f"wrote a {args.layers}-layer random Qwen2 checkpoint and its tokenizer to {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

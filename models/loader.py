"""Load a Hugging Face checkpoint directory: config.json and safetensors weights, one file
(model.safetensors) or shards listed by model.safetensors.index.json.

Every tensor is checked against the config before anything is built: a missing tensor, one the
decoder does not know, or one of the wrong shape is a CheckpointError naming the tensor (and
its file). Shapes are read from the safetensors headers, so a bad checkpoint fails before its
weights are read.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from models.config import Qwen2Config

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class CheckpointError(ValueError):
    pass


def check_tensors(config: Qwen2Config, shapes: dict, where: dict | None = None) -> None:
    """shapes: name -> shape of what a checkpoint holds; where: name -> file, for the messages."""
    where = where or {}
    expected = config.tensor_shapes()
    problems = []
    for name in sorted(shapes):
        if name in expected:
            if tuple(shapes[name]) != tuple(expected[name]):
                problems.append(f"{name}: shape {tuple(shapes[name])} in {where.get(name, 'the checkpoint')}, "
                                f"expected {tuple(expected[name])} from the config")
        elif name == "lm_head.weight" and config.tie_word_embeddings:
            continue        # a tied head saved anyway: load_tensors checks it equals the embedding
        else:
            problems.append(f"{name}: unknown tensor in {where.get(name, 'the checkpoint')} (not part of a Qwen2 "
                            f"decoder with this config)")
    for name in sorted(set(expected) - set(shapes)):
        problems.append(f"{name}: missing from the checkpoint (expected shape {tuple(expected[name])})")
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise CheckpointError(problems[0] + more + ("\n  " + "\n  ".join(problems[1:]) if len(problems) > 1 else ""))


def weight_files(path: Path) -> dict:
    """name -> file of every tensor, from the index, or from the single file or the shards."""
    from safetensors import safe_open

    index = path / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from None
        files = {name: path / f for name, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.exists():
                raise CheckpointError(f"{f.name}: listed in {INDEX} but missing from {path}")
        # Every shard must hold exactly what the index says it holds.
        for f in sorted(set(files.values())):
            with safe_open(f, framework="pt") as sf:
                held = set(sf.keys())
            listed = {n for n, g in files.items() if g == f}
            for name in sorted(listed - held):
                raise CheckpointError(f"{name}: listed in {INDEX} under {f.name}, but that file does not hold it")
            for name in sorted(held - listed):
                raise CheckpointError(f"{name}: unknown tensor in {f.name} (not listed in {INDEX})")
        return files
    shards = [path / SINGLE] if (path / SINGLE).exists() else sorted(path.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{path}: no {SINGLE}, {INDEX} or *.safetensors file")
    files = {}
    for f in shards:
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():
                if name in files:
                    raise CheckpointError(f"{name}: held by both {files[name].name} and {f.name}")
                files[name] = f
    return files


def read_shapes(files: dict) -> dict:
    from safetensors import safe_open

    shapes = {}
    for f in sorted(set(files.values())):
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():
                if files.get(name) == f:
                    shapes[name] = tuple(sf.get_slice(name).get_shape())
    return shapes


def load_tensors(path: str | Path, config: Qwen2Config | None = None) -> tuple[Qwen2Config, dict]:
    """(config, name -> CPU tensor in the checkpoint's dtype), checked against the config."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory")
    config = config or Qwen2Config.from_file(path / "config.json")
    files = weight_files(path)
    check_tensors(config, read_shapes(files), {n: f.name for n, f in files.items()})
    tensors = {}
    for f in sorted(set(files.values())):
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():
                if files.get(name) == f:
                    tensors[name] = sf.get_tensor(name)
    if config.tie_word_embeddings and "lm_head.weight" in tensors:
        if not torch.equal(tensors.pop("lm_head.weight"), tensors["model.embed_tokens.weight"]):
            raise CheckpointError("lm_head.weight: differs from model.embed_tokens.weight although the config ties "
                                  "them (tie_word_embeddings is true)")
    return config, tensors


def load_model(path: str | Path, dtype: torch.dtype, device):
    """A Qwen2Decoder with the checkpoint's weights in `dtype` on `device`."""
    from models.qwen2 import Qwen2Decoder

    config, tensors = load_tensors(path)
    return Qwen2Decoder.from_tensors(config, tensors, dtype, device)


def model_from_state_dict(config: Qwen2Config, state_dict: dict, dtype: torch.dtype, device):
    """As load_model, from a state dict in memory (e.g. a transformers model's), with the same checks."""
    from models.qwen2 import Qwen2Decoder

    tensors = {k: v.detach() for k, v in state_dict.items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    check_tensors(config, {k: tuple(v.shape) for k, v in tensors.items()})
    return Qwen2Decoder.from_tensors(config, tensors, dtype, device)

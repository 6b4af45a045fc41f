"""Generation with a KV cache, and the `kernelcheck-generate` command.

generate(): prompts of any lengths are prefilled together (one packed flash_attention batch),
then every sequence advances one token per step through decode_attention on a contiguous or
paged cache. Tokens are picked greedily or sampled (temperature, top-k, top-p) with a seeded
torch.Generator, so a run is reproducible on a given device.

    python -m models.generate CHECKPOINT_DIR --prompt "..." [--chat] [--max-new-tokens N]
        [--temperature T --top-k K --top-p P --seed S] [--dtype D] [--device cuda|cpu]

streams the completion of a local Hugging Face checkpoint directory (config.json, safetensors
weights, tokenizer.json / tokenizer_config.json); --chat applies the checkpoint's chat template.
Nothing is downloaded. On a machine without a GPU, --device cpu runs the kernels in Triton's
interpreter: right, but slow (tiny checkpoints only).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.decode_graph import DecodeGraph
from models.kv_cache import make_cache


@dataclass(frozen=True)
class Sampling:
    """temperature 0: greedy (argmax, the lowest id on a tie). Otherwise logits / temperature,
    then top-k (keep the k largest, and any tied with the k-th; 0: off), then top-p (keep the
    smallest set of most likely tokens whose probability reaches p; 1: off), then one draw."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k: expected an int >= 0 (0: off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p: expected a number in (0, 1] (1: off), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [B, V] (float) with -inf outside the top-k set and the top-p nucleus."""
    logits = logits.clone()
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits[logits < kth] = -math.inf
    if top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p           # the set before this token already reaches p
        drop_sorted[..., 0] = False                   # the most likely token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits[drop] = -math.inf
    return logits


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens [B] (int64, on the logits' device) from logits [B, V]."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    scaled = filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).view(-1)


KEPT_DECODE_GRAPHS = 2      # (cache, graph) pairs generate() keeps on a model, the most recent shapes


@dataclass
class Generation:
    tokens: list                                     # per prompt: the new tokens (up to and including EOS)
    logits: list = field(default_factory=list)       # keep_logits: [B, V] of every step, float32
    prefill_s: float = 0.0                           # seconds to the first token's logits (synchronized)
    decode_s: float = 0.0


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def generate(model, prompts: list, max_new_tokens: int, sampling: Sampling = Sampling(), *,
             seed: int | None = 0, eos_token_ids=(), cache: str = "contiguous", block_size: int = 16,
             on_token=None, keep_logits: bool = False, cuda_graph: bool | None = None) -> Generation:
    """Continue each prompt (a list of token ids) by up to max_new_tokens tokens.

    A sequence stops at an EOS token (kept in its output); the batch stops when all have. Rows
    that stopped still ride along in the batch, their tokens ignored. on_token(step, tokens)
    gets every step's tokens as a list (this costs a host sync per step, as EOS does; without
    either, tokens stay on the device until the end).

    cuda_graph (default: on a CUDA device): the prefill of prompts of one length replays a graph
    of its padded shape (models/prefill_graph.py, kept on the model); the first decode step runs
    eagerly (it compiles the kernels), the rest replay it from a CUDA graph
    (models/decode_graph.py). Graphs remove the host's launch cost; a replayed decode step is
    the eager one, kernel for kernel. The decode graph and its cache stay on the model
    (model.decode_graphs, the last KEPT_DECODE_GRAPHS shapes): a later call of the same batch,
    capacity and cache kind replays it from its first step, with neither the eager step nor the
    capture (model.decode_graphs.clear() frees them)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    prompts = [list(map(int, p)) for p in prompts]
    B = len(prompts)
    result = Generation(tokens=[[] for _ in range(B)])
    if max_new_tokens == 0 or B == 0:
        return result
    generator = None
    if not sampling.greedy:
        generator = torch.Generator(device=model.device)
        generator.manual_seed(0 if seed is None else seed)
    if cuda_graph is None:
        cuda_graph = torch.device(model.device).type == "cuda"
    graph = None
    eos = set(eos_token_ids)
    sync_each_step = bool(eos) or on_token is not None
    capacity = max(len(p) for p in prompts) + max_new_tokens
    key = (cache, B, capacity, block_size if cache == "paged" else None)
    if cuda_graph and key in model.decode_graphs:
        kv, graph = model.decode_graphs[key]        # captured by an earlier call: replayed from the first step
        kv.reset()
    else:
        kv = make_cache(cache, model.config, B, capacity, model.dtype, model.device, block_size=block_size)

    start = time.perf_counter()
    logits = model.prefill(prompts, kv, cuda_graph=cuda_graph)
    done = [False] * B
    picked = []
    for step in range(max_new_tokens):
        tokens = pick(logits, sampling, generator)
        if keep_logits:
            result.logits.append(logits.to(torch.float32, copy=True))    # a graph's logits are overwritten
        if step == 0:
            _sync(model.device)
            result.prefill_s = time.perf_counter() - start
            start = time.perf_counter()
        if sync_each_step:
            host = tokens.tolist()
            for b, t in enumerate(host):
                if not done[b]:
                    result.tokens[b].append(t)
                    done[b] = t in eos
            if on_token is not None:
                on_token(step, host)
            if all(done):
                break
        else:
            picked.append(tokens)
        if step + 1 < max_new_tokens:
            if cuda_graph and graph is None and step >= 1:
                graph = DecodeGraph(model, kv)
                while len(model.decode_graphs) >= KEPT_DECODE_GRAPHS:      # the oldest goes first
                    model.decode_graphs.pop(next(iter(model.decode_graphs)))
                model.decode_graphs[key] = (kv, graph)
            logits = graph(tokens) if graph is not None else model.decode(tokens, kv)
    if picked:
        for b, row in enumerate(torch.stack(picked, dim=1).tolist()):
            result.tokens[b] = row
    _sync(model.device)
    result.decode_s = time.perf_counter() - start
    return result


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelcheck-generate",
                                description="Generate text with the kernel-built Qwen2 decoder from a local Hugging "
                                            "Face checkpoint directory (nothing is downloaded).")
    p.add_argument("checkpoint", help="directory with config.json, *.safetensors and the tokenizer files")
    p.add_argument("--prompt", required=True, help="the prompt text (with --chat: the user's message)")
    p.add_argument("--chat", action="store_true", help="apply the checkpoint's chat template to the prompt")
    p.add_argument("--system", default=None, help="with --chat: a system message")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 (default): off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 (default): off")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                   help="auto: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cuda:N or cpu (Triton's "
                                                    "interpreter: slow)")
    p.add_argument("--cache", choices=("contiguous", "paged"), default="contiguous")
    p.add_argument("--block-size", type=int, default=16, help="page size of the paged cache")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="decode eagerly (default on a GPU: steps after the first replay a CUDA graph)")
    return p


def load_tokenizer(path: Path, chat: bool = False):
    """The checkpoint's tokenizer from local files. A tokenizer.json describes a fast tokenizer
    completely, so it is loaded as such whatever class tokenizer_config.json or config.json name
    (transformers' AutoTokenizer would pick a class from config.json's model_type, which can
    rebuild the tokenizer differently); tokenizer_config.json adds the special tokens and the
    chat template. Without transformers, a bare `tokenizers` tokenizer (no chat template)."""
    path = Path(path)
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
    except ImportError:
        if chat:
            raise SystemExit("--chat needs the transformers package (pip install transformers)")
        from tokenizers import Tokenizer
        return _PlainTokenizer(Tokenizer.from_file(str(path / "tokenizer.json")))
    if (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


class _PlainTokenizer:
    """The few calls we make, on a bare `tokenizers` tokenizer."""

    def __init__(self, tok):
        self.tok = tok
        self.eos_token_id = None

    def __call__(self, text):
        return {"input_ids": self.tok.encode(text).ids}

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def prompt_ids(tokenizer, prompt: str, chat: bool, system: str | None = None) -> list:
    if not chat:
        return list(tokenizer(prompt)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit("--chat: the checkpoint's tokenizer has no chat template (tokenizer_config.json "
                         "'chat_template' or chat_template.jinja)")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):            # transformers >= 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _eos_ids(path: Path, config, tokenizer) -> set:
    import json

    ids = set(config.eos_token_ids)
    gen_config = path / "generation_config.json"
    if gen_config.exists():
        eos = json.loads(gen_config.read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type == "cpu":
        # The kernels see the interpreter only if it is chosen before they are imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        print("kernelcheck-generate: no GPU: the kernels run in Triton's interpreter (slow)", file=sys.stderr)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (
        torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)

    from models.loader import load_model   # imports the kernels

    path = Path(args.checkpoint)
    model = load_model(path, dtype, device)
    tokenizer = load_tokenizer(path, args.chat)
    ids = prompt_ids(tokenizer, args.prompt, args.chat, args.system)
    eos = () if args.ignore_eos else _eos_ids(path, model.config, tokenizer)

    new_ids, shown = [], ""

    def stream(step, tokens):
        nonlocal shown
        if tokens[0] in eos:
            return
        new_ids.append(tokens[0])
        text = tokenizer.decode(new_ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):          # wait for the rest of a multi-byte character
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    out = generate(model, [ids], args.max_new_tokens, sampling, seed=args.seed, eos_token_ids=eos,
                   cache=args.cache, block_size=args.block_size, on_token=stream,
                   cuda_graph=False if args.no_cuda_graph else None)
    text = tokenizer.decode(new_ids, skip_special_tokens=True)
    sys.stdout.write(text[len(shown):] + "\n")
    n = len(out.tokens[0])
    rate = (n - 1) / out.decode_s if n > 1 and out.decode_s > 0 else float("nan")
    print(f"[{len(ids)} prompt tokens, {n} new; first token {out.prefill_s * 1e3:.0f} ms, "
          f"{rate:.1f} tokens/s after it; {str(dtype).removeprefix('torch.')} on {device}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

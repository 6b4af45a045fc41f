"""Exploration: where a replayed decode step of the kernel-built Qwen2 spends its GPU time (issue 21).

    python bench/explore_decode_step.py [--batch 1] [--steps 20] [--generate]

Qwen2-1.5B shape, random weights (no transformers needed), bf16. Captures the decode step in a
CUDA graph (models/decode_graph.py) after one eager step, replays it under torch.profiler and
prints, per kernel name: calls a step, GPU us a step, us a call; then the step's wall time
(CUDA events), the kernels' sum and the gaps between them (launch latency inside the graph).
--generate: the same for generate()'s loop (bench_decoder's measure), per token. --splits N:
decode attention split N ways whatever its rule says.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_decoder import QWEN2_1_5B  # noqa: E402


def random_model(config: dict, dtype=torch.bfloat16, device="cuda"):
    """Our decoder with random weights of the config's shapes (the loader's names, std 0.02)."""
    from models.config import Qwen2Config
    from models.loader import model_from_state_dict

    c = Qwen2Config.from_dict(config)
    H, I, D = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * D, c.num_key_value_heads * D
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)

    sd = {"model.embed_tokens.weight": w(c.vocab_size, H), "model.norm.weight": 1 + w(H)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        sd.update({p + "input_layernorm.weight": 1 + w(H), p + "post_attention_layernorm.weight": 1 + w(H),
                   p + "self_attn.q_proj.weight": w(q, H), p + "self_attn.q_proj.bias": w(q),
                   p + "self_attn.k_proj.weight": w(kv, H), p + "self_attn.k_proj.bias": w(kv),
                   p + "self_attn.v_proj.weight": w(kv, H), p + "self_attn.v_proj.bias": w(kv),
                   p + "self_attn.o_proj.weight": w(H, q), p + "mlp.gate_proj.weight": w(I, H),
                   p + "mlp.up_proj.weight": w(I, H), p + "mlp.down_proj.weight": w(H, I)})
    return model_from_state_dict(c, sd, dtype, device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--generate", action="store_true", help="also profile generate()'s loop around the replays")
    ap.add_argument("--splits", type=int, default=None, help="decode attention's split count (default: its rule)")
    args = ap.parse_args()
    if args.splits is not None:
        from kernels import attention

        rule = attention._decode_splits
        attention._decode_splits = lambda B, Hkv, cap, bn, n: rule(B, Hkv, cap, bn, n or args.splits)
    from models.decode_graph import DecodeGraph
    from models.kv_cache import make_cache

    model = random_model(QWEN2_1_5B)
    B = args.batch
    cache = make_cache("contiguous", model.config, B, args.prompt + 4 * args.steps + 8, model.dtype, model.device)
    prompts = torch.randint(0, QWEN2_1_5B["vocab_size"], (B, args.prompt), device="cuda")
    model.prefill([p for p in prompts], cache)
    tok = torch.zeros(B, dtype=torch.int64, device="cuda")
    model.decode(tok, cache)                    # compiles every kernel of the step
    graph = DecodeGraph(model, cache)
    for _ in range(3):
        graph(tok)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        graph(tok)
    end.record()
    torch.cuda.synchronize()
    step_us = start.elapsed_time(end) * 1e3 / args.steps
    n = args.steps
    events, busy = _profiled(lambda: [graph(tok) for _ in range(n)])
    print(f"batch {B}: step {step_us:.1f} us (events) = {1e6 / step_us * B:.0f} tokens/s; kernels {len(events) / n:.0f} a step, "
          f"busy {busy / n:.1f} us a step, gaps {step_us - busy / n:.1f} us")
    _table(events, n, "step")
    if args.generate:
        # generate() as bench_decoder times it: the graph kept from an untimed first call, then
        # n + 1 tokens, the prefill's and the loop's own kernels (argmax, the token copy) included.
        from models.generate import generate
        ids = prompts.tolist()
        generate(model, ids, n + 1)
        got = generate(model, ids, n + 1)
        events, busy = _profiled(lambda: generate(model, ids, n + 1))
        print(f"generate(): {got.decode_s / n * 1e6:.1f} us a token (its decode_s, {B * n / got.decode_s:.0f} "
              f"tokens/s), kernels busy {busy / n:.1f} us a token over the whole call (the prefill included)")
        _table(events, n, "token")


def _profiled(fn):
    """(the CUDA kernel events of fn(), the GPU's busy microseconds: the union of their spans)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return events, busy


def _table(events, n, per):
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        by_name[e.name][0] += 1
        by_name[e.name][1] += e.time_range.elapsed_us()
    print(f"{'kernel':60s} {'calls':>6s} {'us/' + per:>9s} {'us/call':>8s}")
    for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:60]:60s} {calls / n:6.1f} {us / n:9.1f} {us / calls:8.2f}")


if __name__ == "__main__":
    main()

"""Exploration: where the kernel-built Qwen2's time goes, prefill and decode (issue 7).

    python bench/explore_decoder_overhead.py [--skip-sweep]

Qwen2-1.5B shape, random weights, bf16. Prints:
1. each launcher of a decode step at its batch-1 shape: host time of one call (calls queued
   back to back without a sync: what the launcher costs the CPU) and GPU time (do_bench);
2. the decode GEMMs (M = 1 and 16) against torch.matmul (cuBLAS) and the weight-read floor,
   with a sweep of block_n / block_k for our kernel;
3. a decode step eager and replayed from a CUDA graph, batch 1 and 16;
4. prefill of 512 and 4096 tokens: the host's enqueue time (until prefill returns, no sync) and
   the whole time, each measured twice (after a warm-up of that length), then cProfile's top
   entries of one 512-token prefill.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from bench.bench_decoder import QWEN2_1_5B  # noqa: E402


def host_us(fn, n=200) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def gpu_us(fn) -> float:
    return do_bench(fn, warmup=5, rep=40, return_mode="median") * 1e3


def build():
    from models.config import Qwen2Config
    from models.loader import model_from_state_dict
    from transformers import Qwen2Config as HFConfig, Qwen2ForCausalLM

    cfg = dict(QWEN2_1_5B)
    torch.manual_seed(0)
    hf_cfg = HFConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        hf = Qwen2ForCausalLM(hf_cfg).eval()
    torch.set_default_dtype(torch.float32)
    model = model_from_state_dict(Qwen2Config.from_dict(cfg), hf.state_dict(), torch.bfloat16, "cuda")
    del hf
    torch.cuda.empty_cache()
    return model


def launchers(model):
    c, w = model.config, model.layers[0]
    H = c.hidden_size
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, H, **bf)
    h = torch.randn(1, c.intermediate_size, **bf)
    qkv = torch.randn(1, c.q_size + 2 * c.kv_size, **bf)
    pos = torch.tensor([[128]], device="cuda")
    q = torch.randn(1, c.num_attention_heads, c.head_dim, **bf)
    from models.kv_cache import make_cache
    cache = make_cache("contiguous", c, 1, 257, model.dtype, model.device)
    kc, vc, _ = cache.view(0)
    lens = torch.tensor([129], device="cuda", dtype=torch.int32)
    ids = torch.tensor([5], device="cuda")
    calls = {
        "rmsnorm [1, 1536]": lambda: kernels.rmsnorm(x, w.input_norm, 1e-6),
        "add_rmsnorm [1, 1536]": lambda: kernels.add_rmsnorm(x, x, w.input_norm, 1e-6),
        "matmul qkv+bias 1x1536->2048": lambda: kernels.matmul(x, w.qkv_w, w.qkv_b),
        "matmul o 1x1536->1536": lambda: kernels.matmul(x, w.o_w),
        "swiglu 1x1536->8960 (merged)": lambda: kernels.swiglu(x, w.gate_w, w.up_w),
        "matmul down 1x8960->1536": lambda: kernels.matmul(h, w.down_w),
        "rope q+k": lambda: kernels.rope(qkv[:, :c.q_size + c.kv_size].view(1, 1, -1, c.head_dim), pos, c.rope_theta),
        "decode_attention L129 validate=False": lambda: kernels.decode_attention(q, kc, vc, lens, validate=False),
        "decode_attention L129 validated": lambda: kernels.decode_attention(q, kc, vc, lens),
        "embedding 1 id validate=False": lambda: kernels.embedding(ids, model.embed, validate=False),
        "lm head 1x1536->151936": lambda: kernels.matmul(x, model.lm_head),
        "cache write (index_put)": lambda: cache.write(0, q[:, :2], q[:, :2], ids * 0, ids),
        "torch: x + x (an eager op, for scale)": lambda: x + x,
        "torch: F.linear qkv (cuBLAS)": lambda: torch.nn.functional.linear(x, w.qkv_w, w.qkv_b),
    }
    print(f"\n## 1. launchers at decode shapes (batch 1)\n{'call':42s} {'host us/call':>12s} {'gpu us':>8s}")
    for name, fn in calls.items():
        print(f"{name:42s} {host_us(fn):12.1f} {gpu_us(fn):8.1f}", flush=True)


def gemm_sweep(model, peak_tbs):
    w = model.layers[0]
    print(f"\n## 2. decode GEMMs, GPU us (floor: weight bytes / {peak_tbs} TB/s)")
    shapes = [("qkv", w.qkv_w, None), ("o", w.o_w, None), ("swiglu", None, (w.gate_w, w.up_w)),
              ("down", w.down_w, None), ("lm_head", model.lm_head, None)]
    for M in (1, 16):
        for name, wt, pair in shapes:
            K = (pair[0] if pair else wt).shape[1]
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            nbytes = (2 * pair[0].numel() if pair else wt.numel()) * 2
            floor = nbytes / (peak_tbs * 1e12) * 1e6
            if pair:
                ref = gpu_us(lambda: torch.nn.functional.silu(x @ pair[0].T) * (x @ pair[1].T))
                ours = lambda **kw: kernels.swiglu(x, *pair, **kw)  # noqa: E731
            else:
                ref = gpu_us(lambda: x @ wt.T)
                ours = lambda **kw: kernels.matmul(x, wt, **kw)  # noqa: E731
            row = [f"default {gpu_us(ours):.1f}"]
            if "--skip-sweep" not in sys.argv:
                for bn in (16, 32, 64, 128):
                    for bk in (64, 128, 256):
                        try:
                            row.append(f"n{bn}k{bk} {gpu_us(lambda: ours(block_n=bn, block_k=bk)):.1f}")
                        except Exception as e:  # noqa: BLE001 - a config that does not fit
                            row.append(f"n{bn}k{bk} {type(e).__name__}")
            print(f"M={M:2d} {name:8s} floor {floor:6.1f} cuBLAS {ref:6.1f} | " + ", ".join(row), flush=True)


def decode_steps(model):
    from models.decode_graph import DecodeGraph
    from models.kv_cache import make_cache

    c = model.config
    print("\n## 3. one decode step (128-token prompts), ms")
    for B in (1, 16):
        cache = make_cache("contiguous", c, B, 128 + 400, model.dtype, model.device)
        logits = model.prefill([list(range(128))] * B, cache)
        tok = logits.argmax(-1)
        model.decode(tok, cache)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 30
        for _ in range(n):
            model.decode(tok, cache)
        host = (time.perf_counter() - t0) / n * 1e3
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t0) / n * 1e3
        t0 = time.perf_counter()
        graph = DecodeGraph(model, cache)
        torch.cuda.synchronize()
        capture = (time.perf_counter() - t0) * 1e3
        graph(tok)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            graph(tok)
        torch.cuda.synchronize()
        replay = (time.perf_counter() - t0) / n * 1e3
        print(f"batch {B:2d}: eager {eager:.2f} ms (host enqueue {host:.2f}), graph replay {replay:.3f} ms "
              f"(capture {capture:.0f} ms)", flush=True)


def prefill(model):
    from models.kv_cache import make_cache

    c = model.config
    print("\n## 4. prefill, batch 1, ms")

    def run(T):
        cache = make_cache("contiguous", c, 1, T + 1, model.dtype, model.device)
        return model.prefill([prompt[:T]], cache).argmax(-1)

    prompt = torch.randint(0, c.vocab_size, (4096,), device="cuda")
    for T in (512, 4096, 512, 4096):
        run(T)
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(T)
            host = (time.perf_counter() - t0) * 1e3
            torch.cuda.synchronize()
            total = (time.perf_counter() - t0) * 1e3
            print(f"T={T}: host enqueue {host:.1f}, total {total:.1f}", flush=True)
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    run(512)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--peak-tbs", type=float, default=4.0, help="the GPU's measured copy rate, TB/s")
    args = ap.parse_args()
    model = build()
    prefill(model)
    decode_steps(model)
    launchers(model)
    gemm_sweep(model, args.peak_tbs)


if __name__ == "__main__":
    main()

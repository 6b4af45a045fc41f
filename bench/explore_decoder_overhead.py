"""Exploration: where a decode step of the kernel-built Qwen2 spends its time (issue 7).

    python bench/explore_decoder_overhead.py

Qwen2-1.5B shape, random weights, bf16, batch 1 after a 128-token prompt. For each launcher the
decode step calls, at its decode shape: the host time of one call (calls queued back to back,
no sync between them: when the GPU keeps up, this is what the launcher costs the CPU) and the
GPU time (do_bench). If the host times add up to the step's time, the step is launch-bound.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from bench.bench_decoder import QWEN2_1_5B  # noqa: E402


def host_us(fn, n=300) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def main():
    from models.config import Qwen2Config
    from models.kv_cache import make_cache
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
    c = model.config
    cache = make_cache("contiguous", c, 1, 512, model.dtype, model.device)
    logits = model.prefill([list(range(128))], cache)
    tok = logits.argmax(-1)

    rows = []

    def step():
        return model.decode(tok, cache)
    # decode appends: keep the cache from filling (each call adds a token)
    t_step = host_us(step, n=100)
    torch.cuda.synchronize()
    gpu_step = do_bench(step, warmup=5, rep=50, return_mode="median") * 1e3
    rows.append(("decode step (28 layers + head)", t_step, gpu_step))

    w = model.layers[0]
    H = c.hidden_size
    x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(1, c.intermediate_size, device="cuda", dtype=torch.bfloat16)
    qkv = torch.randn(1, c.q_size + 2 * c.kv_size, device="cuda", dtype=torch.bfloat16)
    pos = torch.tensor([[128]], device="cuda")
    q = torch.randn(1, c.num_attention_heads, c.head_dim, device="cuda", dtype=torch.bfloat16)
    kc, vc, table = cache.view(0)
    lens = torch.tensor([129], device="cuda", dtype=torch.int32)
    ids = torch.tensor([5], device="cuda")
    launchers = {
        "rmsnorm [1, 1536]": lambda: kernels.rmsnorm(x, w.input_norm, 1e-6),
        "add_rmsnorm [1, 1536]": lambda: kernels.add_rmsnorm(x, x, w.input_norm, 1e-6),
        "matmul qkv+bias 1x1536x2048": lambda: kernels.matmul(x, w.qkv_w, w.qkv_b),
        "matmul o 1x1536x1536": lambda: kernels.matmul(x, w.o_w),
        "swiglu 1x1536x8960 (merged)": lambda: kernels.swiglu(x, w.gate_w, w.up_w),
        "matmul down 1x8960x1536": lambda: kernels.matmul(h, w.down_w),
        "rope q+k": lambda: kernels.rope(qkv[:, :c.q_size + c.kv_size].view(1, 1, -1, c.head_dim), pos, c.rope_theta),
        "decode_attention L129 validate=False": lambda: kernels.decode_attention(q, kc, vc, lens, block_table=table,
                                                                                  validate=False),
        "decode_attention L129 validated": lambda: kernels.decode_attention(q, kc, vc, lens, block_table=table),
        "embedding 1 id validate=False": lambda: kernels.embedding(ids, model.embed, validate=False),
        "lm head 1x1536x151936": lambda: kernels.matmul(x, model.lm_head),
        "torch: x + x (an eager op, for scale)": lambda: x + x,
    }
    for name, fn in launchers.items():
        t = host_us(fn)
        g = do_bench(fn, warmup=5, rep=50, return_mode="median") * 1e3
        rows.append((name, t, g))
    print(f"{'call':45s} {'host us/call':>12s} {'gpu us':>10s}")
    for name, t, g in rows:
        print(f"{name:45s} {t:12.1f} {g:10.1f}")


if __name__ == "__main__":
    main()

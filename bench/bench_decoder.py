"""Speed of the kernel-built Qwen2 decoder (models/) against Hugging Face transformers.

    python bench/bench_decoder.py --out results/

A random-weight model with the Qwen2-1.5B shape (hidden 1536, 28 layers, 12 query / 2 KV heads
of 128, MLP 8960, vocab 151936, tied embeddings, RoPE base 1e6; Bielik 1.5B's architecture),
bf16 on one GPU, both sides holding the same weights:

- time to first token (TTFT), batch 1, prompts of 512 and 4096 tokens: from the token ids to the
  first greedy token, KV cache included (ours: cache allocation + prefill + argmax;
  transformers: model(ids, use_cache=True, logits_to_keep=1) + argmax, its DynamicCache);
- decode tokens/s at batch 1 and 16 (prompts of 128 tokens, 128 greedy steps): new tokens / time
  after the first token (ours: generate(), contiguous cache, no host sync per step;
  transformers: model(next_tokens, past_key_values=cache, use_cache=True) in a loop, argmax on
  the device, no sync per step either).

Ours runs as generate() does on a GPU: the prefill replays a CUDA graph of its padded length
(models/prefill_graph.py; captured by the untimed first run, as it would be by a server's first
prompt of that length) and decode steps replay a captured step (models/decode_graph.py; the
untimed first call captures it after one eager step, and generate() keeps it on the model for
the timed calls, which replay it from their first step, as a serving loop would). The same kernels without graphs are reported too ("ours, eager"):
that column is what the host's launch cost leaves of them.

transformers runs attn_implementation="sdpa" in bf16. Every number is the median of REPEATS timed
runs after an untimed one (Triton compiles then), with torch.cuda.synchronize() around each.
Writes bench_decoder.md and bench_decoder.json to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:       # the interpreter must be chosen before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import meta  # noqa: E402

QWEN2_1_5B = dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                  rms_norm_eps=1e-6, rope_theta=1000000.0,
                  max_position_embeddings=32768, hidden_act="silu")
REPEATS = 5
DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn) -> float:
    """Median seconds of fn() over REPEATS runs after one untimed run."""
    fn()
    times = []
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(config: dict):
    """transformers' model (random init, bf16, sdpa) and ours from its state dict."""
    from transformers import Qwen2Config as HFConfig, Qwen2ForCausalLM

    from models.config import Qwen2Config
    from models.loader import model_from_state_dict

    torch.manual_seed(0)
    hf_cfg = HFConfig(**{k: v for k, v in config.items() if k != "model_type"})
    hf_cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
            hf = Qwen2ForCausalLM(hf_cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    ours = model_from_state_dict(Qwen2Config.from_dict(config), hf.state_dict(), torch.bfloat16, DEVICE)
    return hf, ours


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    ap.add_argument("--steps", type=int, default=128, help="decode steps per timed run")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny model on the CPU (Triton's interpreter), fp32 there: checks the script, times nothing")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    global DEVICE, REPEATS
    config, prompt_lens, batches, prompt_len = QWEN2_1_5B, (512, 4096), (1, 16), 128
    if args.smoke:
        DEVICE, REPEATS, args.steps = "cpu", 1, 2
        config = dict(QWEN2_1_5B, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
        prompt_lens, batches, prompt_len = (5,), (1, 2), 4

    from models.generate import generate
    from models.kv_cache import make_cache

    hf, ours = build(config)
    if args.smoke:      # the interpreter has no bf16 tl.dot: fp32 on both sides
        hf = hf.float()
        from models.config import Qwen2Config
        from models.loader import model_from_state_dict
        ours = model_from_state_dict(Qwen2Config.from_dict(config), hf.state_dict(), torch.float32, DEVICE)
    V = config["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    rows = []

    @torch.no_grad()
    def hf_first_token(ids):
        return hf(ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)

    graphs = DEVICE == "cuda"

    def ours_first_token(prompt, cuda_graph=graphs):
        cache = make_cache("contiguous", ours.config, 1, len(prompt) + 1, ours.dtype, ours.device)
        return ours.prefill([prompt], cache, cuda_graph=cuda_graph).argmax(-1)

    for T in prompt_lens:
        prompt = torch.randint(0, V, (T,), generator=gen).to(DEVICE)     # both sides start from ids on the GPU
        ids = prompt.view(1, -1)
        t_ours = timed(lambda: ours_first_token(prompt))
        t_eager = timed(lambda: ours_first_token(prompt, False))
        t_hf = timed(lambda: hf_first_token(ids))
        same = int(ours_first_token(prompt)[0]) == int(hf_first_token(ids)[0])
        rows.append(dict(metric=f"TTFT, prompt {T}, batch 1", unit="ms", ours=t_ours * 1e3, ours_eager=t_eager * 1e3,
                         transformers=t_hf * 1e3, speedup=t_hf / t_ours, same_first_token=same))
        print(rows[-1], flush=True)

    steps = args.steps
    for B in batches:
        prompts = torch.randint(0, V, (B, prompt_len), generator=gen)

        def ours_decode(cuda_graph=graphs):
            return generate(ours, prompts.tolist(), steps + 1, cuda_graph=cuda_graph)

        @torch.no_grad()
        def hf_decode_seconds():
            ids = prompts.to(DEVICE)
            o = hf(ids, use_cache=True, logits_to_keep=1)
            cache, tok = o.past_key_values, o.logits[:, -1].argmax(-1)
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                o = hf(tok[:, None], past_key_values=cache, use_cache=True)
                tok = o.logits[:, -1].argmax(-1)
            sync()
            return time.perf_counter() - start

        ours_decode()
        ours_s = statistics.median(ours_decode().decode_s for _ in range(REPEATS))
        ours_decode(False)
        eager_s = statistics.median(ours_decode(False).decode_s for _ in range(REPEATS))
        hf_decode_seconds()
        hf_s = statistics.median(hf_decode_seconds() for _ in range(REPEATS))
        rows.append(dict(metric=f"decode, batch {B}", unit="tokens/s", ours=B * steps / ours_s,
                         ours_eager=B * steps / eager_s, transformers=B * steps / hf_s, speedup=hf_s / ours_s))
        print(rows[-1], flush=True)

    if args.smoke:
        print("smoke run: done")
        return
    info = meta(model="Qwen2-1.5B shape, random weights, bf16", transformers=__import__("transformers").__version__,
                repeats=REPEATS, decode_steps=steps)
    (out / "bench_decoder.json").write_text(json.dumps({"meta": info, "rows": rows}, indent=1) + "\n")
    lines = [f"# Decoder: kernel-built Qwen2 vs transformers ({info['device']}, {info['date']})", "",
             f"Qwen2-1.5B shape (hidden 1536, 28 layers, 12/2 heads x 128, MLP 8960, vocab 151936, tied), random "
             f"weights, bf16. transformers {info['transformers']} (sdpa, its DynamicCache), torch {info['torch']}, "
             f"triton {info['triton']}. Medians of {REPEATS} runs; decode: prompts of 128, {steps} greedy steps. "
             "ours: CUDA graphs as generate() uses them (prefill: one graph per padded length, captured by the "
             "untimed first run; decode: the step's graph, captured by the untimed first generate() call and kept on "
             "the model, replayed from the first step); ours, eager: the same kernels "
             "launched one by one.", "",
             "| metric | ours | ours, eager | transformers | ours faster by |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['metric']} | {r['ours']:.1f} {r['unit']} | {r['ours_eager']:.1f} {r['unit']} | "
                     f"{r['transformers']:.1f} {r['unit']} | {r['speedup']:.2f}x |")
    (out / "bench_decoder.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

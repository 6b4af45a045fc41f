"""Speed of the MoE expert layer kernels.moe (and kernels.moe_mxfp4 where it exists) against what a
PyTorch user runs instead, on a GPU.

    python bench/bench_moe.py [--out DIR] [--shapes mixtral,decode] [--quick]

y = sum_s w[t, s] w2_e (silu(G_e x_t) * U_e x_t) for x [T, H], w13 [E, 2I, H] (gate rows, then up
rows), w2 [E, H, I], topk_ids int32 [T, k] and topk_weights fp32 [T, k]; bf16; the routing is
given (moe_route has its own bench). triton.testing.do_bench medians (bench/common.py).
Peers, one line each per row:
- eager loop: the expert loop of transformers' Mixtral / Qwen3-MoE sparse block (a one-hot mask
  of the ids, for each expert chosen: the tokens that chose it, their x rows, the gate/up linear,
  silu(gate) * up, the down linear, times the routing weight in bf16, index_add_ into y);
- torch.compile of that same function (default mode; the first calls, which compile, are not
  timed; a compile error is recorded in the row);
- dense bound: cuBLAS GEMMs of the same FLOPs, F.linear [T k, H] x [H, 2I] then [T k, I] x [I, H]
  (one expert's weights), timed together;
- ours: kernels.moe; ours mxfp4: kernels.moe_mxfp4 on the weights quantised by
  kernels.quantize_mxfp4, when the package has it.
Shapes: Mixtral (E 8, top 2, H 4096, I 14336) and Qwen3-MoE (E 128, top 8, H 2048, I 768);
prefill T 8192 with balanced and skewed routing, decode T 1, 16, 64 with random routing (the
exact constructions are in ROUTING below and in the markdown). FLOPs 2 T k (2 I H + I H);
decode GB/s counts the weights of the experts the ids touch, plus x and y once, against a
device-to-device copy measured in the same run. Every row checks ours (and ours mxfp4) against
the eager loop once: max |ours - eager| / max |eager|, printed, never asserted.
--quick: one small model (a smoke run; prints only unless --out is given). --shapes: comma-
separated substrings of the row tags (e.g. `mixtral`, `qwen3-moe/decode`, `skewed`).
Without a GPU the script runs the --quick shapes in fp32 through the Triton interpreter
(TRITON_INTERPRET=1, set here before kernels is imported), timed by perf_counter: a check that
the script itself runs, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")      # before kernels defines its jit functions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (ERRORS, attempt, copy_ceiling, cuda_graph, fmt, gbps, gpu_folder, meta,  # noqa: E402
                          tflops, timed)
import kernels  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
DT = torch.bfloat16 if ON_GPU else torch.float32
MODELS = {   # name: (E, top_k, H, I)
    "mixtral": (8, 2, 4096, 14336),
    "qwen3-moe": (128, 8, 2048, 768),
}
PREFILL_T = 8192
DECODE_T = (1, 16, 64)
# Decode rows also time LAYERS calls, each on its own copy of the weights, in one CUDA graph (per
# call): a model's decode step is one graph, so a layer does not pay a graph launch of its own.
LAYERS = 4
QUICK = {"small": (8, 2, 1024, 2048)} if ON_GPU else {"tiny": (4, 2, 64, 64)}
QUICK_PREFILL_T, QUICK_DECODE_T = (256, (4,)) if ON_GPU else (32, (2,))
ROUTING = {
    "balanced": "ids[t, j] = (t k + j) mod E: every expert gets exactly T k / E entries, k distinct experts a token",
    "skewed": "every token chooses the k/2 hot experts 0 .. k/2-1 (Mixtral: expert 0; Qwen3-MoE: 0-3), its other "
              "k/2 slots cycle over the other E - k/2 experts (ids[t, k/2 + j] = k/2 + (t k/2 + j) mod (E - k/2)): "
              "half of all entries on the hot experts, each of them at T entries (the most a distinct top-k allows)",
    "random": "each token's k experts: the top k of E uniform draws (seeded by the row), so distinct",
}
PEERS = ("eager loop", "torch.compile", "dense bound (cuBLAS)", "ours", "ours, validate=deferred", "ours, validate=False",
         "ours, CUDA graph", f"ours, CUDA graph of {LAYERS} layers", "ours mxfp4", "ours mxfp4, CUDA graph",
         f"ours mxfp4, CUDA graph of {LAYERS} layers")


# ---------------------------------------------------------------------------------------------
# The eager peer, the routings
# ---------------------------------------------------------------------------------------------

def eager_moe(x, w13, w2, topk_ids, topk_weights):
    """The expert loop of a Hugging Face sparse MoE block (Mixtral, Qwen3-MoE), on merged weights:
    one-hot mask [E, k, T], then for every expert some token chose: its (slot, token) pairs,
    the gathered rows, gate/up, silu(gate) * up, down, times the routing weight in x's dtype,
    index_add_ into y."""
    T, H = x.shape
    E = w13.shape[0]
    out = torch.zeros_like(x)
    mask = F.one_hot(topk_ids.long(), num_classes=E).permute(2, 1, 0)
    chosen = (mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist()
    weights = topk_weights.to(x.dtype)
    for e in chosen:
        slot, tok = torch.where(mask[e])
        gate, up = F.linear(x[tok], w13[e]).chunk(2, dim=-1)
        ye = F.linear(F.silu(gate) * up, w2[e]) * weights[tok, slot, None]
        out.index_add_(0, tok, ye)
    return out


def routing(kind, T, E, k, seed):
    """(topk_ids int32 [T, k], topk_weights fp32 [T, k] > 0 summing to 1 a token) on DEVICE."""
    t = torch.arange(T)[:, None]
    j = torch.arange(k)[None, :]
    g = torch.Generator().manual_seed(seed)
    if kind == "balanced":
        ids = (t * k + j) % E
    elif kind == "skewed":
        hot = k // 2 if k > 1 else 1
        cold = hot + (t * (k - hot) + torch.arange(k - hot)[None, :]) % (E - hot)
        ids = torch.cat([j[:, :hot].expand(T, hot), cold], dim=1)
    elif kind == "random":
        ids = torch.rand(T, E, generator=g).topk(k, dim=1).indices
    else:
        raise ValueError(kind)
    w = torch.rand(T, k, generator=g) + 0.5
    w = w / w.sum(dim=1, keepdim=True)
    return ids.to(torch.int32).to(DEVICE), w.to(torch.float32).to(DEVICE)


# ---------------------------------------------------------------------------------------------
# Timing and bookkeeping (bench/common.py on a GPU; a perf_counter stand-in on the CPU)
# ---------------------------------------------------------------------------------------------

def sync():
    if ON_GPU:
        torch.cuda.synchronize()


def ceiling() -> float:
    if ON_GPU:
        return copy_ceiling()
    src = torch.empty(2**26, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return gbps(2 * src.numel(), timed(lambda: dst.copy_(src)))


def graph_breaks() -> int:
    try:
        from torch._dynamo.utils import counters
        return int(sum(counters["graph_break"].values()))
    except Exception:
        return -1


def rel_err(y, ref):
    if y is None or ref is None:
        return None
    d = (y.float() - ref.float()).abs().max().item()
    m = ref.float().abs().max().item()
    return d / m if m > 0 else d


# ---------------------------------------------------------------------------------------------
# One model: its weights once, then every row
# ---------------------------------------------------------------------------------------------

def rows_of(model, E, k, quick):
    if quick:
        return [(f"{model}/prefill-balanced/T{QUICK_PREFILL_T}", "prefill", "balanced", QUICK_PREFILL_T)] + \
               [(f"{model}/decode-random/T{T}", "decode", "random", T) for T in QUICK_DECODE_T]
    return [(f"{model}/prefill-{kind}/T{PREFILL_T}", "prefill", kind, PREFILL_T) for kind in ("balanced", "skewed")] + \
           [(f"{model}/decode-random/T{T}", "decode", "random", T) for T in DECODE_T]


def run_model(model, E, k, H, I, wanted, copy):
    rows = rows_of(model, E, k, QUICK_SHAPES)
    if wanted:
        rows = [r for r in rows if any(w in r[0] for w in wanted)]
    if not rows:
        return []
    g = torch.Generator(device=DEVICE).manual_seed(zlib.crc32(model.encode()))
    w13 = torch.randn(E, 2 * I, H, device=DEVICE, dtype=DT, generator=g).mul_(H ** -0.5)
    w2 = torch.randn(E, H, I, device=DEVICE, dtype=DT, generator=g).mul_(I ** -0.5)
    mx = None
    if hasattr(kernels, "moe_mxfp4"):
        mx = attempt(f"{model} quantize_mxfp4", lambda: (*kernels.quantize_mxfp4(w13), *kernels.quantize_mxfp4(w2)))
    # The bf16 weights the mxfp4 codes stand for (exact): the eager loop on them checks moe_mxfp4.
    mx_deq = None
    if mx is not None:
        mx_deq = attempt(f"{model} dequantize_mxfp4", lambda: (kernels.dequantize_mxfp4(mx[0], mx[1], DT),
                                                               kernels.dequantize_mxfp4(mx[2], mx[3], DT)))
    out = []
    for tag, phase, kind, T in rows:
        out.append(run_row(tag, model, phase, kind, T, E, k, H, I, w13, w2, mx, mx_deq, copy))
        sync()
        if ON_GPU:
            torch.cuda.empty_cache()
    del w13, w2, mx, mx_deq
    if ON_GPU:
        torch.cuda.empty_cache()
    return out


def run_row(tag, model, phase, kind, T, E, k, H, I, w13, w2, mx, mx_deq, copy):
    seed = zlib.crc32(tag.encode())
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(T, H, device=DEVICE, dtype=DT, generator=g)
    ids, tw = routing(kind, T, E, k, seed)
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    touched = int((counts > 0).sum())
    flops = 2 * T * k * (2 * I * H + I * H)
    esize = torch.finfo(DT).bits // 8
    xy_bytes = 2 * T * H * esize
    w_bytes = touched * 3 * I * H * esize
    mx_bytes = touched * 3 * I * H * 17 // 32           # half a byte a value + one scale byte per 32
    row = {"tag": tag, "model": model, "E": E, "top_k": k, "H": H, "I": I, "phase": phase, "routing": kind, "T": T,
           "entries": T * k, "experts_touched": touched, "entries_per_expert_min": int(counts.min()),
           "entries_per_expert_max": int(counts.max()), "flops": flops,
           "bytes": w_bytes + xy_bytes, "bytes_mxfp4": mx_bytes + xy_bytes, "peers": {}}
    print(f"{tag}: {touched} experts touched, entries per expert {row['entries_per_expert_min']}-"
          f"{row['entries_per_expert_max']}", flush=True)

    ref = attempt(f"{tag} eager loop (check)", lambda: eager_moe(x, w13, w2, ids, tw))
    y_ours = attempt(f"{tag} ours (check)", lambda: kernels.moe(x, w13, w2, ids, tw))
    err_ours = rel_err(y_ours, ref)
    del y_ours

    # The dense bound: the same FLOPs as two plain GEMMs on one expert's weights.
    a_up = torch.randn(T * k, H, device=DEVICE, dtype=DT, generator=g)
    a_down = torch.randn(T * k, I, device=DEVICE, dtype=DT, generator=g)
    w_up, w_down = w13[0], w2[0]

    def dense():
        return F.linear(a_up, w_up), F.linear(a_down, w_down)

    # torch.compile: compiled afresh for each row (no recompile limit reached across rows, no
    # fallback to eager); the first calls compile (not timed); graph breaks counted over them.
    torch._dynamo.reset()
    compiled = torch.compile(eager_moe)
    compile_info = {}

    def warm_compiled():
        before = graph_breaks()
        t0 = time.perf_counter()
        for _ in range(2):
            y = compiled(x, w13, w2, ids, tw)
        sync()
        compile_info["compile_and_first_calls_s"] = time.perf_counter() - t0
        compile_info["graph_breaks"] = graph_breaks() - before
        return y
    y_comp = attempt(f"{tag} torch.compile (compile)", warm_compiled)
    compile_ok = y_comp is not None
    compile_info["max_rel_err_vs_eager"] = rel_err(y_comp, ref)
    del y_comp

    fns = {"eager loop": lambda: eager_moe(x, w13, w2, ids, tw),
           "torch.compile": (lambda: compiled(x, w13, w2, ids, tw)) if compile_ok else None,
           "dense bound (cuBLAS)": dense,
           "ours": lambda: kernels.moe(x, w13, w2, ids, tw),
           "ours, validate=deferred": lambda: kernels.moe(x, w13, w2, ids, tw, validate="deferred"),
           "ours, validate=False": lambda: kernels.moe(x, w13, w2, ids, tw, validate=False)}
    if ON_GPU and phase == "decode":
        # GPU time of the same call (do_bench of a short call measures the host's launches):
        # captured once in a CUDA graph, as a serving loop runs decode (validate=False: no sync).
        graph = attempt(f"{tag} ours, CUDA graph (capture)",
                        lambda: cuda_graph(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False)))
        fns["ours, CUDA graph"] = graph
        copies = [(w13, w2)] + [(w13.clone(), w2.clone()) for _ in range(LAYERS - 1)]

        def layers():
            for a, b in copies:
                kernels.moe(x, a, b, ids, tw, validate=False)
        fns[f"ours, CUDA graph of {LAYERS} layers"] = attempt(f"{tag} ours, CUDA graph of {LAYERS} layers (capture)",
                                                             lambda: cuda_graph(layers))
    err_mx = None
    if mx is not None:
        def ours_mx():
            return kernels.moe_mxfp4(x, mx[0], mx[1], mx[2], mx[3], ids, tw)
        fns["ours mxfp4"] = ours_mx
        if ON_GPU and phase == "decode":
            fns["ours mxfp4, CUDA graph"] = attempt(
                f"{tag} ours mxfp4, CUDA graph (capture)",
                lambda: cuda_graph(lambda: kernels.moe_mxfp4(x, mx[0], mx[1], mx[2], mx[3], ids, tw, validate=False)))
            mx_copies = [mx] + [tuple(t.clone() for t in mx) for _ in range(LAYERS - 1)]

            def mx_layers():
                for q13, s13, q2, s2 in mx_copies:
                    kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False)
            fns[f"ours mxfp4, CUDA graph of {LAYERS} layers"] = attempt(
                f"{tag} ours mxfp4, CUDA graph of {LAYERS} layers (capture)", lambda: cuda_graph(mx_layers))
        y_mx = attempt(f"{tag} ours mxfp4 (check)", ours_mx)
        ref_mx = attempt(f"{tag} eager loop on dequantised mxfp4 (check)",
                         lambda: eager_moe(x, mx_deq[0], mx_deq[1], ids, tw)) if mx_deq is not None else None
        err_mx = rel_err(y_mx, ref_mx)
        row["mxfp4_max_rel_err_vs_bf16_eager"] = rel_err(y_mx, ref)    # the quantisation's own error too
        del y_mx, ref_mx
    del ref

    for name, fn in fns.items():
        label = f"{tag} {name}"
        ms = attempt(label, lambda: timed(fn)) if fn is not None else None
        if ms and name.endswith(f"of {LAYERS} layers"):
            ms /= LAYERS                        # per layer
        peer = {"ms": ms}
        if ms:
            nbytes = row["bytes_mxfp4"] if name.startswith("ours mxfp4") else row["bytes"]
            peer["tflops"] = tflops(flops, ms)
            if phase == "decode" and not name.startswith("dense"):
                peer["gbps"] = gbps(nbytes, ms)
                peer["pct_copy"] = 100 * peer["gbps"] / copy
        if name == "ours":
            peer["max_rel_err_vs_eager"] = err_ours
        if name == "ours mxfp4":
            peer["max_rel_err_vs_eager"] = err_mx
            peer["max_rel_err_vs_bf16_eager"] = row.pop("mxfp4_max_rel_err_vs_bf16_eager", None)
        if name == "torch.compile":
            peer.update(compile_info)
            if not compile_ok:
                peer["error"] = ERRORS.get(f"{tag} torch.compile (compile)")
        if ms is None and "error" not in peer:
            peer["error"] = ERRORS.get(label) or ERRORS.get(f"{tag} {name} (check)")
        row["peers"][name] = peer
    kernels.raise_deferred_errors()
    dense_ms = row["peers"]["dense bound (cuBLAS)"]["ms"]
    eager_ms = row["peers"]["eager loop"]["ms"]
    for name, peer in row["peers"].items():
        if peer["ms"]:
            peer["pct_dense"] = 100 * dense_ms / peer["ms"] if dense_ms else None
            peer["x_eager"] = eager_ms / peer["ms"] if eager_ms else None
    line = " | ".join(f"{n} {p['ms']:.3f} ms" + (f" ({p['pct_copy']:.0f}% copy)" if p.get("pct_copy") else "")
                      if p["ms"] else f"{n} failed" for n, p in row["peers"].items())
    print(f"  {line}\n  max rel err vs eager: ours {fmt(err_ours, sci=True)}"
          + (f", ours mxfp4 {fmt(err_mx, sci=True)}" if mx is not None else ""), flush=True)
    del x, ids, tw, a_up, a_down, compiled, fns
    torch._dynamo.reset()
    return row


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def markdown(rows, info, copy, models):
    shapes = "; ".join(f"{m} E {E}, top {k}, H {H}, I {I}" for m, (E, k, H, I) in models.items())
    dt = "bf16" if DT == torch.bfloat16 else "fp32"
    lines = [f"# MoE expert layer on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}; {dt}; {info['timing']}. "
             f"Copy ceiling {copy:.0f} GB/s. Shapes: {shapes}. FLOPs 2 T k (2 I H + I H). "
             "dense bound: cuBLAS F.linear [T k, H] x [H, 2I] and [T k, I] x [I, H] (one expert's weights) "
             "timed together, the same FLOPs; '% dense' = dense bound ms / ms. GB/s (decode rows): the weights "
             "of the experts the ids touch (bf16, or codes + scales for mxfp4) plus x and y, once. "
             "eager loop: transformers' sparse-block expert loop; torch.compile: the same function, default "
             "mode, compile not timed. 'max rel err': max |y - eager| / max |eager| (mxfp4: against the eager "
             "loop on the dequantised weights). ours: the call as made, the permutation and the "
             "ids' check included (bad ids are counted on the device; validate=True reads the count back, one "
             "sync after the launches); 'validate=deferred' copies the count to the host without a sync (a later "
             "call raises); 'validate=False' skips that read; 'CUDA graph' (decode rows) replays "
             "the validate=False call captured in a graph: the GPU's time without the host's launch cost; "
             f"'CUDA graph of {LAYERS} layers': {LAYERS} such calls, each on its own copy of the weights (no "
             "weight byte read from L2 that the call before left there), in one graph, per call: a model's decode "
             "step is one graph, where a layer pays no graph launch of its own.", "", "Routing:", ""]
    lines += [f"- {kind}: {text}" for kind, text in ROUTING.items()]
    lines += ["", "| model | routing | T | experts touched | entries per expert | peer | ms | TFLOP/s | % dense "
              "| GB/s | % of copy | x eager | max rel err |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, p in r["peers"].items():
            ms = fmt(p["ms"], 3) if p["ms"] else f"failed: {(p.get('error') or '')[:80]}"
            lines.append(f"| {r['model']} | {r['routing']} | {r['T']} | {r['experts_touched']} | "
                         f"{r['entries_per_expert_min']}-{r['entries_per_expert_max']} | {name} | {ms} | "
                         f"{fmt(p.get('tflops'), 1)} | {fmt(p.get('pct_dense'))} | {fmt(p.get('gbps'))} | "
                         f"{fmt(p.get('pct_copy'))} | {fmt(p.get('x_eager'), 2)} | "
                         f"{fmt(p.get('max_rel_err_vs_eager'), sci=True)} |")
    notes = []
    for r in rows:
        c = r["peers"].get("torch.compile", {})
        if "graph_breaks" in c:
            notes.append(f"- {r['tag']}: torch.compile {c['graph_breaks']} graph breaks, "
                         f"{c['compile_and_first_calls_s']:.1f} s to compile and run the first two calls")
        m = r["peers"].get("ours mxfp4", {})
        if m.get("max_rel_err_vs_bf16_eager") is not None:
            notes.append(f"- {r['tag']}: ours mxfp4 against the eager loop on the bf16 weights (quantisation "
                         f"included): {fmt(m['max_rel_err_vs_bf16_eager'], sci=True)}")
    if notes:
        lines += ["", "## Per row", ""] + notes
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    return lines


QUICK_SHAPES = False


def main(argv=None):
    global QUICK_SHAPES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for bench_moe.json and .md (default results/<gpu>/, e.g. results/gpu-h200; "
                         "--quick and CPU runs print only unless given)")
    ap.add_argument("--shapes", default=None, help="comma-separated substrings of row tags, e.g. mixtral,qwen3-moe/decode")
    ap.add_argument("--quick", action="store_true", help="one small model, for a smoke run")
    args = ap.parse_args(argv)
    QUICK_SHAPES = args.quick or not ON_GPU
    models = QUICK if QUICK_SHAPES else MODELS
    wanted = [s for s in args.shapes.split(",") if s] if args.shapes else None
    out = args.out
    if out is None and ON_GPU and not QUICK_SHAPES:
        out = Path(__file__).resolve().parents[1] / "results" / gpu_folder()
    if not ON_GPU:
        print("bench_moe: no GPU; the quick shapes in fp32 through the Triton interpreter (not a measurement)")

    copy = ceiling()
    print(f"copy ceiling {copy:.0f} GB/s; kernels.moe_mxfp4: {'yes' if hasattr(kernels, 'moe_mxfp4') else 'absent'}",
          flush=True)
    rows = []
    for model, (E, k, H, I) in models.items():
        rows += run_model(model, E, k, H, I, wanted, copy)
    if not rows:
        sys.exit(f"bench_moe: no row matches --shapes {args.shapes!r}")
    timing = ("triton.testing.do_bench median, warmup 25 ms, rep 200 ms" if ON_GPU
              else "perf_counter median of 3 calls")
    info = meta(copy_gbps=copy, dtype=str(DT).replace("torch.", ""), timing=timing, routing=ROUTING,
                    models={m: dict(zip(("E", "top_k", "H", "I"), v)) for m, v in models.items()},
                    moe_mxfp4=hasattr(kernels, "moe_mxfp4"), quick=QUICK_SHAPES, shapes_filter=args.shapes)
    lines = markdown(rows, info, copy, models)
    print("\n".join(lines))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_moe.json").write_text(json.dumps({"meta": info, "rows": rows, "errors": ERRORS}, indent=1) + "\n")
        (out / "bench_moe.md").write_text("\n".join(lines) + "\n")
        print(f"wrote {out / 'bench_moe.json'} and {out / 'bench_moe.md'}")


if __name__ == "__main__":
    main()

"""decoder: a whole Qwen2-style model (models/qwen2.py) against transformers' own Qwen2ForCausalLM.

A case is a tiny random model and a ragged batch of prompts:

    shape  (layers, hidden, heads, kv_heads, head_dim, intermediate, vocab)
    params lens "7,3" (prompt lengths), steps (teacher-forced decode steps), tied, theta,
           cache "contiguous" | "paged", block_size (paged)

Weights are drawn in float64 from the case's seed (models/tiny.py, random_weights: activations
O(1), attention and the next-token distribution far from uniform, logits of a few tens) and
rounded to the case dtype; kernel, reference and oracle all use those rounded weights.

Outputs, both logits [.., vocab] in the case dtype:
  prefill  every prompt position of the packed batch (flash_attention, varlen) [sum(lens), V];
  decode   `steps` decode steps (decode_attention on the KV cache), each fed a fixed random
           continuation token (teacher forcing, so the check never depends on an argmax) [B, steps, V].
The oracle runs each prompt + continuation as one sequence through transformers' model in
float64 (oracles/decoder.py); the reference is transformers' model as shipped, in the case dtype.

Error scale (rtol is relative to it): logit v's sum of |terms|, S_v = sum_k |h_k| |W_vk| with h
the oracle's final normed hidden state and W the LM head, as for matmul (docs/NUMERICS.md): an
error of relative size e in h moves logit v by at most e S_v, however far it cancels.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.cases import Case
from harness.op import Op
from harness.strategies import seeds
from models.tiny import random_weights
from oracles._torch import one_thread

GQA = ((4, 2), (4, 1), (2, 2), (2, 1), (6, 3), (4, 4))     # (heads, kv_heads): ratios 1, 2, 4 and MQA
HEAD_DIMS = (8, 12, 16)                                     # 12: not a power of two (masked tiles)


def _lens(text: str) -> list:
    return [int(t) for t in text.split(",")]


def hf_config(case: Case) -> dict:
    """The case's model as a transformers config.json dict."""
    layers, hidden, heads, kv_heads, head_dim, inter, vocab = case.shape
    return dict(model_type="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=head_dim, tie_word_embeddings=bool(case.param("tied", False)), rms_norm_eps=1e-6,
                rope_theta=float(case.param("theta", 10000.0)),   # transformers >= 5 moves it to rope_parameters
                max_position_embeddings=256, hidden_act="silu")


def sequences(inp) -> list:
    """Each prompt followed by its continuation: what the oracle runs."""
    return [list(p) + list(c) for p, c in zip(inp["prompts"], inp["cont"])]


def split_rows(rows: list, lens: list, steps: int):
    """Per-sequence [T, V] rows -> (prefill [sum(lens), V], decode [B, steps, V])."""
    prefill = torch.cat([r[:n] for r, n in zip(rows, lens)])
    decode = torch.stack([r[n:n + steps] for r, n in zip(rows, lens)])
    return prefill, decode


def oracle_model(inp, weights: dict | None = None):
    """transformers' float64 model on these weights (the case's unless given), on the case's device."""
    from oracles.decoder import hf_model
    return hf_model(inp["hf_config"], inp["weights"] if weights is None else weights, device=inp["model"].device)


@one_thread
def oracle_outputs(inp, weights: dict | None = None, decode_position_shift: int = 0):
    """(prefill, decode) logits of transformers' float64 model on these weights (the case's
    unless given). decode_position_shift moves the RoPE positions of the decoded tokens (a
    mutant: decode positions off by one)."""
    model = oracle_model(inp, weights)
    rows = []
    with torch.no_grad():
        for seq, n in zip(sequences(inp), inp["lens"]):
            pos = torch.arange(len(seq), device=model.device)
            pos[n:] += decode_position_shift
            out = model(torch.tensor([seq], device=model.device), position_ids=pos[None])
            rows.append(out.logits[0].to(torch.float64))
    return split_rows(rows, inp["lens"], inp["steps"])


def run_model(model, prompts, cont, *, cache="contiguous", block_size=4, poison=True):
    """Our decoder: packed prefill (all positions' logits) then one teacher-forced decode step per
    continuation column. Returns (prefill [sum(lens), V], decode [B, steps, V])."""
    from models.kv_cache import make_cache

    steps = cont.shape[1]
    capacity = max(len(p) for p in prompts) + steps
    kv = make_cache(cache, model.config, len(prompts), capacity, model.dtype, model.device, block_size=block_size,
                    poison=poison)
    prefill = model.prefill(prompts, kv, all_logits=True)
    decode = [model.decode(cont[:, s].to(model.device), kv) for s in range(steps)]
    if decode:
        return prefill, torch.stack(decode, dim=1)
    return prefill, torch.empty((len(prompts), 0, prefill.shape[-1]), dtype=prefill.dtype, device=prefill.device)


def judge_greedy(got: list, want: list, want_logits: list, allowed: list) -> tuple[str | None, list]:
    """Greedy tokens `got` against the oracle's `want` (its logits [V] and the budget's allowed
    error [V] at every step). A step is decided when the oracle's top-2 margin exceeds
    allowed(top1) + allowed(top2): no pair of logits within budget can swap there. Returns
    (failure, notes): a different token at a decided step is a failure; at a near-tie it ends
    the comparison (the sequences differ from there on) with a note, and near-ties where the
    tokens agree are noted too, so none is counted silently."""
    notes = []
    for i, (g, w) in enumerate(zip(got, want)):
        top2 = torch.topk(want_logits[i], 2)
        t1, t2 = int(top2.indices[0]), int(top2.indices[1])
        margin = float(top2.values[0] - top2.values[1])
        tie_at = float(allowed[i][t1] + allowed[i][t2])
        near = margin <= tie_at
        if g == w:
            if near:
                notes.append(f"step {i}: near-tie (margin {margin:.3g} <= {tie_at:.3g}), same token {g}")
            continue
        if not near:
            return (f"step {i}: token {g} where the oracle picks {w} by a margin of {margin:.3g}, more than the "
                    f"{tie_at:.3g} the budget allows the two logits", notes)
        notes.append(f"step {i}: diverged on a near-tie (margin {margin:.3g} <= {tie_at:.3g}): token {g} vs the "
                     f"oracle's {w}; steps {i + 1}-{len(want) - 1} not compared")
        break
    return None, notes


class Decoder(Op):
    name = "decoder"
    launcher = None
    outputs = ("prefill", "decode")

    def inputs(self, case, device):
        from models.config import Qwen2Config
        from models.loader import model_from_state_dict

        gen = case.generator()
        hf = hf_config(case)
        config = Qwen2Config.from_dict(hf)
        weights = {k: v.to(case.torch_dtype).to(torch.float64)
                   for k, v in random_weights(config.tensor_shapes(), gen).items()}
        lens = _lens(case.param("lens"))
        steps = int(case.param("steps", 0))
        prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in lens]
        cont = torch.randint(0, config.vocab_size, (len(lens), steps), generator=gen)
        return {"hf_config": hf, "weights": weights, "lens": lens, "steps": steps, "prompts": prompts, "cont": cont,
                "cache": case.param("cache", "contiguous"), "block_size": int(case.param("block_size", 4)),
                "model": model_from_state_dict(config, weights, case.torch_dtype, device)}

    def output_shapes(self, inp):
        V = inp["model"].config.vocab_size
        return {"prefill": (sum(inp["lens"]), V), "decode": (len(inp["lens"]), inp["steps"], V)}

    def kernel(self, inp, out, **config):
        prefill, decode = run_model(inp["model"], inp["prompts"], inp["cont"], cache=inp["cache"],
                                    block_size=inp["block_size"])
        out["prefill"].copy_(prefill)
        out["decode"].copy_(decode)
        return out["prefill"], out["decode"]

    def reference(self, inp):
        from references.decoder import decoder_logits
        rows = decoder_logits(inp["hf_config"], inp["weights"], inp["model"].dtype, sequences(inp), inp["model"].device)
        return split_rows(rows, inp["lens"], inp["steps"])

    def oracle(self, inp):
        return oracle_outputs(inp)

    @one_thread
    def error_scale(self, inp, expected):
        from oracles.decoder import sequence_hidden
        model = oracle_model(inp)
        head = model.lm_head.weight.detach().abs()
        rows = [h.abs() @ head.T for h in sequence_hidden(model, sequences(inp))]
        return split_rows(rows, inp["lens"], inp["steps"])

    def cases(self, dtype, size, config):
        small = size == "small"

        @st.composite
        def draw_case(draw):
            heads, kv_heads = draw(st.sampled_from(GQA))
            head_dim = draw(st.sampled_from(HEAD_DIMS))
            hidden = draw(st.sampled_from((32, 48) if small else (64, 128, 256)))
            inter = draw(st.sampled_from((48, 64) if small else (128, 344, 512)))
            vocab = draw(st.sampled_from((64, 97) if small else (256, 1000, 4099)))
            layers = draw(st.integers(1, 2 if small else 4))
            B = draw(st.integers(1, 2 if small else 4))
            lens = [draw(st.integers(1, 6 if small else 64)) for _ in range(B)]
            steps = draw(st.integers(1, 2 if small else 8))
            cache = draw(st.sampled_from(("contiguous", "paged")))
            params = dict(lens=",".join(map(str, lens)), steps=steps, tied=draw(st.booleans()),
                          theta=draw(st.sampled_from((10000.0, 1000000.0))), cache=cache)
            if cache == "paged":
                params["block_size"] = draw(st.sampled_from((1, 3, 4, 16)))
            return Case.make(self.name, dtype, (layers, hidden, heads, kv_heads, head_dim, inter, vocab),
                             seed=draw(seeds()), config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed, **kw):
            kw.setdefault("theta", 10000.0)
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        return [
            # GQA 4/2, ragged prompts, tied, 2 layers; Qwen2's RoPE base.
            case((2, 32, 4, 2, 8, 64, 96), 1, lens="5,2", steps=2, tied=True, theta=1000000.0),
            # MQA (4/1), a head dim that is not a power of two, untied head, paged with pages of 3
            # (page boundaries inside the prompt and between decode steps).
            case((1, 48, 4, 1, 12, 64, 97), 2, lens="6", steps=3, cache="paged", block_size=3),
            # MHA (2/2), head dim 16, a one-token prompt beside an 8-token one.
            case((1, 32, 2, 2, 16, 48, 64), 3, lens="1,8", steps=2, tied=True),
            # 4 layers, GQA 4/2, a paged cache of 2-slot pages.
            case((4, 32, 4, 2, 8, 64, 80), 4, lens="3", steps=1, cache="paged", block_size=2),
        ]


OPS = {"decoder": Decoder()}

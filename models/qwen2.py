"""A Qwen2-style decoder (Qwen2, Bielik 1.5B) assembled from the project's kernels.

Per layer, as Hugging Face's Qwen2DecoderLayer:

    h        = rmsnorm(x)                                   (add_rmsnorm from the 2nd layer on:
                                                              x = residual + previous MLP output)
    q, k, v  = split(h @ W_qkv^T + b_qkv)                   one matmul for the three projections
    q, k     = rope(q, k)                                   neox pairs (i, i + D/2), as HF's rotate_half; one call
                                                            (decode: rope_into_cache also writes k, v to the cache)
    a        = flash_attention(q, k, v, causal, GQA)        prefill; decode_attention on the cache
    h, x     = add_rmsnorm(a @ W_o^T, x)                    x: the residual stream, rounded per add
    m        = swiglu(h, W_gate, W_up)  @ W_down^T          silu(gate) * up in one kernel

then the final add + RMSNorm and the LM head (the embedding when tied). Every floating-point
operation runs in a kernel; torch only views, concatenates, writes the prefill's keys and values
into the cache and picks tokens.

Where our rounding differs from Hugging Face's in the same dtype, ours rounds less: RMSNorm
rounds once (HF: the normalised value, then times the weight), SwiGLU once (HF: gate, silu(gate),
up, product), and RoPE computes its angles in float64 (HF: fp32 angles).

Prompts are prefilled as one packed batch (no padding; varlen attention when their lengths
differ); decode steps take one token per sequence against a contiguous or paged KV cache
(models/kv_cache.py), with no host sync.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from models.config import Qwen2Config
from models.kv_cache import _Cache


@dataclass
class LayerWeights:
    input_norm: torch.Tensor      # [H]
    qkv_w: torch.Tensor           # [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj stacked
    qkv_b: torch.Tensor           # [(Hq + 2 Hkv) D]
    o_w: torch.Tensor             # [H, Hq D]
    post_norm: torch.Tensor       # [H]
    gate_w: torch.Tensor          # [I, H]  } the two halves of one [2I, H] tensor
    up_w: torch.Tensor            # [I, H]  }
    down_w: torch.Tensor          # [H, I]


class Qwen2Decoder:
    def __init__(self, config: Qwen2Config, embed: torch.Tensor, layers: list, norm: torch.Tensor,
                 lm_head: torch.Tensor):
        self.config = config
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head          # the embedding itself when tied
        self.dtype = embed.dtype
        self.device = embed.device
        self.prefill_graphs = {}        # (batch, padded length) -> PrefillGraph (models/prefill_graph.py)
        self.decode_graphs = {}         # generate()'s (cache kind, batch, capacity, block size) -> (cache, DecodeGraph)

    @classmethod
    def from_tensors(cls, config: Qwen2Config, tensors: dict, dtype: torch.dtype, device) -> "Qwen2Decoder":
        """From a Hugging Face state dict whose names and shapes were checked
        (models/loader.py, check_tensors)."""
        def t(name):
            return tensors[name].to(device=device, dtype=dtype).contiguous()

        layers = []
        I = config.intermediate_size
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv_w = torch.cat([t(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            qkv_b = torch.cat([t(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            # gate and up as the two halves of one [2I, H] tensor: swiglu's merged-weight TMA path
            # (one accumulator over both; kernels/gemm.py)
            gate_up = torch.cat([t(p + "mlp.gate_proj.weight"), t(p + "mlp.up_proj.weight")])
            layers.append(LayerWeights(
                input_norm=t(p + "input_layernorm.weight"), qkv_w=qkv_w, qkv_b=qkv_b,
                o_w=t(p + "self_attn.o_proj.weight"), post_norm=t(p + "post_attention_layernorm.weight"),
                gate_w=gate_up[:I], up_w=gate_up[I:], down_w=t(p + "mlp.down_proj.weight")))
        embed = t("model.embed_tokens.weight")
        lm_head = embed if config.tie_word_embeddings else t("lm_head.weight")
        return cls(config, embed, layers, t("model.norm.weight"), lm_head)

    # -----------------------------------------------------------------------------------------
    def _qkv(self, qkv: torch.Tensor, pos: torch.Tensor):
        """[N, (Hq + 2 Hkv) D] projections -> q [N, Hq, D] and k [N, Hkv, D] after RoPE, and v
        [N, Hkv, D] (a strided view). q and k lie side by side in each row, so one rope call
        rotates both as Hq + Hkv heads."""
        c = self.config
        N, D, Hq = qkv.shape[0], c.head_dim, c.num_attention_heads
        qk = kernels.rope(qkv[:, :c.q_size + c.kv_size].view(1, N, Hq + c.num_key_value_heads, D), pos, c.rope_theta)
        v = qkv[:, c.q_size + c.kv_size:].view(N, c.num_key_value_heads, D)
        return qk[0, :, :Hq], qk[0, :, Hq:], v

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, attend, *, decode_qkv=None) -> torch.Tensor:
        """The decoder layers on hidden states x [N, H] at positions [N] (int32 or int64); attend(layer,
        q [N, Hq, D], k and v [N, Hkv, D]) -> [N, Hq, D]. With decode_qkv(layer, x, residual, w) ->
        (q, u) (decode: the norm, the qkv projection, RoPE and the cache write in one call,
        residual None at the first layer), attend(layer, q) instead. Returns the final normed
        hidden states."""
        c = self.config
        eps = c.rms_norm_eps
        pos = positions.view(1, -1)
        residual, mlp_out = x, None
        for i, w in enumerate(self.layers):
            # Each norm and the projection after it: one launch for a decode step at batch 1
            # (the matrix-vector kernel normalises its row itself), the two ops otherwise.
            inp, res = (residual, None) if mlp_out is None else (mlp_out, residual)
            if decode_qkv is not None:
                q, residual = decode_qkv(i, inp, res, w)
                a = attend(i, q)
            else:
                qkv, residual = kernels.add_rmsnorm_matmul(inp, res, w.input_norm, w.qkv_w, w.qkv_b, eps)
                a = attend(i, *self._qkv(qkv, pos))
            g, residual = kernels.add_rmsnorm_swiglu(kernels.matmul(a.view(a.shape[0], -1), w.o_w), residual,
                                                     w.post_norm, w.gate_w, w.up_w, eps, c.hidden_act)
            mlp_out = kernels.matmul(g, w.down_w)
        return kernels.add_rmsnorm(mlp_out, residual, self.norm, eps)[0]     # (a config has >= 1 layer)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return kernels.matmul(h, self.lm_head)

    # -----------------------------------------------------------------------------------------
    def prefill(self, prompts: list, cache: _Cache | None = None, *, all_logits: bool = False,
                cuda_graph: bool = False) -> torch.Tensor:
        """Run whole prompts (lists or 1-d tensors of token ids, of any lengths >= 1) as one packed
        batch. With a cache (empty, one row per prompt) their keys and values are stored in it.
        Returns the logits of each prompt's last token [B, V], or with all_logits those of every
        token, packed [sum of lengths, V].

        cuda_graph: prompts of one length (last-token logits only) replay a CUDA graph of their
        padded shape, captured on first use (models/prefill_graph.py); others run eagerly."""
        lens = [len(p) for p in prompts]
        if not lens or min(lens) < 1:
            raise ValueError(f"prompts: expected at least one prompt, each of >= 1 token, got lengths {lens}")
        if cache is not None:
            if cache.batch != len(prompts) or any(cache.lengths):
                raise ValueError(f"cache: expected an empty cache of {len(prompts)} rows, got {cache.batch} rows "
                                 f"of lengths {cache.lengths}")
            cache.reserve(lens)
        dev = self.device
        ids = torch.cat([torch.as_tensor(p, dtype=torch.int64).view(-1) for p in prompts]).to(dev)
        if cuda_graph and not all_logits and len(set(lens)) == 1:
            from models.prefill_graph import MAX_TOKENS, PrefillGraph, bucket

            key = (len(lens), bucket(lens[0]))
            if key[0] * key[1] <= MAX_TOKENS:
                if key not in self.prefill_graphs:
                    self.prefill_graphs[key] = PrefillGraph(self, *key)
                logits = self.prefill_graphs[key](ids.view(len(lens), -1), cache)
                if cache is not None:
                    cache.set_lengths(lens)
                return logits
        positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(dev)
        rows = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(dev)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)

        same_length = len(set(lens)) == 1
        B, T = len(lens), lens[0]

        def attend(i, q, k, v):
            if cache is not None:
                cache.write(i, k, v, rows, positions)
            if same_length:
                # Prompts of one length: the fixed-length kernel on [B, T, H, D] views. The varlen
                # launcher reads cu_seqlens on the host (a sync per layer).
                out = kernels.flash_attention(q.view(B, T, *q.shape[1:]), k.view(B, T, *k.shape[1:]),
                                              v.view(B, T, *v.shape[1:]), True)
                return out.view(q.shape)
            return kernels.flash_attention(q, k, v, True, cu_seqlens_q=cu, cu_seqlens_k=cu)

        h = self._layers(kernels.embedding(ids, self.embed), positions, attend)
        if cache is not None:
            cache.set_lengths(lens)
        if not all_logits:
            h = h[cu[1:].long() - 1]
        return self.logits(h)

    def decode(self, tokens: torch.Tensor, cache: _Cache) -> torch.Tensor:
        """One token per cache row (tokens [B] on the model's device, ids the caller guarantees,
        e.g. sampled from our own logits): appends it to the cache and returns its logits [B, V].
        No host sync: lengths advance on both sides without reading the device."""
        B = cache.batch
        if tokens.shape != (B,):
            raise ValueError(f"tokens: expected shape ({B},) (one per cache row), got {tuple(tokens.shape)}")
        cache.reserve([n + 1 for n in cache.lengths])
        logits = self.decode_step(tokens, cache)
        cache.advance()
        return logits

    def decode_step(self, tokens: torch.Tensor, cache: _Cache) -> torch.Tensor:
        """The device work of decode(): every tensor it reads or writes other than tokens lives in
        the cache, and it ends by advancing cache.seqlens in place, so a CUDA graph can capture
        it once and replay it every step (models/decode_graph.py). The caller reserves room
        first and advances the host lengths after."""
        positions = cache.seqlens          # (int32: the kernels take it as it is, no conversion launched)
        seqlens = cache.seqlens + 1
        c = self.config

        def decode_qkv(i, x, residual, w):
            # row b's token at position seqlens[b]: q turned, k turned and v stored in the cache
            k_cache, v_cache, table = cache.view(i)
            return kernels.add_rmsnorm_qkv_rope(x, residual, w.input_norm, w.qkv_w, w.qkv_b, positions, k_cache,
                                                v_cache, c.num_attention_heads, c.rope_theta, c.rms_norm_eps,
                                                block_table=table, validate=False)

        def attend(i, q):
            k_cache, v_cache, table = cache.view(i)
            return kernels.decode_attention(q, k_cache, v_cache, seqlens, block_table=table, validate=False)

        x = kernels.embedding(tokens, self.embed, validate=False)
        h = self._layers(x, positions, attend, decode_qkv=decode_qkv)
        cache.seqlens.copy_(seqlens)
        return self.logits(h)

"""Bad input gets a clear error naming the argument, before any launch; never a wrong answer."""
import gc
import math
import time

import pytest
import torch

import kernels
from kernels.cross_entropy import _LABEL_BLOCK


@pytest.fixture
def dev(backend):
    return backend.device


def T(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape).to(dtype=dtype, device=device)


def P(B, T_, device, dtype=torch.int64):
    return torch.zeros(B, T_, dtype=dtype, device=device)


E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def F8(*shape, dtype=E4, device="cpu"):
    return torch.randn(*shape).to(dtype).to(device)


def U8(*shape, device="cpu"):
    return torch.zeros(shape, dtype=torch.uint8, device=device)


def S(*shape, device="cpu", dtype=torch.float32):
    """Scales: S() is a 0-d one (per tensor)."""
    return torch.ones(shape, dtype=dtype, device=device)


def MLA(d, **kw):
    """mla_decode on small valid inputs (2 sequences, Tq 1, H 2, L 8, R 4, 6 cache positions),
    any argument replaced by kw; paged=True: pools of 4 pages of 4 slots and a table of 2 pages."""
    args = dict(q_nope=T(2, 1, 2, 8, device=d), q_pe=T(2, 1, 2, 4, device=d), c_kv=T(2, 6, 8, device=d),
                k_pe=T(2, 6, 4, device=d), lens=torch.tensor([6, 3], device=d), softmax_scale=0.3)
    if kw.pop("paged", False):
        args.update(c_kv=T(4, 4, 8, device=d), k_pe=T(4, 4, 4, device=d),
                    page_table=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device=d))
    args.update(kw)
    return kernels.mla_decode(**args)


def GDN(d, B=1, T_=4, Hk=1, Hv=2, Dk=8, Dv=4, dtype=torch.float32, **kw):
    """gated_delta_rule on small valid inputs (B 1, T 4, Hk 1, Hv 2, Dk 8, Dv 4), any argument
    replaced by kw."""
    args = dict(q=T(B, T_, Hk, Dk, dtype=dtype, device=d), k=T(B, T_, Hk, Dk, dtype=dtype, device=d),
                v=T(B, T_, Hv, Dv, dtype=dtype, device=d), g=-T(B, T_, Hv, device=d).abs(),
                beta=T(B, T_, Hv, device=d).sigmoid())
    args.update(kw)
    return kernels.gated_delta_rule(**args)


def GDN1(d, B=2, Hk=1, Hv=2, Dk=8, Dv=4, **kw):
    """gated_delta_rule_decode on small valid inputs (B 2, Hk 1, Hv 2, Dk 8, Dv 4), any argument
    replaced by kw."""
    args = dict(q=T(B, Hk, Dk, device=d), k=T(B, Hk, Dk, device=d), v=T(B, Hv, Dv, device=d),
                g=-T(B, Hv, device=d).abs(), beta=T(B, Hv, device=d).sigmoid(), state=T(B, Hv, Dk, Dv, device=d))
    args.update(kw)
    return kernels.gated_delta_rule_decode(**args)


def SGB(d, **kw):
    """swiglu_backward on small valid inputs (x [4, 8], N 5, both biases), any argument replaced by kw."""
    args = dict(dy=T(4, 5, device=d), x=T(4, 8, device=d), w_gate=T(5, 8, device=d), w_up=T(5, 8, device=d),
                b_gate=T(5, device=d), b_up=T(5, device=d))
    args.update(kw)
    return kernels.swiglu_backward(**args)


def FAB(d, varlen=False, **kw):
    """flash_attention_backward on small valid inputs (B 1, Tq 3, Tk 4, Hq 2, Hkv 1, D 16; varlen:
    two sequences packed), any argument replaced by kw."""
    if varlen:
        args = dict(q=T(5, 2, 16, device=d), k=T(6, 1, 16, device=d), v=T(6, 1, 16, device=d), o=T(5, 2, 16, device=d),
                    lse=T(2, 5, device=d), do=T(5, 2, 16, device=d), cu_seqlens_q=torch.tensor([0, 2, 5], device=d),
                    cu_seqlens_k=torch.tensor([0, 4, 6], device=d))
    else:
        args = dict(q=T(1, 3, 2, 16, device=d), k=T(1, 4, 1, 16, device=d), v=T(1, 4, 1, 16, device=d),
                    o=T(1, 3, 2, 16, device=d), lse=T(1, 2, 3, device=d), do=T(1, 3, 2, 16, device=d))
    args.update(kw)
    return kernels.flash_attention_backward(**args)


# (op, description, call(device), exception, the argument the message must start with)
def ROUTE(d, T_=4, E=8, dtype=torch.float32, **kw):
    """moe_route on small valid inputs (T 4, E 8, top_k 2), any argument replaced by kw."""
    args = dict(logits=T(T_, E, dtype=dtype, device=d), top_k=2)
    args.update(kw)
    return kernels.moe_route(**args)


def MOE(d, T_=4, H=24, I=16, E=8, k=2, dtype=torch.float32, **kw):
    """moe on small valid inputs (T 4, H 24, I 16, E 8, top_k 2), any argument replaced by kw."""
    args = dict(x=T(T_, H, dtype=dtype, device=d), w13=T(E, 2 * I, H, dtype=dtype, device=d),
                w2=T(E, H, I, dtype=dtype, device=d),
                topk_ids=torch.randint(0, E, (T_, k), dtype=torch.int32, device=d),
                topk_weights=torch.rand(T_, k, device=d))
    args.update(kw)
    return kernels.moe(**args)


def MOEMX(d, T_=4, H=64, I=32, E=8, k=2, dtype=torch.float32, **kw):
    """moe_mxfp4 on small valid inputs (T 4, H 64, I 32, E 8, top_k 2; codes and scales of 0: zero
    weights), any argument replaced by kw."""
    args = dict(x=T(T_, H, dtype=dtype, device=d), w13_q=U8(E, 2 * I, H // 2, device=d),
                w13_scales=U8(E, 2 * I, H // 32, device=d), w2_q=U8(E, H, I // 2, device=d),
                w2_scales=U8(E, H, I // 32, device=d),
                topk_ids=torch.randint(0, E, (T_, k), dtype=torch.int32, device=d),
                topk_weights=torch.rand(T_, k, device=d))
    args.update(kw)
    return kernels.moe_mxfp4(**args)


def PERM(d, **kw):
    """moe_permute on small valid inputs (4 tokens, top_k 2, 8 experts, block 4), any argument
    replaced by kw."""
    args = dict(topk_ids=torch.randint(0, 8, (4, 2), dtype=torch.int32, device=d), num_experts=8, block=4)
    args.update(kw)
    return kernels.moe_permute(**args)


def FLCE(d, N=4, V=6, H=8, dtype=torch.float32, **kw):
    """fused_linear_cross_entropy on small valid inputs (N 4, V 6, H 8, one label ignored), any
    argument replaced by kw."""
    labels = torch.arange(N, device=d) % V
    labels[1::3] = -100
    args = dict(h=T(N, H, dtype=dtype, device=d), W=T(V, H, dtype=dtype, device=d), labels=labels)
    args.update(kw)
    return kernels.fused_linear_cross_entropy(**args)


BAD = [
    # rmsnorm / layernorm / add_rmsnorm
    ("rmsnorm", "int input", lambda d: kernels.rmsnorm(torch.ones(2, 4, dtype=torch.int32, device=d), T(4, device=d)), TypeError, "x"),
    ("rmsnorm", "float64 input", lambda d: kernels.rmsnorm(T(2, 4, dtype=torch.float64, device=d), T(4, device=d)), TypeError, "x"),
    ("rmsnorm", "not a tensor", lambda d: kernels.rmsnorm([[1.0, 2.0]], T(2, device=d)), TypeError, "x"),
    ("rmsnorm", "0-d input", lambda d: kernels.rmsnorm(torch.tensor(1.0, device=d), T(1, device=d)), ValueError, "x"),
    ("rmsnorm", "weight length", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(5, device=d)), ValueError, "w"),
    ("rmsnorm", "weight rank", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(1, 4, device=d)), ValueError, "w"),
    ("rmsnorm", "weight dtype", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, dtype=torch.float16, device=d)), TypeError, "w"),
    ("rmsnorm", "weight device", lambda d: kernels.rmsnorm(T(2, 4, device=d), torch.empty(4, device="meta")), ValueError, "w"),
    ("rmsnorm", "eps NaN", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), math.nan), ValueError, "eps"),
    ("rmsnorm", "eps inf", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), math.inf), ValueError, "eps"),
    ("rmsnorm", "eps negative", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), -1e-6), ValueError, "eps"),
    ("rmsnorm", "eps a string", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), "1e-6"), TypeError, "eps"),
    ("rmsnorm", "out shape", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), out=T(2, 5, device=d)), ValueError, "out"),
    ("rmsnorm", "out dtype", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), out=T(2, 4, dtype=torch.float16, device=d)), TypeError, "out"),
    ("rmsnorm", "out strided", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), out=T(4, 2, device=d).t()), ValueError, "out"),
    ("rmsnorm", "block_cols not a power of two", lambda d: kernels.rmsnorm(T(2, 4, device=d), T(4, device=d), block_cols=3), ValueError, "block_cols"),
    ("layernorm", "bias length", lambda d: kernels.layernorm(T(2, 4, device=d), T(4, device=d), T(3, device=d)), ValueError, "b"),
    ("layernorm", "bias dtype", lambda d: kernels.layernorm(T(2, 4, device=d), None, T(4, dtype=torch.bfloat16, device=d)), TypeError, "b"),
    ("layernorm", "eps NaN", lambda d: kernels.layernorm(T(2, 4, device=d), None, None, math.nan), ValueError, "eps"),
    ("add_rmsnorm", "residual shape", lambda d: kernels.add_rmsnorm(T(2, 4, device=d), T(3, 4, device=d), T(4, device=d)), ValueError, "residual"),
    ("add_rmsnorm", "residual dtype", lambda d: kernels.add_rmsnorm(T(2, 4, device=d), T(2, 4, dtype=torch.float16, device=d), T(4, device=d)), TypeError, "residual"),
    ("add_rmsnorm", "out_residual shape", lambda d: kernels.add_rmsnorm(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_residual=T(8, device=d)), ValueError, "out_residual"),
    # the norms' backward passes: (dy, x, w) and add_rmsnorm's (dy, du, x, residual, w)
    ("rmsnorm_backward", "dy shape", lambda d: kernels.rmsnorm_backward(T(3, 4, device=d), T(2, 4, device=d), T(4, device=d)), ValueError, "dy"),
    ("rmsnorm_backward", "dy dtype", lambda d: kernels.rmsnorm_backward(T(2, 4, dtype=torch.float16, device=d), T(2, 4, device=d), T(4, device=d)), TypeError, "dy"),
    ("rmsnorm_backward", "dy not a tensor", lambda d: kernels.rmsnorm_backward(1.0, T(2, 4, device=d), T(4, device=d)), TypeError, "dy"),
    ("rmsnorm_backward", "dy device", lambda d: kernels.rmsnorm_backward(torch.empty(2, 4, device="meta"), T(2, 4, device=d), T(4, device=d)), ValueError, "dy"),
    ("rmsnorm_backward", "int x", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), torch.ones(2, 4, dtype=torch.int32, device=d), T(4, device=d)), TypeError, "x"),
    ("rmsnorm_backward", "weight length", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(5, device=d)), ValueError, "w"),
    ("rmsnorm_backward", "eps negative", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), -1.0), ValueError, "eps"),
    ("rmsnorm_backward", "out_dx shape", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dx=T(2, 5, device=d)), ValueError, "out_dx"),
    ("rmsnorm_backward", "out_dx strided", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dx=T(4, 2, device=d).t()), ValueError, "out_dx"),
    ("rmsnorm_backward", "out_dw shape", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dw=T(1, 4, device=d)), ValueError, "out_dw"),
    ("rmsnorm_backward", "out_dw dtype", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dw=T(4, dtype=torch.bfloat16, device=d)), TypeError, "out_dw"),
    ("rmsnorm_backward", "block_rows not a power of two", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), block_rows=3), ValueError, "block_rows"),
    ("rmsnorm_backward", "block_cols not a power of two", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), block_cols=6), ValueError, "block_cols"),
    ("rmsnorm_backward", "row_groups 0", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), row_groups=0), ValueError, "row_groups"),
    ("rmsnorm_backward", "row_groups a float", lambda d: kernels.rmsnorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), row_groups=2.0), TypeError, "row_groups"),
    ("rmsnorm_backward", "row_groups on empty rows", lambda d: kernels.rmsnorm_backward(T(0, 4, device=d), T(0, 4, device=d), T(4, device=d), row_groups=-1), ValueError, "row_groups"),
    ("layernorm_backward", "dy shape", lambda d: kernels.layernorm_backward(T(2, 5, device=d), T(2, 4, device=d)), ValueError, "dy"),
    ("layernorm_backward", "bias length", lambda d: kernels.layernorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), T(3, device=d)), ValueError, "b"),
    ("layernorm_backward", "bias dtype", lambda d: kernels.layernorm_backward(T(2, 4, device=d), T(2, 4, device=d), None, T(4, dtype=torch.float16, device=d)), TypeError, "b"),
    ("layernorm_backward", "out_dw without w", lambda d: kernels.layernorm_backward(T(2, 4, device=d), T(2, 4, device=d), out_dw=T(4, device=d)), ValueError, "out_dw"),
    ("layernorm_backward", "out_db without b", lambda d: kernels.layernorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_db=T(4, device=d)), ValueError, "out_db"),
    ("layernorm_backward", "out_db shape", lambda d: kernels.layernorm_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), T(4, device=d), out_db=T(5, device=d)), ValueError, "out_db"),
    ("layernorm_backward", "block_rows 0", lambda d: kernels.layernorm_backward(T(2, 4, device=d), T(2, 4, device=d), block_rows=0), ValueError, "block_rows"),
    ("add_rmsnorm_backward", "du shape", lambda d: kernels.add_rmsnorm_backward(T(2, 4, device=d), T(2, 3, device=d), T(2, 4, device=d), T(2, 4, device=d), T(4, device=d)), ValueError, "du"),
    ("add_rmsnorm_backward", "du dtype", lambda d: kernels.add_rmsnorm_backward(T(2, 4, device=d), T(2, 4, dtype=torch.bfloat16, device=d), T(2, 4, device=d), T(2, 4, device=d), T(4, device=d)), TypeError, "du"),
    ("add_rmsnorm_backward", "residual shape", lambda d: kernels.add_rmsnorm_backward(T(2, 4, device=d), None, T(2, 4, device=d), T(1, 4, device=d), T(4, device=d)), ValueError, "residual"),
    ("add_rmsnorm_backward", "dy dtype", lambda d: kernels.add_rmsnorm_backward(T(2, 4, dtype=torch.float16, device=d), None, T(2, 4, device=d), T(2, 4, device=d), T(4, device=d)), TypeError, "dy"),
    ("add_rmsnorm_backward", "out_dresidual shape", lambda d: kernels.add_rmsnorm_backward(T(2, 4, device=d), None, T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dresidual=T(8, device=d)), ValueError, "out_dresidual"),
    # rope / rmsnorm_rope
    ("rope", "3-d input", lambda d: kernels.rope(T(2, 3, 4, device=d), P(2, 3, d)), ValueError, "x"),
    ("rope", "float positions", lambda d: kernels.rope(T(2, 3, 1, 4, device=d), torch.zeros(2, 3, device=d)), TypeError, "positions"),
    ("rope", "positions shape", lambda d: kernels.rope(T(2, 3, 1, 4, device=d), P(3, 2, d)), ValueError, "positions"),
    ("rope", "odd rotary_dim", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), P(2, 3, d), rotary_dim=5), ValueError, "rotary_dim"),
    ("rope", "rotary_dim past D", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), P(2, 3, d), rotary_dim=10), ValueError, "rotary_dim"),
    ("rope", "odd head dim, full rotary", lambda d: kernels.rope(T(2, 3, 1, 7, device=d), P(2, 3, d)), ValueError, "rotary_dim"),
    ("rope", "rotary_dim a float", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), P(2, 3, d), rotary_dim=4.0), TypeError, "rotary_dim"),
    ("rope", "theta zero", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), P(2, 3, d), theta=0.0), ValueError, "theta"),
    ("rope", "theta inf", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), P(2, 3, d), theta=math.inf), ValueError, "theta"),
    ("rope", "unknown style", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), P(2, 3, d), style="llama"), ValueError, "style"),
    ("rope", "positions device", lambda d: kernels.rope(T(2, 3, 1, 8, device=d), torch.zeros(2, 3, dtype=torch.int64, device="meta")), ValueError, "positions"),
    ("rmsnorm_rope", "weight length", lambda d: kernels.rmsnorm_rope(T(2, 3, 1, 8, device=d), T(4, device=d), P(2, 3, d)), ValueError, "w"),
    ("rmsnorm_rope", "eps NaN", lambda d: kernels.rmsnorm_rope(T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d), math.nan), ValueError, "eps"),
    ("rmsnorm_rope", "weight dtype", lambda d: kernels.rmsnorm_rope(T(2, 3, 1, 8, device=d), T(8, dtype=torch.float16, device=d), P(2, 3, d)), TypeError, "w"),
    # softmax
    ("softmax", "int input", lambda d: kernels.softmax(torch.ones(2, 4, dtype=torch.int64, device=d)), TypeError, "x"),
    ("softmax", "scale NaN", lambda d: kernels.softmax(T(2, 4, device=d), math.nan), ValueError, "scale"),
    ("softmax", "scale zero", lambda d: kernels.softmax(T(2, 4, device=d), 0.0), ValueError, "scale"),
    ("softmax", "scale negative", lambda d: kernels.softmax(T(2, 4, device=d), -1.0), ValueError, "scale"),
    ("softmax", "scale past fp32", lambda d: kernels.softmax(T(2, 4, device=d), 1e39), ValueError, "scale"),
    ("softmax", "causal not a bool", lambda d: kernels.softmax(T(2, 4, device=d), 1.0, 1), TypeError, "causal"),
    ("softmax", "causal on 1-d", lambda d: kernels.softmax(T(4, device=d), 1.0, True), ValueError, "x"),
    ("softmax", "out shape", lambda d: kernels.softmax(T(2, 4, device=d), out=T(4, 2, device=d)), ValueError, "out"),
    # flash_attention
    ("flash_attention", "3-d q without cu_seqlens", lambda d: kernels.flash_attention(T(2, 4, 8, device=d), T(2, 4, 8, device=d), T(2, 4, 8, device=d)), ValueError, "q"),
    ("flash_attention", "heads do not divide", lambda d: kernels.flash_attention(T(1, 4, 6, 8, device=d), T(1, 4, 4, 8, device=d), T(1, 4, 4, 8, device=d)), ValueError, "k"),
    ("flash_attention", "head dim past 256", lambda d: kernels.flash_attention(T(1, 2, 1, 300, device=d), T(1, 2, 1, 300, device=d), T(1, 2, 1, 300, device=d)), ValueError, "q"),
    ("flash_attention", "head dims differ", lambda d: kernels.flash_attention(T(1, 2, 1, 16, device=d), T(1, 2, 1, 32, device=d), T(1, 2, 1, 32, device=d)), ValueError, "k"),
    ("flash_attention", "v shape", lambda d: kernels.flash_attention(T(1, 2, 1, 16, device=d), T(1, 3, 1, 16, device=d), T(1, 2, 1, 16, device=d)), ValueError, "v"),
    ("flash_attention", "batch differs", lambda d: kernels.flash_attention(T(2, 2, 1, 16, device=d), T(1, 3, 1, 16, device=d), T(1, 3, 1, 16, device=d)), ValueError, "k"),
    ("flash_attention", "dtypes differ", lambda d: kernels.flash_attention(T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, dtype=torch.float16, device=d), T(1, 2, 1, 16, device=d)), TypeError, "k"),
    ("flash_attention", "scale NaN", lambda d: kernels.flash_attention(T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, device=d), scale=math.nan), ValueError, "scale"),
    ("flash_attention", "causal not a bool", lambda d: kernels.flash_attention(T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, device=d), 1), TypeError, "causal"),
    ("flash_attention", "one cu_seqlens", lambda d: kernels.flash_attention(T(4, 1, 16, device=d), T(4, 1, 16, device=d), T(4, 1, 16, device=d), cu_seqlens_q=torch.tensor([0, 4], device=d)), ValueError, "cu_seqlens_k"),
    ("flash_attention", "cu_seqlens past the tensor", lambda d: kernels.flash_attention(T(4, 1, 16, device=d), T(4, 1, 16, device=d), T(4, 1, 16, device=d), cu_seqlens_q=torch.tensor([0, 5], device=d), cu_seqlens_k=torch.tensor([0, 4], device=d)), ValueError, "cu_seqlens_q"),
    ("flash_attention", "cu_seqlens decreasing", lambda d: kernels.flash_attention(T(4, 1, 16, device=d), T(4, 1, 16, device=d), T(4, 1, 16, device=d), cu_seqlens_q=torch.tensor([0, 3, 2], device=d), cu_seqlens_k=torch.tensor([0, 2, 4], device=d)), ValueError, "cu_seqlens_q"),
    ("flash_attention", "cu_seqlens float", lambda d: kernels.flash_attention(T(4, 1, 16, device=d), T(4, 1, 16, device=d), T(4, 1, 16, device=d), cu_seqlens_q=torch.tensor([0.0, 4.0], device=d), cu_seqlens_k=torch.tensor([0, 4], device=d)), TypeError, "cu_seqlens_q"),
    ("flash_attention", "cu_seqlens batches differ", lambda d: kernels.flash_attention(T(4, 1, 16, device=d), T(4, 1, 16, device=d), T(4, 1, 16, device=d), cu_seqlens_q=torch.tensor([0, 4], device=d), cu_seqlens_k=torch.tensor([0, 2, 4], device=d)), ValueError, "cu_seqlens_k"),
    ("flash_attention", "lse_out shape", lambda d: kernels.flash_attention(T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, device=d), T(1, 2, 1, 16, device=d), return_lse=True, lse_out=torch.empty(1, 2, 1, device=d)), ValueError, "lse_out"),
    # flash_attention_backward (the forward's checks are shared: a few of them here)
    ("flash_attention_backward", "o not a tensor", lambda d: FAB(d, o=[[1.0]]), TypeError, "o"),
    ("flash_attention_backward", "o shape", lambda d: FAB(d, o=T(1, 3, 2, 8, device=d)), ValueError, "o"),
    ("flash_attention_backward", "o dtype", lambda d: FAB(d, o=T(1, 3, 2, 16, dtype=torch.float16, device=d)), TypeError, "o"),
    ("flash_attention_backward", "do shape", lambda d: FAB(d, do=T(1, 4, 2, 16, device=d)), ValueError, "do"),
    ("flash_attention_backward", "do dtype", lambda d: FAB(d, do=T(1, 3, 2, 16, dtype=torch.bfloat16, device=d)), TypeError, "do"),
    ("flash_attention_backward", "do rank", lambda d: FAB(d, do=T(3, 2, 16, device=d)), ValueError, "do"),
    ("flash_attention_backward", "do device", lambda d: FAB(d, do=torch.empty(1, 3, 2, 16, device="meta")), ValueError, "do"),
    ("flash_attention_backward", "lse fp16", lambda d: FAB(d, lse=T(1, 2, 3, dtype=torch.float16, device=d)), TypeError, "lse"),
    ("flash_attention_backward", "lse [B, Tq, Hq]", lambda d: FAB(d, lse=T(1, 3, 2, device=d)), ValueError, "lse"),
    ("flash_attention_backward", "lse of a varlen batch 3-d", lambda d: FAB(d, varlen=True, lse=T(1, 2, 5, device=d)), ValueError, "lse"),
    ("flash_attention_backward", "heads do not divide", lambda d: FAB(d, q=T(1, 3, 3, 16, device=d), o=T(1, 3, 3, 16, device=d), do=T(1, 3, 3, 16, device=d), k=T(1, 4, 2, 16, device=d), v=T(1, 4, 2, 16, device=d)), ValueError, "k"),
    ("flash_attention_backward", "causal not a bool", lambda d: FAB(d, causal="yes"), TypeError, "causal"),
    ("flash_attention_backward", "scale zero", lambda d: FAB(d, scale=0.0), ValueError, "scale"),
    ("flash_attention_backward", "one cu_seqlens", lambda d: FAB(d, varlen=True, cu_seqlens_k=None), ValueError, "cu_seqlens_k"),
    ("flash_attention_backward", "cu_seqlens past k", lambda d: FAB(d, varlen=True, cu_seqlens_k=torch.tensor([0, 4, 7], device=d)), ValueError, "cu_seqlens_k"),
    ("flash_attention_backward", "out not a tuple", lambda d: FAB(d, out=T(1, 3, 2, 16, device=d)), TypeError, "out"),
    ("flash_attention_backward", "out of two", lambda d: FAB(d, out=(T(1, 3, 2, 16, device=d), T(1, 4, 1, 16, device=d))), TypeError, "out"),
    ("flash_attention_backward", "out dk shape", lambda d: FAB(d, out=(T(1, 3, 2, 16, device=d), T(1, 3, 1, 16, device=d), T(1, 4, 1, 16, device=d))), ValueError, "out[1] (dk)"),
    ("flash_attention_backward", "out dv dtype", lambda d: FAB(d, out=(T(1, 3, 2, 16, device=d), T(1, 4, 1, 16, device=d), T(1, 4, 1, 16, dtype=torch.float16, device=d))), TypeError, "out[2] (dv)"),
    ("flash_attention_backward", "block_m not a power of two", lambda d: FAB(d, block_m=24), ValueError, "block_m"),
    # bias_gelu
    ("bias_gelu", "int input", lambda d: kernels.bias_gelu(torch.ones(2, 4, dtype=torch.int32, device=d)), TypeError, "y"),
    ("bias_gelu", "0-d input", lambda d: kernels.bias_gelu(torch.tensor(1.0, device=d)), ValueError, "y"),
    ("bias_gelu", "bias length", lambda d: kernels.bias_gelu(T(2, 4, device=d), T(5, device=d)), ValueError, "bias"),
    ("bias_gelu", "bias rank", lambda d: kernels.bias_gelu(T(2, 4, device=d), T(2, 4, device=d)), ValueError, "bias"),
    ("bias_gelu", "bias dtype", lambda d: kernels.bias_gelu(T(2, 4, device=d), T(4, dtype=torch.float16, device=d)), TypeError, "bias"),
    ("bias_gelu", "bias device", lambda d: kernels.bias_gelu(T(2, 4, device=d), torch.empty(4, device="meta")), ValueError, "bias"),
    ("bias_gelu", "unknown approximate", lambda d: kernels.bias_gelu(T(2, 4, device=d), None, "erf"), ValueError, "approximate"),
    ("bias_gelu", "approximate None", lambda d: kernels.bias_gelu(T(2, 4, device=d), None, None), ValueError, "approximate"),
    ("bias_gelu", "out dtype", lambda d: kernels.bias_gelu(T(2, 4, device=d), out=T(2, 4, dtype=torch.float16, device=d)), TypeError, "out"),
    ("bias_gelu", "out shape", lambda d: kernels.bias_gelu(T(2, 4, device=d), out=T(4, 2, device=d)), ValueError, "out"),
    # embedding
    ("embedding", "id past the table", lambda d: kernels.embedding(torch.tensor([0, 5], device=d), T(5, 8, device=d)), ValueError, "ids"),
    ("embedding", "negative id", lambda d: kernels.embedding(torch.tensor([[1, -1]], dtype=torch.int32, device=d), T(5, 8, device=d)), ValueError, "ids"),
    ("embedding", "float ids", lambda d: kernels.embedding(torch.tensor([0.0, 1.0], device=d), T(5, 8, device=d)), TypeError, "ids"),
    ("embedding", "int16 ids", lambda d: kernels.embedding(torch.tensor([0, 1], dtype=torch.int16, device=d), T(5, 8, device=d)), TypeError, "ids"),
    ("embedding", "ids into an empty table", lambda d: kernels.embedding(torch.tensor([0], device=d), T(0, 8, device=d)), ValueError, "ids"),
    ("embedding", "1-d table", lambda d: kernels.embedding(torch.tensor([0], device=d), T(8, device=d)), ValueError, "table"),
    ("embedding", "int table", lambda d: kernels.embedding(torch.tensor([0], device=d), torch.ones(4, 8, dtype=torch.int32, device=d)), TypeError, "table"),
    ("embedding", "float64 table", lambda d: kernels.embedding(torch.tensor([0], device=d), T(4, 8, dtype=torch.float64, device=d)), TypeError, "table"),
    ("embedding", "ids device", lambda d: kernels.embedding(torch.zeros(2, dtype=torch.int64, device="meta"), T(4, 8, device=d)), ValueError, "ids"),
    ("embedding", "out dtype", lambda d: kernels.embedding(torch.tensor([0], device=d), T(4, 8, device=d), out=T(1, 8, dtype=torch.float16, device=d)), TypeError, "out"),
    ("embedding", "validate an int", lambda d: kernels.embedding(torch.tensor([0], device=d), T(4, 8, device=d), validate=0), TypeError, "validate"),
    ("embedding", "validate an empty string", lambda d: kernels.embedding(torch.tensor([0], device=d), T(4, 8, device=d), validate=""), ValueError, "validate"),
    ("embedding", "out shape", lambda d: kernels.embedding(torch.tensor([0, 1], device=d), T(4, 8, device=d), out=T(2, 4, device=d)), ValueError, "out"),
    # decode_attention
    ("decode_attention", "q rank", lambda d: kernels.decode_attention(T(2, 1, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1, 2], device=d)), ValueError, "q"),
    ("decode_attention", "heads do not divide", lambda d: kernels.decode_attention(T(2, 3, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1, 2], device=d)), ValueError, "k_cache"),
    ("decode_attention", "seqlens past the cache", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1, 9], device=d)), ValueError, "seqlens"),
    ("decode_attention", "negative seqlens", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([-1, 2], device=d)), ValueError, "seqlens"),
    ("decode_attention", "seqlens float", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1.0, 2.0], device=d)), TypeError, "seqlens"),
    ("decode_attention", "seqlens count", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1], device=d)), ValueError, "seqlens"),
    ("decode_attention", "cache batch", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(3, 8, 2, 16, device=d), T(3, 8, 2, 16, device=d), torch.tensor([1, 2], device=d)), ValueError, "k_cache"),
    ("decode_attention", "v_cache shape", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 7, 2, 16, device=d), torch.tensor([1, 2], device=d)), ValueError, "v_cache"),
    ("decode_attention", "block table out of range", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(4, 4, 2, 16, device=d), T(4, 4, 2, 16, device=d), torch.tensor([3, 8], device=d), block_table=torch.tensor([[0, 1], [2, 4]], device=d)), ValueError, "block_table"),
    ("decode_attention", "block table rows", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(4, 4, 2, 16, device=d), T(4, 4, 2, 16, device=d), torch.tensor([3, 8], device=d), block_table=torch.tensor([[0, 1]], device=d)), ValueError, "block_table"),
    ("decode_attention", "validate an int", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1, 2], device=d), validate=1), TypeError, "validate"),
    ("decode_attention", "validate an unknown mode", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1, 2], device=d), validate="later"), ValueError, "validate"),
    ("decode_attention", "num_splits zero", lambda d: kernels.decode_attention(T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d), T(2, 8, 2, 16, device=d), torch.tensor([1, 2], device=d), num_splits=0), ValueError, "num_splits"),
    # mla_decode
    ("mla_decode", "q_nope rank", lambda d: MLA(d, q_nope=T(2, 2, 8, device=d)), ValueError, "q_nope"),
    ("mla_decode", "q_nope int", lambda d: MLA(d, q_nope=torch.ones(2, 1, 2, 8, dtype=torch.int32, device=d)), TypeError, "q_nope"),
    ("mla_decode", "float64 inputs", lambda d: MLA(d, q_nope=T(2, 1, 2, 8, dtype=torch.float64, device=d)), TypeError, "q_nope"),
    ("mla_decode", "dtypes differ", lambda d: MLA(d, c_kv=T(2, 6, 8, dtype=torch.float16, device=d)), TypeError, "c_kv"),
    ("mla_decode", "q_pe heads differ", lambda d: MLA(d, q_pe=T(2, 1, 3, 4, device=d)), ValueError, "q_pe"),
    ("mla_decode", "q_pe batch differs", lambda d: MLA(d, q_pe=T(1, 1, 2, 4, device=d)), ValueError, "q_pe"),
    ("mla_decode", "q_pe tokens differ", lambda d: MLA(d, q_pe=T(2, 2, 2, 4, device=d)), ValueError, "q_pe"),
    ("mla_decode", "Tq 5", lambda d: MLA(d, q_nope=T(2, 5, 2, 8, device=d), q_pe=T(2, 5, 2, 4, device=d)), ValueError, "q_nope"),
    ("mla_decode", "Tq 0", lambda d: MLA(d, q_nope=T(2, 0, 2, 8, device=d), q_pe=T(2, 0, 2, 4, device=d)), ValueError, "q_nope"),
    ("mla_decode", "c_kv rank", lambda d: MLA(d, c_kv=T(2, 6, 1, 8, device=d)), ValueError, "c_kv"),
    ("mla_decode", "c_kv width", lambda d: MLA(d, c_kv=T(2, 6, 9, device=d)), ValueError, "c_kv"),
    ("mla_decode", "k_pe width", lambda d: MLA(d, k_pe=T(2, 6, 5, device=d)), ValueError, "k_pe"),
    ("mla_decode", "k_pe positions differ", lambda d: MLA(d, k_pe=T(2, 7, 4, device=d)), ValueError, "k_pe"),
    ("mla_decode", "k_pe pages differ", lambda d: MLA(d, paged=True, k_pe=T(5, 4, 4, device=d)), ValueError, "k_pe"),
    ("mla_decode", "cache batch", lambda d: MLA(d, c_kv=T(3, 6, 8, device=d), k_pe=T(3, 6, 4, device=d)), ValueError, "c_kv"),
    ("mla_decode", "lens past the cache", lambda d: MLA(d, lens=torch.tensor([7, 1], device=d)), ValueError, "lens"),
    ("mla_decode", "lens past the table", lambda d: MLA(d, paged=True, lens=torch.tensor([9, 3], device=d)), ValueError, "lens"),
    ("mla_decode", "negative lens", lambda d: MLA(d, lens=torch.tensor([-1, 2], device=d)), ValueError, "lens"),
    # int64 lens are read as int64: 2^32 + 3 must not pass as 3 (mutant 6a87c6dfc1, results/mutation/runs/mla-past-2-31)
    ("mla_decode", "lens past int32", lambda d: MLA(d, lens=torch.tensor([2**32 + 3, 2], device=d)), ValueError, "lens"),
    ("mla_decode", "lens count", lambda d: MLA(d, lens=torch.tensor([1], device=d)), ValueError, "lens"),
    ("mla_decode", "lens 2-d", lambda d: MLA(d, lens=torch.tensor([[1, 2]], device=d)), ValueError, "lens"),
    ("mla_decode", "lens float", lambda d: MLA(d, lens=torch.tensor([1.0, 2.0], device=d)), TypeError, "lens"),
    ("mla_decode", "lens device", lambda d: MLA(d, lens=torch.zeros(2, dtype=torch.int64, device="meta")), ValueError, "lens"),
    ("mla_decode", "page table entry past the pool", lambda d: MLA(d, paged=True, page_table=torch.tensor([[0, 1], [2, 4]], device=d), lens=torch.tensor([3, 5], device=d)), ValueError, "page_table"),
    ("mla_decode", "page table -1 in use", lambda d: MLA(d, paged=True, lens=torch.tensor([3, 5], device=d)), ValueError, "page_table"),
    ("mla_decode", "page table rows", lambda d: MLA(d, paged=True, page_table=torch.tensor([[0, 1]], device=d)), ValueError, "page_table"),
    ("mla_decode", "page table float", lambda d: MLA(d, paged=True, page_table=torch.tensor([[0.0, 1.0], [2.0, 3.0]], device=d)), TypeError, "page_table"),
    ("mla_decode", "page_size not the pools'", lambda d: MLA(d, paged=True, page_size=16), ValueError, "page_size"),
    ("mla_decode", "page_size a float", lambda d: MLA(d, paged=True, page_size=4.0), TypeError, "page_size"),
    ("mla_decode", "page_size without a table", lambda d: MLA(d, page_size=6), ValueError, "page_size"),
    ("mla_decode", "softmax_scale zero", lambda d: MLA(d, softmax_scale=0.0), ValueError, "softmax_scale"),
    ("mla_decode", "softmax_scale negative", lambda d: MLA(d, softmax_scale=-0.1), ValueError, "softmax_scale"),
    ("mla_decode", "softmax_scale NaN", lambda d: MLA(d, softmax_scale=math.nan), ValueError, "softmax_scale"),
    ("mla_decode", "softmax_scale inf", lambda d: MLA(d, softmax_scale=math.inf), ValueError, "softmax_scale"),
    ("mla_decode", "softmax_scale past fp32", lambda d: MLA(d, softmax_scale=1e39), ValueError, "softmax_scale"),
    ("mla_decode", "softmax_scale None", lambda d: MLA(d, softmax_scale=None), TypeError, "softmax_scale"),
    ("mla_decode", "num_splits zero", lambda d: MLA(d, num_splits=0), ValueError, "num_splits"),
    ("mla_decode", "block_h not a power of two", lambda d: MLA(d, block_h=24), ValueError, "block_h"),
    ("mla_decode", "block_n below 16", lambda d: MLA(d, block_n=8), ValueError, "block_n"),
    ("mla_decode", "validate not a bool", lambda d: MLA(d, validate=0), TypeError, "validate"),
    ("mla_decode", "validate an unknown mode", lambda d: MLA(d, validate="Deferred"), ValueError, "validate"),
    ("mla_decode", "validate None", lambda d: MLA(d, validate=None), TypeError, "validate"),
    ("mla_decode", "out shape", lambda d: MLA(d, out=T(2, 1, 2, 4, device=d)), ValueError, "out"),
    ("mla_decode", "out dtype", lambda d: MLA(d, out=T(2, 1, 2, 8, dtype=torch.float16, device=d)), TypeError, "out"),
    ("mla_decode", "lse_out shape", lambda d: MLA(d, lse_out=torch.empty(2, 2, 1, device=d)), ValueError, "lse_out"),
    ("mla_decode", "lse_out fp16", lambda d: MLA(d, lse_out=torch.empty(2, 1, 2, dtype=torch.float16, device=d)), TypeError, "lse_out"),
    # gated_delta_rule (prefill) and gated_delta_rule_decode
    ("gated_delta_rule", "q int", lambda d: GDN(d, q=torch.ones(1, 4, 1, 8, dtype=torch.int32, device=d)), TypeError, "q"),
    ("gated_delta_rule", "float64 inputs", lambda d: GDN(d, dtype=torch.float64), TypeError, "q"),
    ("gated_delta_rule", "q not a tensor", lambda d: GDN(d, q=[[1.0]]), TypeError, "q"),
    ("gated_delta_rule", "q 3-d", lambda d: GDN(d, q=T(4, 1, 8, device=d)), ValueError, "q"),
    ("gated_delta_rule", "dtypes differ", lambda d: GDN(d, k=T(1, 4, 1, 8, dtype=torch.float16, device=d)), TypeError, "k"),
    ("gated_delta_rule", "g float64", lambda d: GDN(d, g=T(1, 4, 2, dtype=torch.float64, device=d)), TypeError, "g"),
    ("gated_delta_rule", "beta bf16 with fp16 inputs", lambda d: GDN(d, dtype=torch.float16, beta=T(1, 4, 2, dtype=torch.bfloat16, device=d)), TypeError, "beta"),
    ("gated_delta_rule", "Hv not a multiple of Hk", lambda d: GDN(d, Hk=2, Hv=3), ValueError, "v"),
    ("gated_delta_rule", "k not shaped like q", lambda d: GDN(d, k=T(1, 4, 1, 9, device=d)), ValueError, "k"),
    ("gated_delta_rule", "k of other heads", lambda d: GDN(d, k=T(1, 4, 2, 8, device=d)), ValueError, "k"),
    ("gated_delta_rule", "v of another T", lambda d: GDN(d, v=T(1, 5, 2, 4, device=d)), ValueError, "v"),
    ("gated_delta_rule", "v of another B", lambda d: GDN(d, v=T(2, 4, 2, 4, device=d)), ValueError, "v"),
    ("gated_delta_rule", "g of another T", lambda d: GDN(d, g=-T(1, 5, 2, device=d).abs()), ValueError, "g"),
    ("gated_delta_rule", "g of another B", lambda d: GDN(d, g=-T(2, 4, 2, device=d).abs()), ValueError, "g"),
    ("gated_delta_rule", "g per K head", lambda d: GDN(d, g=-T(1, 4, 1, device=d).abs()), ValueError, "g"),
    ("gated_delta_rule", "beta of another T", lambda d: GDN(d, beta=T(1, 3, 2, device=d)), ValueError, "beta"),
    ("gated_delta_rule", "beta 2-d", lambda d: GDN(d, beta=T(4, 2, device=d)), ValueError, "beta"),
    ("gated_delta_rule", "Dk past 256", lambda d: GDN(d, Dk=300), ValueError, "q"),
    ("gated_delta_rule", "g device", lambda d: GDN(d, g=torch.zeros(1, 4, 2, device="meta")), ValueError, "g"),
    ("gated_delta_rule", "cu_seqlens with B 2", lambda d: GDN(d, B=2, cu_seqlens=torch.tensor([0, 4], device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens decreasing", lambda d: GDN(d, cu_seqlens=torch.tensor([0, 3, 2, 4], device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens short of T", lambda d: GDN(d, cu_seqlens=torch.tensor([0, 3], device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens past T", lambda d: GDN(d, cu_seqlens=torch.tensor([0, 5], device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens not from 0", lambda d: GDN(d, cu_seqlens=torch.tensor([1, 4], device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens empty", lambda d: GDN(d, cu_seqlens=torch.zeros(0, dtype=torch.int64, device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens float", lambda d: GDN(d, cu_seqlens=torch.tensor([0.0, 4.0], device=d)), TypeError, "cu_seqlens"),
    ("gated_delta_rule", "cu_seqlens 2-d", lambda d: GDN(d, cu_seqlens=torch.tensor([[0, 4]], device=d)), ValueError, "cu_seqlens"),
    ("gated_delta_rule", "initial_state fp16", lambda d: GDN(d, initial_state=T(1, 2, 8, 4, dtype=torch.float16, device=d)), TypeError, "initial_state"),
    ("gated_delta_rule", "initial_state bf16", lambda d: GDN(d, dtype=torch.bfloat16, initial_state=T(1, 2, 8, 4, dtype=torch.bfloat16, device=d)), TypeError, "initial_state"),
    ("gated_delta_rule", "initial_state shape", lambda d: GDN(d, initial_state=T(1, 2, 4, 8, device=d)), ValueError, "initial_state"),
    ("gated_delta_rule", "initial_state per batch row with cu_seqlens", lambda d: GDN(d, cu_seqlens=torch.tensor([0, 2, 4], device=d), initial_state=T(1, 2, 8, 4, device=d)), ValueError, "initial_state"),
    ("gated_delta_rule", "scale zero", lambda d: GDN(d, scale=0.0), ValueError, "scale"),
    ("gated_delta_rule", "scale negative", lambda d: GDN(d, scale=-0.5), ValueError, "scale"),
    ("gated_delta_rule", "scale NaN", lambda d: GDN(d, scale=math.nan), ValueError, "scale"),
    ("gated_delta_rule", "scale inf", lambda d: GDN(d, scale=math.inf), ValueError, "scale"),
    ("gated_delta_rule", "scale a string", lambda d: GDN(d, scale="0.5"), TypeError, "scale"),
    ("gated_delta_rule", "output_final_state not a bool", lambda d: GDN(d, output_final_state=1), TypeError, "output_final_state"),
    ("gated_delta_rule", "use_qk_l2norm not a bool", lambda d: GDN(d, use_qk_l2norm="yes"), TypeError, "use_qk_l2norm"),
    ("gated_delta_rule", "chunk_size 48", lambda d: GDN(d, chunk_size=48), ValueError, "chunk_size"),
    ("gated_delta_rule", "chunk_size 8", lambda d: GDN(d, chunk_size=8), ValueError, "chunk_size"),
    ("gated_delta_rule", "block_v 24", lambda d: GDN(d, block_v=24), ValueError, "block_v"),
    ("gated_delta_rule", "out shape", lambda d: GDN(d, out=T(1, 4, 2, 5, device=d)), ValueError, "out"),
    ("gated_delta_rule", "out dtype", lambda d: GDN(d, out=T(1, 4, 2, 4, dtype=torch.float16, device=d)), TypeError, "out"),
    ("gated_delta_rule", "out strided", lambda d: GDN(d, out=T(1, 4, 4, 2, device=d).transpose(2, 3)), ValueError, "out"),
    ("gated_delta_rule", "final_state_out dtype", lambda d: GDN(d, output_final_state=True, final_state_out=T(1, 2, 8, 4, dtype=torch.float16, device=d)), TypeError, "final_state_out"),
    ("gated_delta_rule", "final_state_out shape", lambda d: GDN(d, output_final_state=True, final_state_out=T(2, 2, 8, 4, device=d)), ValueError, "final_state_out"),
    ("gated_delta_rule", "final_state_out without output_final_state", lambda d: GDN(d, final_state_out=T(1, 2, 8, 4, device=d)), ValueError, "final_state_out"),
    ("gated_delta_rule", "decode q 4-d", lambda d: GDN1(d, q=T(2, 1, 1, 8, device=d)), ValueError, "q"),
    ("gated_delta_rule", "decode dtypes differ", lambda d: GDN1(d, v=T(2, 2, 4, dtype=torch.bfloat16, device=d)), TypeError, "v"),
    ("gated_delta_rule", "decode k not shaped like q", lambda d: GDN1(d, k=T(2, 1, 7, device=d)), ValueError, "k"),
    ("gated_delta_rule", "decode Hv not a multiple of Hk", lambda d: GDN1(d, Hk=2, Hv=3), ValueError, "v"),
    ("gated_delta_rule", "decode v of another batch", lambda d: GDN1(d, v=T(3, 2, 4, device=d)), ValueError, "v"),
    ("gated_delta_rule", "decode g shape", lambda d: GDN1(d, g=T(2, 1, device=d)), ValueError, "g"),
    ("gated_delta_rule", "decode beta dtype", lambda d: GDN1(d, beta=T(2, 2, dtype=torch.float16, device=d)), TypeError, "beta"),
    ("gated_delta_rule", "decode state fp16", lambda d: GDN1(d, state=T(2, 2, 8, 4, dtype=torch.float16, device=d)), TypeError, "state"),
    ("gated_delta_rule", "decode state shape", lambda d: GDN1(d, state=T(2, 2, 4, 8, device=d)), ValueError, "state"),
    ("gated_delta_rule", "decode state broadcast", lambda d: GDN1(d, state=T(1, 2, 8, 4, device=d).expand(2, 2, 8, 4)), ValueError, "state"),
    ("gated_delta_rule", "decode state missing", lambda d: GDN1(d, state=None), TypeError, "state"),
    ("gated_delta_rule", "decode scale NaN", lambda d: GDN1(d, scale=math.nan), ValueError, "scale"),
    ("gated_delta_rule", "decode use_qk_l2norm not a bool", lambda d: GDN1(d, use_qk_l2norm=0), TypeError, "use_qk_l2norm"),
    ("gated_delta_rule", "decode out shape", lambda d: GDN1(d, out=T(2, 2, 5, device=d)), ValueError, "out"),
    # adamw: p, g, m, v and the hyperparameters
    ("adamw", "g shape", lambda d: kernels.adamw(T(8, device=d), T(9, device=d), T(8, device=d), T(8, device=d), 1), ValueError, "g"),
    ("adamw", "g dtype", lambda d: kernels.adamw(T(8, device=d), T(8, dtype=torch.bfloat16, device=d), T(8, device=d), T(8, device=d), 1), TypeError, "g"),
    ("adamw", "p float16", lambda d: kernels.adamw(T(8, dtype=torch.float16, device=d), T(8, dtype=torch.float16, device=d), T(8, device=d), T(8, device=d), 1), TypeError, "p"),
    ("adamw", "m bf16", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, dtype=torch.bfloat16, device=d), T(8, device=d), 1), TypeError, "m"),
    ("adamw", "v shape", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(4, 2, device=d), 1), ValueError, "v"),
    ("adamw", "p strided", lambda d: kernels.adamw(T(4, 4, device=d).t(), T(4, 4, device=d), T(4, 4, device=d), T(4, 4, device=d), 1), ValueError, "p"),
    ("adamw", "step 0", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(8, device=d), 0), ValueError, "step"),
    ("adamw", "negative lr", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(8, device=d), 1, lr=-1e-3), ValueError, "lr"),
    ("adamw", "beta1 = 1", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(8, device=d), 1, beta1=1.0), ValueError, "beta1"),
    ("adamw", "beta2 negative", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(8, device=d), 1, beta2=-0.1), ValueError, "beta2"),
    ("adamw", "eps NaN", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(8, device=d), 1, eps=math.nan), ValueError, "eps"),
    ("adamw", "negative weight_decay", lambda d: kernels.adamw(T(8, device=d), T(8, device=d), T(8, device=d), T(8, device=d), 1, weight_decay=-0.1), ValueError, "weight_decay"),
    ("adamw", "optimizer beta2", lambda d: kernels.AdamW([torch.nn.Parameter(T(8, device=d))], betas=(0.9, 1.5)), ValueError, "beta2"),
    # matmul
    ("matmul", "int input", lambda d: kernels.matmul(torch.ones(2, 4, dtype=torch.int32, device=d), T(3, 4, device=d)), TypeError, "a"),
    ("matmul", "float64 input", lambda d: kernels.matmul(T(2, 4, dtype=torch.float64, device=d), T(3, 4, device=d)), TypeError, "a"),
    ("matmul", "not a tensor", lambda d: kernels.matmul([[1.0, 2.0]], T(3, 2, device=d)), TypeError, "a"),
    ("matmul", "0-d input", lambda d: kernels.matmul(torch.tensor(1.0, device=d), T(3, 1, device=d)), ValueError, "a"),
    ("matmul", "inner dims differ", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 5, device=d)), ValueError, "w"),
    ("matmul", "weight transposed shape", lambda d: kernels.matmul(T(2, 4, device=d), T(4, 3, device=d)), ValueError, "w"),
    ("matmul", "weight rank", lambda d: kernels.matmul(T(2, 4, device=d), T(4, device=d)), ValueError, "w"),
    ("matmul", "weight dtype", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, dtype=torch.float16, device=d)), TypeError, "w"),
    ("matmul", "weight int", lambda d: kernels.matmul(T(2, 4, device=d), torch.ones(3, 4, dtype=torch.int64, device=d)), TypeError, "w"),
    ("matmul", "weight device", lambda d: kernels.matmul(T(2, 4, device=d), torch.empty(3, 4, device="meta")), ValueError, "w"),
    ("matmul", "bias length", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), T(4, device=d)), ValueError, "bias"),
    ("matmul", "bias rank", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), T(1, 3, device=d)), ValueError, "bias"),
    ("matmul", "bias dtype", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), T(3, dtype=torch.bfloat16, device=d)), TypeError, "bias"),
    ("matmul", "unknown activation", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), activation="swish"), ValueError, "activation"),
    ("matmul", "activation not a str", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), activation=None), TypeError, "activation"),
    ("matmul", "out shape", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), out=T(2, 4, device=d)), ValueError, "out"),
    ("matmul", "out dtype", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), out=T(2, 3, dtype=torch.float16, device=d)), TypeError, "out"),
    ("matmul", "out strided", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), out=T(3, 2, device=d).t()), ValueError, "out"),
    ("matmul", "block_m not a power of two", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), block_m=24), ValueError, "block_m"),
    ("matmul", "block_k below 16", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), block_k=8), ValueError, "block_k"),
    ("matmul", "group_m zero", lambda d: kernels.matmul(T(2, 4, device=d), T(3, 4, device=d), group_m=0), ValueError, "group_m"),
    # swiglu
    ("swiglu", "int input", lambda d: kernels.swiglu(torch.ones(2, 4, dtype=torch.int32, device=d), T(3, 4, device=d), T(3, 4, device=d)), TypeError, "x"),
    ("swiglu", "gate inner dims differ", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 5, device=d), T(3, 4, device=d)), ValueError, "w_gate"),
    ("swiglu", "up shape differs", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(5, 4, device=d)), ValueError, "w_up"),
    ("swiglu", "up inner dims differ", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(3, 6, device=d)), ValueError, "w_up"),
    ("swiglu", "up dtype", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(3, 4, dtype=torch.float16, device=d)), TypeError, "w_up"),
    ("swiglu", "gate bias length", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(3, 4, device=d), T(4, device=d)), ValueError, "b_gate"),
    ("swiglu", "up bias dtype", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(3, 4, device=d), None, T(3, dtype=torch.float16, device=d)), TypeError, "b_up"),
    ("swiglu", "relu is not gated", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(3, 4, device=d), activation="relu"), ValueError, "activation"),
    ("swiglu", "out shape", lambda d: kernels.swiglu(T(2, 4, device=d), T(3, 4, device=d), T(3, 4, device=d), out=T(2, 4, device=d)), ValueError, "out"),
    # quantize_fp8
    ("quantize_fp8", "int input", lambda d: kernels.quantize_fp8(torch.ones(2, 4, dtype=torch.int32, device=d)), TypeError, "x"),
    ("quantize_fp8", "float64 input", lambda d: kernels.quantize_fp8(T(2, 4, dtype=torch.float64, device=d)), TypeError, "x"),
    ("quantize_fp8", "fp8 input", lambda d: kernels.quantize_fp8(F8(2, 4, device=d)), TypeError, "x"),
    ("quantize_fp8", "0-d input", lambda d: kernels.quantize_fp8(torch.tensor(1.0, device=d)), ValueError, "x"),
    ("quantize_fp8", "dtype not fp8", lambda d: kernels.quantize_fp8(T(2, 4, device=d), torch.float16), TypeError, "dtype"),
    ("quantize_fp8", "dtype a string", lambda d: kernels.quantize_fp8(T(2, 4, device=d), "e4m3fn"), TypeError, "dtype"),
    ("quantize_fp8", "unknown granularity", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, "channel"), ValueError, "granularity"),
    ("quantize_fp8", "granularity None", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, None), TypeError, "granularity"),
    ("quantize_fp8", "static scale fp16", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, scale=S(device=d, dtype=torch.float16)), TypeError, "scale"),
    ("quantize_fp8", "static scale shape", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, "row", scale=S(device=d)), ValueError, "scale"),
    ("quantize_fp8", "static scale and scale_out", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, scale=S(device=d), scale_out=S(device=d)), ValueError, "scale_out"),
    ("quantize_fp8", "out of the other format", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, out=F8(2, 4, dtype=E5, device=d)), TypeError, "out"),
    ("quantize_fp8", "out shape", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, out=F8(4, 2, device=d)), ValueError, "out"),
    ("quantize_fp8", "scale_out shape", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, "row", scale_out=S(2, device=d)), ValueError, "scale_out"),
    ("quantize_fp8", "scale_out dtype", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, scale_out=S(device=d, dtype=torch.float16)), TypeError, "scale_out"),
    ("quantize_fp8", "block_cols not a power of two", lambda d: kernels.quantize_fp8(T(2, 4, device=d), E4, block_cols=24), ValueError, "block_cols"),
    # quantize_mxfp4 / dequantize_mxfp4
    ("quantize_mxfp4", "int input", lambda d: kernels.quantize_mxfp4(torch.ones(2, 32, dtype=torch.int32, device=d)), TypeError, "x"),
    ("quantize_mxfp4", "float64 input", lambda d: kernels.quantize_mxfp4(T(2, 32, dtype=torch.float64, device=d)), TypeError, "x"),
    ("quantize_mxfp4", "0-d input", lambda d: kernels.quantize_mxfp4(torch.tensor(1.0, device=d)), ValueError, "x"),
    ("quantize_mxfp4", "K not a multiple of 32", lambda d: kernels.quantize_mxfp4(T(2, 48, device=d)), ValueError, "x"),
    ("quantize_mxfp4", "out shape", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), out=U8(2, 64, device=d)), ValueError, "out"),
    ("quantize_mxfp4", "out dtype", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), out=torch.zeros(2, 32, dtype=torch.int8, device=d)), TypeError, "out"),
    ("quantize_mxfp4", "scales_out shape", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), scales_out=U8(2, 1, device=d)), ValueError, "scales_out"),
    ("quantize_mxfp4", "scales_out dtype", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), scales_out=T(2, 2, device=d)), TypeError, "scales_out"),
    ("quantize_mxfp4", "out device", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), out=torch.zeros(2, 32, dtype=torch.uint8, device="meta")), ValueError, "out"),
    ("quantize_mxfp4", "block_k below 32", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), block_k=16), ValueError, "block_k"),
    ("quantize_mxfp4", "block_m not a power of two", lambda d: kernels.quantize_mxfp4(T(2, 64, device=d), block_m=3), ValueError, "block_m"),
    ("dequantize_mxfp4", "codes not uint8", lambda d: kernels.dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.int8, device=d), U8(2, 1, device=d)), TypeError, "codes"),
    ("dequantize_mxfp4", "codes float", lambda d: kernels.dequantize_mxfp4(T(2, 16, device=d), U8(2, 1, device=d)), TypeError, "codes"),
    ("dequantize_mxfp4", "scales not uint8", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), T(2, 1, device=d)), TypeError, "scales"),
    ("dequantize_mxfp4", "codes width not K / 2", lambda d: kernels.dequantize_mxfp4(U8(2, 24, device=d), U8(2, 1, device=d)), ValueError, "codes"),
    ("dequantize_mxfp4", "scales shape", lambda d: kernels.dequantize_mxfp4(U8(2, 32, device=d), U8(2, 1, device=d)), ValueError, "scales"),
    ("dequantize_mxfp4", "scales of other rows", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), U8(3, 1, device=d)), ValueError, "scales"),
    ("dequantize_mxfp4", "dtype float64", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), U8(2, 1, device=d), torch.float64), TypeError, "dtype"),
    ("dequantize_mxfp4", "dtype a string", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), U8(2, 1, device=d), "bfloat16"), TypeError, "dtype"),
    ("dequantize_mxfp4", "scales device", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), torch.zeros(2, 1, dtype=torch.uint8, device="meta")), ValueError, "scales"),
    ("dequantize_mxfp4", "out dtype", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), U8(2, 1, device=d), torch.float32, out=T(2, 32, dtype=torch.float16, device=d)), TypeError, "out"),
    ("dequantize_mxfp4", "out shape", lambda d: kernels.dequantize_mxfp4(U8(2, 16, device=d), U8(2, 1, device=d), out=T(2, 16, dtype=torch.bfloat16, device=d)), ValueError, "out"),
    # fp8_matmul
    ("fp8_matmul", "a8 not fp8", lambda d: kernels.fp8_matmul(T(2, 4, dtype=torch.float16, device=d), F8(3, 4, device=d), S(device=d), S(device=d)), TypeError, "a8"),
    ("fp8_matmul", "b8 not fp8", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), T(3, 4, dtype=torch.bfloat16, device=d), S(device=d), S(device=d)), TypeError, "b8"),
    ("fp8_matmul", "mixed fp8 formats", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, dtype=E5, device=d), S(device=d), S(device=d)), TypeError, "b8"),
    ("fp8_matmul", "a8 1-d", lambda d: kernels.fp8_matmul(F8(4, device=d), F8(3, 4, device=d), S(device=d), S(device=d)), ValueError, "a8"),
    ("fp8_matmul", "b8 3-d", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(1, 3, 4, device=d), S(device=d), S(device=d)), ValueError, "b8"),
    ("fp8_matmul", "inner dims differ", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 5, device=d), S(device=d), S(device=d)), ValueError, "b8"),
    ("fp8_matmul", "weight given as [K, N]", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(4, 3, device=d), S(device=d), S(device=d)), ValueError, "b8"),
    ("fp8_matmul", "scale_a fp16", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d, dtype=torch.float16), S(device=d)), TypeError, "scale_a"),
    ("fp8_matmul", "scale_a a float", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), 1.0, S(device=d)), TypeError, "scale_a"),
    ("fp8_matmul", "scale_a length", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(3, device=d), S(device=d)), ValueError, "scale_a"),
    ("fp8_matmul", "scale_a as a row", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(1, 2, device=d), S(device=d)), ValueError, "scale_a"),
    ("fp8_matmul", "scale_b per row of a", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(2, device=d)), ValueError, "scale_b"),
    ("fp8_matmul", "scale_b shape", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(3, 2, device=d)), ValueError, "scale_b"),
    ("fp8_matmul", "scale_b device", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), torch.ones((), device="meta")), ValueError, "scale_b"),
    ("fp8_matmul", "fast_accum not a bool", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), fast_accum=1), TypeError, "fast_accum"),
    ("fp8_matmul", "bias length", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), T(4, device=d)), ValueError, "bias"),
    ("fp8_matmul", "bias int", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), torch.ones(3, dtype=torch.int32, device=d)), TypeError, "bias"),
    ("fp8_matmul", "out_dtype fp8", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), out_dtype=E4), TypeError, "out_dtype"),
    ("fp8_matmul", "out_dtype a string", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), out_dtype="bfloat16"), TypeError, "out_dtype"),
    ("fp8_matmul", "out shape", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), out=T(3, 2, dtype=torch.bfloat16, device=d)), ValueError, "out"),
    ("fp8_matmul", "out dtype", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), out=T(2, 3, device=d)), TypeError, "out"),
    ("fp8_matmul", "block_k below 32", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), block_k=16), ValueError, "block_k"),
    ("fp8_matmul", "block_n not a power of two", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), block_n=48), ValueError, "block_n"),
    ("fp8_matmul", "group_m zero", lambda d: kernels.fp8_matmul(F8(2, 4, device=d), F8(3, 4, device=d), S(device=d), S(device=d), group_m=0), ValueError, "group_m"),
    # moe_route and moe_permute
    ("moe_route", "logits int", lambda d: ROUTE(d, logits=torch.ones(4, 8, dtype=torch.int32, device=d)), TypeError, "logits"),
    ("moe_route", "logits float64", lambda d: ROUTE(d, dtype=torch.float64), TypeError, "logits"),
    ("moe_route", "logits 3-d", lambda d: ROUTE(d, logits=T(2, 4, 8, device=d)), ValueError, "logits"),
    ("moe_route", "logits 1-d", lambda d: ROUTE(d, logits=T(8, device=d)), ValueError, "logits"),
    ("moe_route", "no experts", lambda d: ROUTE(d, E=0, top_k=1), ValueError, "logits"),
    ("moe_route", "too many experts", lambda d: ROUTE(d, E=1025, top_k=1), ValueError, "logits"),
    ("moe_route", "logits not a tensor", lambda d: ROUTE(d, logits=[[1.0, 2.0]]), TypeError, "logits"),
    ("moe_route", "top_k zero", lambda d: ROUTE(d, top_k=0), ValueError, "top_k"),
    ("moe_route", "top_k past E", lambda d: ROUTE(d, top_k=9), ValueError, "top_k"),
    ("moe_route", "top_k float", lambda d: ROUTE(d, top_k=2.0), TypeError, "top_k"),
    ("moe_route", "top_k bool", lambda d: ROUTE(d, top_k=True), TypeError, "top_k"),
    ("moe_route", "unknown scoring", lambda d: ROUTE(d, scoring="softplus"), ValueError, "scoring"),
    ("moe_route", "bias length", lambda d: ROUTE(d, bias=T(7, device=d)), ValueError, "bias"),
    ("moe_route", "bias 2-d", lambda d: ROUTE(d, bias=T(1, 8, device=d)), ValueError, "bias"),
    ("moe_route", "bias int", lambda d: ROUTE(d, bias=torch.zeros(8, dtype=torch.int32, device=d)), TypeError, "bias"),
    ("moe_route", "bias float64", lambda d: ROUTE(d, bias=T(8, dtype=torch.float64, device=d)), TypeError, "bias"),
    ("moe_route", "bias device", lambda d: ROUTE(d, bias=torch.zeros(8, device="meta")), ValueError, "bias"),
    ("moe_route", "renormalize not a bool", lambda d: ROUTE(d, renormalize=1), TypeError, "renormalize"),
    ("moe_route", "scaling zero", lambda d: ROUTE(d, routed_scaling_factor=0.0), ValueError, "routed_scaling_factor"),
    ("moe_route", "scaling NaN", lambda d: ROUTE(d, routed_scaling_factor=math.nan), ValueError, "routed_scaling_factor"),
    ("moe_route", "scaling past fp32", lambda d: ROUTE(d, routed_scaling_factor=1e39), ValueError, "routed_scaling_factor"),
    ("moe_route", "out_ids int64", lambda d: ROUTE(d, out_ids=torch.zeros(4, 2, dtype=torch.int64, device=d)), TypeError, "out_ids"),
    ("moe_route", "out_ids shape", lambda d: ROUTE(d, out_ids=torch.zeros(4, 3, dtype=torch.int32, device=d)), ValueError, "out_ids"),
    ("moe_route", "out_weights fp16", lambda d: ROUTE(d, out_weights=T(4, 2, dtype=torch.float16, device=d)), TypeError, "out_weights"),
    ("moe_route", "out_weights strided", lambda d: ROUTE(d, out_weights=T(2, 4, device=d).t()), ValueError, "out_weights"),
    ("moe_route", "permute ids float", lambda d: PERM(d, topk_ids=T(4, 2, device=d)), TypeError, "topk_ids"),
    ("moe_route", "permute ids int16", lambda d: PERM(d, topk_ids=torch.zeros(4, 2, dtype=torch.int16, device=d)), TypeError, "topk_ids"),
    ("moe_route", "permute ids 1-d", lambda d: PERM(d, topk_ids=torch.zeros(8, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe_route", "permute num_experts zero", lambda d: PERM(d, num_experts=0), ValueError, "num_experts"),
    ("moe_route", "permute num_experts float", lambda d: PERM(d, num_experts=8.0), TypeError, "num_experts"),
    ("moe_route", "permute block 3", lambda d: PERM(d, block=3), ValueError, "block"),
    ("moe_route", "permute block 0", lambda d: PERM(d, block=0), ValueError, "block"),
    ("moe_route", "permute block bool", lambda d: PERM(d, block=True), TypeError, "block"),
    ("moe_route", "permute past int32", lambda d: PERM(d, topk_ids=torch.zeros(1, 1, dtype=torch.int32, device=d).expand(2**20, 2**11)), ValueError, "topk_ids"),
    ("moe_route", "permute out_sorted shape", lambda d: PERM(d, out_sorted=torch.zeros(5, dtype=torch.int32, device=d)), ValueError, "out_sorted"),
    ("moe_route", "permute out_inv dtype", lambda d: PERM(d, out_inv=torch.zeros(8, dtype=torch.int64, device=d)), TypeError, "out_inv"),
    # moe (the layer)
    ("moe", "x int", lambda d: MOE(d, x=torch.ones(4, 24, dtype=torch.int32, device=d)), TypeError, "x"),
    ("moe", "x 3-d", lambda d: MOE(d, x=T(1, 4, 24, device=d)), ValueError, "x"),
    ("moe", "x not a tensor", lambda d: MOE(d, x=[[1.0] * 24] * 4), TypeError, "x"),
    ("moe", "x H zero", lambda d: MOE(d, H=0), ValueError, "x"),
    ("moe", "w13 2-d", lambda d: MOE(d, w13=T(32, 24, device=d)), ValueError, "w13"),
    ("moe", "w13 odd rows", lambda d: MOE(d, w13=T(8, 31, 24, device=d)), ValueError, "w13"),
    ("moe", "w13 H mismatch", lambda d: MOE(d, w13=T(8, 32, 25, device=d)), ValueError, "w13"),
    ("moe", "w13 no experts", lambda d: MOE(d, w13=T(0, 32, 24, device=d)), ValueError, "w13"),
    ("moe", "w13 fp16 with fp32 x", lambda d: MOE(d, w13=T(8, 32, 24, dtype=torch.float16, device=d)), TypeError, "w13"),
    ("moe", "w2 transposed shape", lambda d: MOE(d, w2=T(8, 16, 24, device=d)), ValueError, "w2"),
    ("moe", "w2 fewer experts", lambda d: MOE(d, w2=T(7, 24, 16, device=d)), ValueError, "w2"),
    ("moe", "w2 float64", lambda d: MOE(d, w2=T(8, 24, 16, dtype=torch.float64, device=d)), TypeError, "w2"),
    ("moe", "topk_ids int64", lambda d: MOE(d, topk_ids=torch.zeros(4, 2, dtype=torch.int64, device=d)), TypeError, "topk_ids"),
    ("moe", "topk_ids float", lambda d: MOE(d, topk_ids=T(4, 2, device=d)), TypeError, "topk_ids"),
    ("moe", "topk_ids wrong T", lambda d: MOE(d, topk_ids=torch.zeros(5, 2, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe", "topk_ids k zero", lambda d: MOE(d, topk_ids=torch.zeros(4, 0, dtype=torch.int32, device=d), topk_weights=T(4, 0, device=d)), ValueError, "topk_ids"),
    ("moe", "topk_ids negative", lambda d: MOE(d, topk_ids=torch.full((4, 2), -1, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe", "topk_ids past E", lambda d: MOE(d, topk_ids=torch.full((4, 2), 8, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe", "topk_weights fp16", lambda d: MOE(d, topk_weights=T(4, 2, dtype=torch.float16, device=d)), TypeError, "topk_weights"),
    ("moe", "topk_weights shape", lambda d: MOE(d, topk_weights=T(4, 3, device=d)), ValueError, "topk_weights"),
    ("moe", "topk_weights device", lambda d: MOE(d, topk_weights=torch.zeros(4, 2, device="meta")), ValueError, "topk_weights"),
    ("moe", "block_m 8", lambda d: MOE(d, block_m=8), ValueError, "block_m"),
    ("moe", "block_m 24", lambda d: MOE(d, block_m=24), ValueError, "block_m"),
    ("moe", "block_m bool", lambda d: MOE(d, block_m=True), ValueError, "block_m"),
    ("moe", "out dtype", lambda d: MOE(d, out=T(4, 24, dtype=torch.float16, device=d)), TypeError, "out"),
    ("moe", "out shape", lambda d: MOE(d, out=T(4, 25, device=d)), ValueError, "out"),
    # moe_mxfp4 (the layer on MXFP4 weights)
    ("moe_mxfp4", "x int", lambda d: MOEMX(d, x=torch.ones(4, 64, dtype=torch.int32, device=d)), TypeError, "x"),
    ("moe_mxfp4", "x float64", lambda d: MOEMX(d, x=T(4, 64, dtype=torch.float64, device=d)), TypeError, "x"),
    ("moe_mxfp4", "x uint8", lambda d: MOEMX(d, x=U8(4, 64, device=d)), TypeError, "x"),
    ("moe_mxfp4", "x 3-d", lambda d: MOEMX(d, x=T(1, 4, 64, device=d)), ValueError, "x"),
    ("moe_mxfp4", "x not a tensor", lambda d: MOEMX(d, x=[[1.0] * 64] * 4), TypeError, "x"),
    ("moe_mxfp4", "x H zero", lambda d: MOEMX(d, x=T(4, 0, device=d)), ValueError, "x"),
    ("moe_mxfp4", "x H not a multiple of 32", lambda d: MOEMX(d, H=48, w13_q=U8(8, 64, 24, device=d), w13_scales=U8(8, 64, 1, device=d), w2_q=U8(8, 48, 16, device=d), w2_scales=U8(8, 48, 1, device=d)), ValueError, "x"),
    ("moe_mxfp4", "w13_q float", lambda d: MOEMX(d, w13_q=T(8, 64, 32, device=d)), TypeError, "w13_q"),
    ("moe_mxfp4", "w13_q int8", lambda d: MOEMX(d, w13_q=torch.zeros(8, 64, 32, dtype=torch.int8, device=d)), TypeError, "w13_q"),
    ("moe_mxfp4", "w13_q not a tensor", lambda d: MOEMX(d, w13_q=None), TypeError, "w13_q"),
    ("moe_mxfp4", "w13_q 2-d", lambda d: MOEMX(d, w13_q=U8(64, 32, device=d)), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_q unpacked (H, not H/2)", lambda d: MOEMX(d, w13_q=U8(8, 64, 64, device=d)), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_q I not a multiple of 32", lambda d: MOEMX(d, w13_q=U8(8, 80, 32, device=d), w13_scales=U8(8, 80, 2, device=d)), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_q odd rows", lambda d: MOEMX(d, w13_q=U8(8, 63, 32, device=d)), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_q no experts", lambda d: MOEMX(d, w13_q=U8(0, 64, 32, device=d)), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_q too many experts", lambda d: MOEMX(d, w13_q=U8(1025, 64, 32, device=d)), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_q device", lambda d: MOEMX(d, w13_q=torch.zeros(8, 64, 32, dtype=torch.uint8, device="meta")), ValueError, "w13_q"),
    ("moe_mxfp4", "w13_scales float", lambda d: MOEMX(d, w13_scales=T(8, 64, 2, device=d)), TypeError, "w13_scales"),
    ("moe_mxfp4", "w13_scales one per 16", lambda d: MOEMX(d, w13_scales=U8(8, 64, 4, device=d)), ValueError, "w13_scales"),
    ("moe_mxfp4", "w13_scales fewer rows", lambda d: MOEMX(d, w13_scales=U8(8, 32, 2, device=d)), ValueError, "w13_scales"),
    ("moe_mxfp4", "w13_scales 2-d", lambda d: MOEMX(d, w13_scales=U8(64, 2, device=d)), ValueError, "w13_scales"),
    ("moe_mxfp4", "w13_scales device", lambda d: MOEMX(d, w13_scales=torch.zeros(8, 64, 2, dtype=torch.uint8, device="meta")), ValueError, "w13_scales"),
    ("moe_mxfp4", "w2_q int32", lambda d: MOEMX(d, w2_q=torch.zeros(8, 64, 16, dtype=torch.int32, device=d)), TypeError, "w2_q"),
    ("moe_mxfp4", "w2_q transposed shape", lambda d: MOEMX(d, w2_q=U8(8, 16, 64, device=d)), ValueError, "w2_q"),
    ("moe_mxfp4", "w2_q fewer experts", lambda d: MOEMX(d, w2_q=U8(7, 64, 16, device=d)), ValueError, "w2_q"),
    ("moe_mxfp4", "w2_q unpacked (I, not I/2)", lambda d: MOEMX(d, w2_q=U8(8, 64, 32, device=d)), ValueError, "w2_q"),
    ("moe_mxfp4", "w2_q device", lambda d: MOEMX(d, w2_q=torch.zeros(8, 64, 16, dtype=torch.uint8, device="meta")), ValueError, "w2_q"),
    ("moe_mxfp4", "w2_scales float16", lambda d: MOEMX(d, w2_scales=T(8, 64, 1, dtype=torch.float16, device=d)), TypeError, "w2_scales"),
    ("moe_mxfp4", "w2_scales one per 16", lambda d: MOEMX(d, w2_scales=U8(8, 64, 2, device=d)), ValueError, "w2_scales"),
    ("moe_mxfp4", "w2_scales 4-d", lambda d: MOEMX(d, w2_scales=U8(8, 64, 1, 1, device=d)), ValueError, "w2_scales"),
    ("moe_mxfp4", "w2_scales device", lambda d: MOEMX(d, w2_scales=torch.zeros(8, 64, 1, dtype=torch.uint8, device="meta")), ValueError, "w2_scales"),
    ("moe_mxfp4", "topk_ids int64", lambda d: MOEMX(d, topk_ids=torch.zeros(4, 2, dtype=torch.int64, device=d)), TypeError, "topk_ids"),
    ("moe_mxfp4", "topk_ids float", lambda d: MOEMX(d, topk_ids=T(4, 2, device=d)), TypeError, "topk_ids"),
    ("moe_mxfp4", "topk_ids 1-d", lambda d: MOEMX(d, topk_ids=torch.zeros(8, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe_mxfp4", "topk_ids wrong T", lambda d: MOEMX(d, topk_ids=torch.zeros(5, 2, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe_mxfp4", "topk_ids k zero", lambda d: MOEMX(d, topk_ids=torch.zeros(4, 0, dtype=torch.int32, device=d), topk_weights=T(4, 0, device=d)), ValueError, "topk_ids"),
    ("moe_mxfp4", "topk_ids negative", lambda d: MOEMX(d, topk_ids=torch.full((4, 2), -1, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe_mxfp4", "topk_ids past E", lambda d: MOEMX(d, topk_ids=torch.full((4, 2), 8, dtype=torch.int32, device=d)), ValueError, "topk_ids"),
    ("moe_mxfp4", "topk_ids device", lambda d: MOEMX(d, topk_ids=torch.zeros(4, 2, dtype=torch.int32, device="meta")), ValueError, "topk_ids"),
    ("moe_mxfp4", "topk_weights fp16", lambda d: MOEMX(d, topk_weights=T(4, 2, dtype=torch.float16, device=d)), TypeError, "topk_weights"),
    ("moe_mxfp4", "topk_weights shape", lambda d: MOEMX(d, topk_weights=T(4, 3, device=d)), ValueError, "topk_weights"),
    ("moe_mxfp4", "topk_weights device", lambda d: MOEMX(d, topk_weights=torch.zeros(4, 2, device="meta")), ValueError, "topk_weights"),
    ("moe_mxfp4", "block_m 8", lambda d: MOEMX(d, block_m=8), ValueError, "block_m"),
    ("moe_mxfp4", "block_m 24", lambda d: MOEMX(d, block_m=24), ValueError, "block_m"),
    ("moe_mxfp4", "block_m 512", lambda d: MOEMX(d, block_m=512), ValueError, "block_m"),
    ("moe_mxfp4", "block_m bool", lambda d: MOEMX(d, block_m=True), ValueError, "block_m"),
    ("moe_mxfp4", "out dtype", lambda d: MOEMX(d, out=T(4, 64, dtype=torch.float16, device=d)), TypeError, "out"),
    ("moe_mxfp4", "out shape", lambda d: MOEMX(d, out=T(4, 65, device=d)), ValueError, "out"),
    ("moe_mxfp4", "out strided", lambda d: MOEMX(d, out=T(64, 4, device=d).t()), ValueError, "out"),
    ("moe_mxfp4", "out device", lambda d: MOEMX(d, out=torch.zeros(4, 64, device="meta")), ValueError, "out"),
    ("moe_route", "permute out_num shape", lambda d: PERM(d, out_num=torch.zeros((), dtype=torch.int32, device=d)), ValueError, "out_num"),
    # fused_linear_cross_entropy
    ("fused_linear_cross_entropy", "h int", lambda d: FLCE(d, h=torch.ones(4, 8, dtype=torch.int32, device=d)), TypeError, "h"),
    ("fused_linear_cross_entropy", "h float64", lambda d: FLCE(d, h=T(4, 8, dtype=torch.float64, device=d)), TypeError, "h"),
    ("fused_linear_cross_entropy", "h 3-d", lambda d: FLCE(d, h=T(1, 4, 8, device=d)), ValueError, "h"),
    ("fused_linear_cross_entropy", "h not a tensor", lambda d: FLCE(d, h=[[1.0] * 8] * 4), TypeError, "h"),
    ("fused_linear_cross_entropy", "W 1-d", lambda d: FLCE(d, W=T(8, device=d)), ValueError, "W"),
    ("fused_linear_cross_entropy", "W hidden size", lambda d: FLCE(d, W=T(6, 9, device=d)), ValueError, "W"),
    ("fused_linear_cross_entropy", "W transposed shape", lambda d: FLCE(d, W=T(8, 6, device=d)), ValueError, "W"),
    ("fused_linear_cross_entropy", "W no rows", lambda d: FLCE(d, W=T(0, 8, device=d)), ValueError, "W"),
    ("fused_linear_cross_entropy", "W fp16 with fp32 h", lambda d: FLCE(d, W=T(6, 8, dtype=torch.float16, device=d)), TypeError, "W"),
    ("fused_linear_cross_entropy", "W device", lambda d: FLCE(d, W=torch.zeros(6, 8, device="meta")), ValueError, "W"),
    ("fused_linear_cross_entropy", "labels float", lambda d: FLCE(d, labels=T(4, device=d)), TypeError, "labels"),
    ("fused_linear_cross_entropy", "labels int16", lambda d: FLCE(d, labels=torch.zeros(4, dtype=torch.int16, device=d)), TypeError, "labels"),
    ("fused_linear_cross_entropy", "labels 2-d", lambda d: FLCE(d, labels=torch.zeros(4, 1, dtype=torch.int64, device=d)), ValueError, "labels"),
    ("fused_linear_cross_entropy", "labels length", lambda d: FLCE(d, labels=torch.zeros(5, dtype=torch.int64, device=d)), ValueError, "labels"),
    ("fused_linear_cross_entropy", "labels past V", lambda d: FLCE(d, labels=torch.tensor([0, 6, 1, 2], device=d)), ValueError, "labels"),
    ("fused_linear_cross_entropy", "labels negative", lambda d: FLCE(d, labels=torch.tensor([0, -1, 1, 2], device=d)), ValueError, "labels"),
    ("fused_linear_cross_entropy", "labels device", lambda d: FLCE(d, labels=torch.zeros(4, dtype=torch.int64, device="meta")), ValueError, "labels"),
    ("fused_linear_cross_entropy", "ignore_index float", lambda d: FLCE(d, ignore_index=-100.0), TypeError, "ignore_index"),
    ("fused_linear_cross_entropy", "ignore_index bool", lambda d: FLCE(d, ignore_index=True), TypeError, "ignore_index"),
    ("fused_linear_cross_entropy", "ignore_index past int64", lambda d: FLCE(d, ignore_index=2**63), ValueError, "ignore_index"),
    ("fused_linear_cross_entropy", "label_smoothing negative", lambda d: FLCE(d, label_smoothing=-0.1), ValueError, "label_smoothing"),
    ("fused_linear_cross_entropy", "label_smoothing past 1", lambda d: FLCE(d, label_smoothing=1.5), ValueError, "label_smoothing"),
    ("fused_linear_cross_entropy", "label_smoothing NaN", lambda d: FLCE(d, label_smoothing=math.nan), ValueError, "label_smoothing"),
    ("fused_linear_cross_entropy", "label_smoothing a string", lambda d: FLCE(d, label_smoothing="0.1"), TypeError, "label_smoothing"),
    ("fused_linear_cross_entropy", "softcap zero", lambda d: FLCE(d, softcap=0.0), ValueError, "softcap"),
    ("fused_linear_cross_entropy", "softcap negative", lambda d: FLCE(d, softcap=-30.0), ValueError, "softcap"),
    ("fused_linear_cross_entropy", "softcap inf", lambda d: FLCE(d, softcap=math.inf), ValueError, "softcap"),
    ("fused_linear_cross_entropy", "reduction none", lambda d: FLCE(d, reduction="none"), ValueError, "reduction"),
    ("fused_linear_cross_entropy", "reduction unknown", lambda d: FLCE(d, reduction="avg"), ValueError, "reduction"),
    ("fused_linear_cross_entropy", "reduction not a str", lambda d: FLCE(d, reduction=None), TypeError, "reduction"),
    ("fused_linear_cross_entropy", "chunk_size zero", lambda d: FLCE(d, chunk_size=0), ValueError, "chunk_size"),
    ("fused_linear_cross_entropy", "chunk_size float", lambda d: FLCE(d, chunk_size=16.0), ValueError, "chunk_size"),
    ("fused_linear_cross_entropy", "chunk_size bool", lambda d: FLCE(d, chunk_size=True), ValueError, "chunk_size"),
    ("fused_linear_cross_entropy", "logits_rows zero", lambda d: FLCE(d, logits_rows=0), ValueError, "logits_rows"),
    ("fused_linear_cross_entropy", "block_v 24", lambda d: FLCE(d, block_v=24), ValueError, "block_v"),
    ("fused_linear_cross_entropy", "block 8", lambda d: FLCE(d, block=8), ValueError, "block"),
    ("fused_linear_cross_entropy", "num_splits zero", lambda d: FLCE(d, num_splits=0), ValueError, "num_splits"),
    ("fused_linear_cross_entropy", "gemm unknown", lambda d: FLCE(d, gemm="cublas"), ValueError, "gemm"),
    ("fused_linear_cross_entropy", "dw_accumulation unknown", lambda d: FLCE(d, dw_accumulation="bf16"), ValueError, "dw_accumulation"),
    ("fused_linear_cross_entropy", "dw_accumulation not a str", lambda d: FLCE(d, dw_accumulation=torch.bfloat16), TypeError, "dw_accumulation"),
    ("fused_linear_cross_entropy", "validate a string", lambda d: FLCE(d, validate="later"), ValueError, "validate"),
    ("fused_linear_cross_entropy", "loss_out fp16", lambda d: FLCE(d, loss_out=torch.zeros((), dtype=torch.float16, device=d)), TypeError, "loss_out"),
    ("fused_linear_cross_entropy", "loss_out shape", lambda d: FLCE(d, loss_out=torch.zeros(1, device=d)), ValueError, "loss_out"),
    ("fused_linear_cross_entropy", "out_dh shape", lambda d: FLCE(d, out_dh=T(4, 9, device=d)), ValueError, "out_dh"),
    ("fused_linear_cross_entropy", "out_dh dtype", lambda d: FLCE(d, out_dh=T(4, 8, dtype=torch.float16, device=d)), TypeError, "out_dh"),
    ("fused_linear_cross_entropy", "out_dh strided", lambda d: FLCE(d, out_dh=T(8, 4, device=d).t()), ValueError, "out_dh"),
    ("fused_linear_cross_entropy", "out_dw shape", lambda d: FLCE(d, out_dw=T(8, 6, device=d)), ValueError, "out_dw"),
    ("fused_linear_cross_entropy", "out_dw fp32 for fp16 W", lambda d: FLCE(d, dtype=torch.float16, out_dw=T(6, 8, device=d)), TypeError, "out_dw"),
    ("fused_linear_cross_entropy", "out_dw device", lambda d: FLCE(d, out_dw=torch.zeros(6, 8, device="meta")), ValueError, "out_dw"),
]

# Backward passes (issue 20): softmax_backward, bias_gelu_backward, embedding_backward, rope_backward,
# rmsnorm_rope_backward, swiglu_backward
BAD += [
    ("softmax_backward", "int dy", lambda d: kernels.softmax_backward(torch.ones(2, 4, dtype=torch.int64, device=d), T(2, 4, device=d)), TypeError, "dy"),
    ("softmax_backward", "float64 y", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, dtype=torch.float64, device=d)), TypeError, "y"),
    ("softmax_backward", "y not a tensor", lambda d: kernels.softmax_backward(T(2, 4, device=d), None), TypeError, "y"),
    ("softmax_backward", "y shape", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 5, device=d)), ValueError, "y"),
    ("softmax_backward", "y dtype", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, dtype=torch.float16, device=d)), TypeError, "y"),
    ("softmax_backward", "y device", lambda d: kernels.softmax_backward(T(2, 4, device=d), torch.empty(2, 4, device="meta")), ValueError, "y"),
    ("softmax_backward", "scale NaN", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), math.nan), ValueError, "scale"),
    ("softmax_backward", "scale zero", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), 0.0), ValueError, "scale"),
    ("softmax_backward", "scale past fp32", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), 1e39), ValueError, "scale"),
    ("softmax_backward", "causal not a bool", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), 1.0, 1), TypeError, "causal"),
    ("softmax_backward", "causal on 1-d", lambda d: kernels.softmax_backward(T(4, device=d), T(4, device=d), 1.0, True), ValueError, "dy"),
    ("softmax_backward", "out shape", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), out_dx=T(4, 2, device=d)), ValueError, "out_dx"),
    ("softmax_backward", "out dtype", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), out_dx=T(2, 4, dtype=torch.float16, device=d)), TypeError, "out_dx"),
    ("softmax_backward", "block_cols not a power of two", lambda d: kernels.softmax_backward(T(2, 4, device=d), T(2, 4, device=d), block_cols=3), ValueError, "block_cols"),
    ("bias_gelu_backward", "int dout", lambda d: kernels.bias_gelu_backward(torch.ones(2, 4, dtype=torch.int32, device=d), T(2, 4, device=d)), TypeError, "dout"),
    ("bias_gelu_backward", "0-d dout", lambda d: kernels.bias_gelu_backward(torch.tensor(1.0, device=d), torch.tensor(1.0, device=d)), ValueError, "dout"),
    ("bias_gelu_backward", "y shape", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(4, 2, device=d)), ValueError, "y"),
    ("bias_gelu_backward", "y dtype", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, dtype=torch.float16, device=d)), TypeError, "y"),
    ("bias_gelu_backward", "y device", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), torch.empty(2, 4, device="meta")), ValueError, "y"),
    ("bias_gelu_backward", "bias length", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), T(5, device=d)), ValueError, "bias"),
    ("bias_gelu_backward", "bias rank", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), T(2, 4, device=d)), ValueError, "bias"),
    ("bias_gelu_backward", "bias dtype", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, dtype=torch.float16, device=d)), TypeError, "bias"),
    ("bias_gelu_backward", "unknown approximate", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), None, "erf"), ValueError, "approximate"),
    ("bias_gelu_backward", "out_dy shape", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), out_dy=T(4, 2, device=d)), ValueError, "out_dy"),
    ("bias_gelu_backward", "out_dbias shape", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dbias=T(5, device=d)), ValueError, "out_dbias"),
    ("bias_gelu_backward", "out_dbias dtype", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), T(4, device=d), out_dbias=T(4, dtype=torch.float16, device=d)), TypeError, "out_dbias"),
    ("bias_gelu_backward", "out_dbias without a bias", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), out_dbias=T(4, device=d)), ValueError, "out_dbias"),
    ("bias_gelu_backward", "block_rows not a power of two", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), block_rows=3), ValueError, "block_rows"),
    ("bias_gelu_backward", "row_groups zero", lambda d: kernels.bias_gelu_backward(T(2, 4, device=d), T(2, 4, device=d), row_groups=0), ValueError, "row_groups"),
    ("embedding_backward", "id past the table", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 5], device=d), 5), ValueError, "ids"),
    ("embedding_backward", "negative id", lambda d: kernels.embedding_backward(T(1, 2, 8, device=d), torch.tensor([[1, -1]], dtype=torch.int32, device=d), 5), ValueError, "ids"),
    ("embedding_backward", "ids into an empty table", lambda d: kernels.embedding_backward(T(1, 8, device=d), torch.tensor([0], device=d), 0), ValueError, "ids"),
    ("embedding_backward", "float ids", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0.0, 1.0], device=d), 5), TypeError, "ids"),
    ("embedding_backward", "int dout", lambda d: kernels.embedding_backward(torch.ones(2, 8, dtype=torch.int32, device=d), torch.tensor([0, 1], device=d), 5), TypeError, "dout"),
    ("embedding_backward", "float64 dout", lambda d: kernels.embedding_backward(T(2, 8, dtype=torch.float64, device=d), torch.tensor([0, 1], device=d), 5), TypeError, "dout"),
    ("embedding_backward", "dout not of the ids' shape", lambda d: kernels.embedding_backward(T(3, 8, device=d), torch.tensor([0, 1], device=d), 5), ValueError, "dout"),
    ("embedding_backward", "dout without a feature dim", lambda d: kernels.embedding_backward(T(2, device=d), torch.tensor([0, 1], device=d), 5), ValueError, "dout"),
    ("embedding_backward", "num_embeddings negative", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), -1), ValueError, "num_embeddings"),
    ("embedding_backward", "num_embeddings a float", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), 5.0), TypeError, "num_embeddings"),
    ("embedding_backward", "num_embeddings a tensor", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), T(5, 8, device=d)), TypeError, "num_embeddings"),
    ("embedding_backward", "ids device", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.zeros(2, dtype=torch.int64, device="meta"), 5), ValueError, "ids"),
    ("embedding_backward", "out_dtable shape", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), 5, out_dtable=T(5, 7, device=d)), ValueError, "out_dtable"),
    ("embedding_backward", "out_dtable dtype", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), 5, out_dtable=T(5, 8, dtype=torch.float16, device=d)), TypeError, "out_dtable"),
    ("embedding_backward", "validate an int", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), 5, validate=0), TypeError, "validate"),
    ("embedding_backward", "block_rows not a power of two", lambda d: kernels.embedding_backward(T(2, 8, device=d), torch.tensor([0, 1], device=d), 5, block_rows=3), ValueError, "block_rows"),
    ("rope_backward", "3-d dy", lambda d: kernels.rope_backward(T(2, 3, 4, device=d), P(2, 3, d)), ValueError, "dy"),
    ("rope_backward", "int dy", lambda d: kernels.rope_backward(torch.ones(2, 3, 1, 4, dtype=torch.int32, device=d), P(2, 3, d)), TypeError, "dy"),
    ("rope_backward", "float positions", lambda d: kernels.rope_backward(T(2, 3, 1, 4, device=d), torch.zeros(2, 3, device=d)), TypeError, "positions"),
    ("rope_backward", "positions shape", lambda d: kernels.rope_backward(T(2, 3, 1, 4, device=d), P(3, 2, d)), ValueError, "positions"),
    ("rope_backward", "odd rotary_dim", lambda d: kernels.rope_backward(T(2, 3, 1, 8, device=d), P(2, 3, d), rotary_dim=5), ValueError, "rotary_dim"),
    ("rope_backward", "theta zero", lambda d: kernels.rope_backward(T(2, 3, 1, 8, device=d), P(2, 3, d), 0.0), ValueError, "theta"),
    ("rope_backward", "unknown style", lambda d: kernels.rope_backward(T(2, 3, 1, 8, device=d), P(2, 3, d), style="llama"), ValueError, "style"),
    ("rope_backward", "out_dx shape", lambda d: kernels.rope_backward(T(2, 3, 1, 8, device=d), P(2, 3, d), out_dx=T(2, 3, 8, device=d)), ValueError, "out_dx"),
    ("rmsnorm_rope_backward", "dy shape", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 4, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d)), ValueError, "dy"),
    ("rmsnorm_rope_backward", "3-d dy", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 8, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d)), ValueError, "dy"),
    ("rmsnorm_rope_backward", "dy dtype", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, dtype=torch.float16, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d)), TypeError, "dy"),
    ("rmsnorm_rope_backward", "dy device", lambda d: kernels.rmsnorm_rope_backward(torch.empty(2, 3, 1, 8, device="meta"), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d)), ValueError, "dy"),
    ("rmsnorm_rope_backward", "3-d x", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 8, device=d), T(2, 3, 8, device=d), T(8, device=d), P(2, 3, d)), ValueError, "x"),
    ("rmsnorm_rope_backward", "weight length", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(4, device=d), P(2, 3, d)), ValueError, "w"),
    ("rmsnorm_rope_backward", "weight dtype", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(8, dtype=torch.float16, device=d), P(2, 3, d)), TypeError, "w"),
    ("rmsnorm_rope_backward", "eps NaN", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d), math.nan), ValueError, "eps"),
    ("rmsnorm_rope_backward", "positions shape", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(3, 2, d)), ValueError, "positions"),
    ("rmsnorm_rope_backward", "out_dw shape", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d), out_dw=T(4, device=d)), ValueError, "out_dw"),
    ("rmsnorm_rope_backward", "out_dw dtype", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d), out_dw=T(8, dtype=torch.float16, device=d)), TypeError, "out_dw"),
    ("rmsnorm_rope_backward", "row_groups zero", lambda d: kernels.rmsnorm_rope_backward(T(2, 3, 1, 8, device=d), T(2, 3, 1, 8, device=d), T(8, device=d), P(2, 3, d), row_groups=0), ValueError, "row_groups"),
    ("swiglu_backward", "dy shape", lambda d: SGB(d, dy=T(4, 6, device=d)), ValueError, "dy"),
    ("swiglu_backward", "dy dtype", lambda d: SGB(d, dy=T(4, 5, dtype=torch.float16, device=d)), TypeError, "dy"),
    ("swiglu_backward", "dy device", lambda d: SGB(d, dy=torch.empty(4, 5, device="meta")), ValueError, "dy"),
    ("swiglu_backward", "int dy", lambda d: SGB(d, dy=torch.ones(4, 5, dtype=torch.int32, device=d)), TypeError, "dy"),
    ("swiglu_backward", "inner dims differ", lambda d: SGB(d, w_gate=T(5, 7, device=d)), ValueError, "w_gate"),
    ("swiglu_backward", "w_up shape", lambda d: SGB(d, w_up=T(6, 8, device=d)), ValueError, "w_up"),
    ("swiglu_backward", "b_up length", lambda d: SGB(d, b_up=T(6, device=d)), ValueError, "b_up"),
    ("swiglu_backward", "relu is not gated", lambda d: SGB(d, activation="relu"), ValueError, "activation"),
    ("swiglu_backward", "out_dx shape", lambda d: SGB(d, out_dx=T(4, 5, device=d)), ValueError, "out_dx"),
    ("swiglu_backward", "out_dw_gate shape", lambda d: SGB(d, out_dw_gate=T(8, 5, device=d)), ValueError, "out_dw_gate"),
    ("swiglu_backward", "out_dw_up dtype", lambda d: SGB(d, out_dw_up=T(5, 8, dtype=torch.float16, device=d)), TypeError, "out_dw_up"),
    ("swiglu_backward", "out_db_gate shape", lambda d: SGB(d, out_db_gate=T(4, device=d)), ValueError, "out_db_gate"),
    ("swiglu_backward", "out_db_up without b_up", lambda d: SGB(d, b_up=None, out_db_up=T(5, device=d)), ValueError, "out_db_up"),
    ("swiglu_backward", "block_k not a power of two", lambda d: SGB(d, block_k=24), ValueError, "block_k"),
]
EMPTY_BACKWARD = [
    ("softmax_backward", lambda d: kernels.softmax_backward(T(0, 5, device=d), T(0, 5, device=d), 1.0, True)),
    ("softmax_backward", lambda d: kernels.softmax_backward(T(3, 0, device=d), T(3, 0, device=d))),
    ("bias_gelu_backward", lambda d: kernels.bias_gelu_backward(T(2, 0, device=d), T(2, 0, device=d), T(0, device=d))),
    ("bias_gelu_backward", lambda d: kernels.bias_gelu_backward(T(0, 5, device=d), T(0, 5, device=d))),
    ("embedding_backward", lambda d: kernels.embedding_backward(T(3, 0, device=d), torch.zeros(3, dtype=torch.int32, device=d), 5)),
    ("embedding_backward", lambda d: kernels.embedding_backward(T(0, 4, device=d), torch.zeros(0, dtype=torch.int64, device=d), 0)),
    ("rope_backward", lambda d: kernels.rope_backward(T(0, 3, 2, 8, device=d), P(0, 3, d))),
    ("rmsnorm_rope_backward", lambda d: kernels.rmsnorm_rope_backward(T(2, 0, 2, 8, device=d), T(2, 0, 2, 8, device=d), T(8, device=d), P(2, 0, d))[0]),
    ("swiglu_backward", lambda d: SGB(d, dy=T(0, 5, device=d), x=T(0, 8, device=d))[0]),
    ("swiglu_backward", lambda d: SGB(d, dy=T(4, 0, device=d), w_gate=T(0, 8, device=d), w_up=T(0, 8, device=d), b_gate=None, b_up=None)[1]),
    ("swiglu_backward", lambda d: SGB(d, x=T(4, 0, device=d), w_gate=T(5, 0, device=d), w_up=T(5, 0, device=d))[0]),
]


@pytest.mark.parametrize("op,what,call,exc,arg", [pytest.param(*b, id=f"{b[0]}-{b[1].replace(' ', '_')}",
                                                               marks=pytest.mark.op(b[0])) for b in BAD])
def test_bad_input_names_the_argument(op, what, call, exc, arg, dev):
    with pytest.raises(exc) as info:
        call(dev)
    assert str(info.value).startswith(f"{arg}:"), f"message should start with '{arg}:': {info.value}"


@pytest.mark.parametrize("op", ["rmsnorm", "softmax"])
def test_cpu_tensor_without_interpreter_is_refused(op, monkeypatch):
    """A CPU tensor handed to a compiled kernel would be read as a device pointer: refuse it."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="^x: is on the CPU"):
        kernels.rmsnorm(x, torch.ones(4)) if op == "rmsnorm" else kernels.softmax(x)


@pytest.mark.parametrize("op,call", [
    ("rmsnorm", lambda d: kernels.rmsnorm(T(0, 8, device=d), T(8, device=d))),
    ("layernorm", lambda d: kernels.layernorm(T(3, 0, device=d))),
    ("add_rmsnorm", lambda d: kernels.add_rmsnorm(T(0, 8, device=d), T(0, 8, device=d), T(8, device=d))[0]),
    ("rmsnorm_backward", lambda d: kernels.rmsnorm_backward(T(0, 8, device=d), T(0, 8, device=d), T(8, device=d))[0]),
    ("layernorm_backward", lambda d: kernels.layernorm_backward(T(3, 0, device=d), T(3, 0, device=d), T(0, device=d), T(0, device=d))[1]),
    ("add_rmsnorm_backward", lambda d: kernels.add_rmsnorm_backward(T(0, 8, device=d), T(0, 8, device=d), T(0, 8, device=d), T(0, 8, device=d), T(8, device=d))[1]),
    ("rope", lambda d: kernels.rope(T(0, 3, 2, 8, device=d), P(0, 3, d))),
    ("rmsnorm_rope", lambda d: kernels.rmsnorm_rope(T(2, 0, 2, 8, device=d), T(8, device=d), P(2, 0, d))),
    ("softmax", lambda d: kernels.softmax(T(0, 5, device=d), 1.0, True)),
    ("bias_gelu", lambda d: kernels.bias_gelu(T(0, 8, device=d), T(8, device=d))),
    ("embedding", lambda d: kernels.embedding(torch.zeros(0, 3, dtype=torch.int32, device=d), T(5, 8, device=d))),
    ("embedding", lambda d: kernels.embedding(torch.zeros(0, dtype=torch.int64, device=d), T(0, 8, device=d))),
    ("flash_attention", lambda d: kernels.flash_attention(T(0, 4, 2, 16, device=d), T(0, 4, 1, 16, device=d), T(0, 4, 1, 16, device=d))),
    ("flash_attention", lambda d: kernels.flash_attention(T(0, 2, 16, device=d), T(0, 1, 16, device=d), T(0, 1, 16, device=d), cu_seqlens_q=torch.tensor([0, 0], device=d), cu_seqlens_k=torch.tensor([0, 0], device=d))),
    ("flash_attention_backward", lambda d: FAB(d, q=T(0, 3, 2, 16, device=d), k=T(0, 4, 1, 16, device=d), v=T(0, 4, 1, 16, device=d), o=T(0, 3, 2, 16, device=d), do=T(0, 3, 2, 16, device=d), lse=T(0, 2, 3, device=d))[1]),
    ("flash_attention_backward", lambda d: FAB(d, varlen=True, q=T(0, 2, 16, device=d), o=T(0, 2, 16, device=d), do=T(0, 2, 16, device=d), lse=T(2, 0, device=d), k=T(0, 1, 16, device=d), v=T(0, 1, 16, device=d), cu_seqlens_q=torch.tensor([0], device=d), cu_seqlens_k=torch.tensor([0], device=d))[0]),
    ("decode_attention", lambda d: kernels.decode_attention(T(0, 4, 16, device=d), T(0, 8, 2, 16, device=d), T(0, 8, 2, 16, device=d), torch.zeros(0, dtype=torch.int32, device=d))),
    ("gated_delta_rule", lambda d: GDN(d, T_=0)[0]),
    ("gated_delta_rule", lambda d: GDN(d, B=0, output_final_state=True)[1]),
    ("gated_delta_rule", lambda d: GDN1(d, B=0)),
    ("mla_decode", lambda d: kernels.mla_decode(T(0, 1, 2, 8, device=d), T(0, 1, 2, 4, device=d), T(0, 6, 8, device=d), T(0, 6, 4, device=d), torch.zeros(0, dtype=torch.int32, device=d), 0.3)[0]),
    ("matmul", lambda d: kernels.matmul(T(0, 8, device=d), T(5, 8, device=d), T(5, device=d), "gelu")),
    ("matmul", lambda d: kernels.matmul(T(2, 3, 8, device=d), T(0, 8, device=d))),
    ("swiglu", lambda d: kernels.swiglu(T(2, 0, 8, device=d), T(5, 8, device=d), T(5, 8, device=d))),
    ("quantize_fp8", lambda d: kernels.quantize_fp8(T(0, 8, device=d), E4, "row")[0]),
    ("quantize_fp8", lambda d: kernels.quantize_fp8(T(3, 0, device=d), E5, "tensor")[0]),
    ("quantize_mxfp4", lambda d: kernels.quantize_mxfp4(T(0, 64, device=d))[0]),
    ("quantize_mxfp4", lambda d: kernels.quantize_mxfp4(T(3, 0, device=d))[1]),
    ("dequantize_mxfp4", lambda d: kernels.dequantize_mxfp4(U8(0, 16, device=d), U8(0, 1, device=d))),
    ("dequantize_mxfp4", lambda d: kernels.dequantize_mxfp4(U8(3, 0, device=d), U8(3, 0, device=d))),
    ("fp8_matmul", lambda d: kernels.fp8_matmul(F8(0, 8, device=d), F8(5, 8, device=d), S(device=d), S(5, device=d))),
    ("fp8_matmul", lambda d: kernels.fp8_matmul(F8(4, 8, device=d), F8(0, 8, device=d), S(4, 1, device=d), S(device=d))),
    ("moe_route", lambda d: ROUTE(d, T_=0)[0]),
    ("moe", lambda d: MOE(d, T_=0)),
    ("moe_mxfp4", lambda d: MOEMX(d, T_=0)),
    ("fused_linear_cross_entropy", lambda d: FLCE(d, N=0)[1]),
    ("moe_route", lambda d: PERM(d, topk_ids=torch.zeros(0, 2, dtype=torch.int32, device=d))[3]),
])
def test_empty_input_gives_empty_output(op, call, dev):
    y = call(dev)
    assert y.numel() == 0


@pytest.mark.parametrize("op", ["rmsnorm_backward", "layernorm_backward", "add_rmsnorm_backward"])
def test_norm_backward_of_no_rows_gives_zero_weight_gradients(op, dev):
    """dw (and db) sum over the rows: with none they are zeros, written without a launch."""
    x = T(0, 8, device=dev)
    nan = lambda: torch.full((8,), math.nan, device=dev)      # noqa: E731
    if op == "rmsnorm_backward":
        outs = kernels.rmsnorm_backward(x, x, T(8, device=dev), out_dw=nan())[1:]
    elif op == "layernorm_backward":
        outs = kernels.layernorm_backward(x, x, T(8, device=dev), T(8, device=dev), out_dw=nan(), out_db=nan())[1:]
    else:
        outs = kernels.add_rmsnorm_backward(x, x, x, x, T(8, device=dev), out_dw=nan())[2:]
    assert all(torch.equal(t, torch.zeros(8, device=dev)) for t in outs)


@pytest.mark.parametrize("op,call", [pytest.param(*e, marks=pytest.mark.op(e[0])) for e in EMPTY_BACKWARD])
def test_backward_of_empty_input_gives_empty_gradients(op, call, dev):
    grads = call(dev)
    for g in grads if isinstance(grads, tuple) else (grads,):
        assert g is None or g.numel() == 0


@pytest.mark.op("embedding")
def test_embedding_bad_id_is_refused_not_read(dev):
    """An id past the table is refused with an error naming ids, their range and how many are
    bad. The check is fused into the kernel, which has written out= by then: the bad id's row
    as NaN (no read of memory past the table), the others exact."""
    table = T(4, 8, device=dev)
    out = torch.full((3, 8), 7.0, device=dev)
    for bad, n_bad in (([0, 4, 1], 1), ([-1, 0, -3], 2), ([0, 1, 2**40], 1)):
        with pytest.raises(ValueError, match=f"^ids: expected ids in \\[0, 4\\).* got {n_bad} outside it"):
            kernels.embedding(torch.tensor(bad, device=dev), table, out=out)
        for row, i in zip(out, bad):
            assert bool(row.isnan().all()) if not 0 <= i < 4 else torch.equal(row, table[i])


@pytest.mark.op("embedding")
def test_embedding_kernel_masks_and_counts_bad_ids(dev):
    """Defence in depth: launched directly with ids outside [0, V), the kernel reads nothing
    outside the table (the interpreter's out-of-bounds guard is on), writes NaN rows, never
    another row, and counts each bad id once (two feature blocks here)."""
    from kernels.embedding import _embedding_kernel
    table = T(4, 8, device=dev)
    ids = torch.tensor([2, 4, -1, 1 << 40], device=dev)
    out = torch.zeros(4, 8, device=dev)
    bad = torch.zeros(1, dtype=torch.int32, device=dev)
    _embedding_kernel[(1, 2)](ids, table, out, bad, 4, 4, 8, 1, table.stride(0), table.stride(1), COUNT_BAD=True,
                              BLOCK_T=4, BLOCK_H=4)
    assert torch.equal(out[0], table[2])
    assert bool(out[1:].isnan().all())
    assert int(bad.item()) == 3


@pytest.mark.op("embedding")
def test_embedding_unvalidated_bad_ids_give_nan_rows(dev):
    """validate=False skips the host check; a bad id then gives a NaN row, the others stay exact."""
    table = T(4, 8, device=dev)
    y = kernels.embedding(torch.tensor([3, 4, -2, 0], device=dev), table, validate=False)
    assert torch.equal(y[0], table[3]) and torch.equal(y[3], table[0])
    assert bool(y[1:3].isnan().all())


def _flce_bad(d, validate, labels=(0, 7, -100, 9, 2), **kw):
    """fused_linear_cross_entropy with labels 7 and 9 past V = 6 (and one ignored -100, no error)."""
    gen = torch.Generator().manual_seed(0)
    h, W = torch.randn(5, 8, generator=gen).to(d), torch.randn(6, 8, generator=gen).to(d)
    return kernels.fused_linear_cross_entropy(h, W, torch.tensor(labels, device=d), validate=validate, **kw), (h, W)


@pytest.mark.op("fused_linear_cross_entropy")
def test_fused_linear_cross_entropy_bad_label_is_refused_before_the_gemms(dev):
    """validate=True: the label kernel counts the labels outside [0, V) that are not ignore_index,
    and the error names labels, how many and their range before any GEMM runs. An ignore_index
    that is not a class (-100) is no error, nor is one that is (0: the rows labelled 0 are ignored)."""
    out_dh = torch.full((5, 8), 7.0, device=dev)
    with pytest.raises(ValueError, match=r"^labels: expected labels in \[0, 6\) \(the rows of W\) or ignore_index "
                                         r"\(-100\), got 2 outside \(min 7, max 9\)$"):
        _flce_bad(dev, True, out_dh=out_dh)
    assert bool((out_dh == 7.0).all())          # raised before the GEMMs
    # the label kernel's loop reaches its last block when that block holds one row alone
    labels = torch.full((_LABEL_BLOCK + 1,), -100, device=dev)
    labels[-1] = 6
    with pytest.raises(ValueError, match=r"got 1 outside \(min 6, max 6\)$"):
        kernels.fused_linear_cross_entropy(torch.randn(len(labels), 8, device=dev), torch.randn(6, 8, device=dev),
                                           labels)
    (loss, dh, dw), _ = _flce_bad(dev, True, labels=(0, 5, -100, 3, 0))
    assert bool(loss.isfinite()) and bool(dh.isfinite().all()) and bool(dw.isfinite().all())
    h, W = torch.randn(3, 8, device=dev), torch.randn(6, 8, device=dev)
    kernels.fused_linear_cross_entropy(h, W, torch.tensor([0, 5, 0], device=dev), ignore_index=0)


@pytest.mark.op("fused_linear_cross_entropy")
@pytest.mark.parametrize("validate", [False, "deferred"])
def test_fused_linear_cross_entropy_unchecked_bad_labels_give_nan(validate, dev):
    """validate=False or "deferred": the call runs on; a bad label's row gives a NaN loss and a NaN
    row of dh, hence NaN everywhere in dW (a sum over the rows), the other rows of dh as without
    that row. "deferred" raises at kernels.raise_deferred_errors(), naming labels and the launcher;
    False never."""
    (loss, dh, dw), (h, W) = _flce_bad(dev, validate)
    assert bool(loss.isnan()) and bool(dw.isnan().all())
    assert dh.isnan().all(1).tolist() == [False, True, False, True, False]
    if validate == "deferred":
        with pytest.raises(ValueError, match='^labels: expected labels in .* an earlier fused_linear_cross_entropy call '
                                             'with validate="deferred"'):
            kernels.raise_deferred_errors()
    kernels.raise_deferred_errors()
    fixed = torch.tensor([0, -100, -100, -100, 2], device=dev)
    _, dh_fixed, _ = kernels.fused_linear_cross_entropy(h, W, fixed, reduction="sum")
    _, dh_sum, _ = kernels.fused_linear_cross_entropy(h, W, torch.tensor([0, 7, -100, 9, 2], device=dev),
                                                     reduction="sum", validate=False)
    assert torch.equal(dh_sum[[0, 2, 4]], dh_fixed[[0, 2, 4]])


@pytest.mark.op("decode_attention")
@pytest.mark.parametrize("paged", [False, True])
def test_decode_unvalidated_bad_lengths_and_pages_give_nan_rows(dev, paged):
    """validate=False skips the host check of seqlens and block_table. A length outside
    [0, capacity] or a page index outside the cache then makes its row NaN; the kernel reads
    nothing outside the cache (the interpreter's out-of-bounds guard is on), and good rows are
    the same as with validation. 2^32 + 3 is judged as an int64 (it would wrap to 3 in int32)."""
    q = T(5 if not paged else 6, 4, 16, device=dev)
    if paged:
        k, v = T(6, 4, 2, 16, device=dev), T(6, 4, 2, 16, device=dev)        # 6 pages of 4 slots
        # rows 2, 4, 5: pages 9, 6 (= num_blocks) and -1 in use; row 3: page -1 unused
        table = torch.tensor([[0, 1], [2, 3], [4, 9], [5, -1], [6, 0], [1, -1]], device=dev)
        seqlens = torch.tensor([5, 8, 7, 3, 2, 6], device=dev)
        bad, good = [2, 4, 5], [0, 1, 3]
    else:
        k, v = T(5, 8, 2, 16, device=dev), T(5, 8, 2, 16, device=dev)
        table = None
        seqlens = torch.tensor([5, 9, -1, 8, 2**32 + 3], device=dev)
        bad, good = [1, 2, 4], [0, 3]
    for splits in (1, 3):
        y = kernels.decode_attention(q, k, v, seqlens, block_table=table, num_splits=splits, validate=False)
        assert bool(y[bad].isnan().all()), splits
        fixed_lens = seqlens.clone()
        fixed_lens[bad] = 1
        fixed_table = None
        if paged:
            fixed_table = table.clone()
            fixed_table[bad] = 0
        ref = kernels.decode_attention(q, k, v, fixed_lens, block_table=fixed_table, num_splits=splits)
        assert torch.equal(y[good], ref[good]), splits


@pytest.mark.op("decode_attention")
def test_decode_unvalidated_bad_page_of_a_one_page_cache_reads_nothing(dev):
    """A bad page index must not be replaced by another page that may not exist: with one page,
    page 1 lies past the cache (the interpreter's out-of-bounds guard would catch the read)."""
    q, k, v = T(2, 2, 16, device=dev), T(1, 4, 1, 16, device=dev), T(1, 4, 1, 16, device=dev)
    table = torch.tensor([[0, 5], [0, 0]], device=dev)
    y = kernels.decode_attention(q, k, v, torch.tensor([6, 3], device=dev), block_table=table, validate=False)
    assert bool(y[0].isnan().all())
    ref = kernels.decode_attention(q[1:], k, v, torch.tensor([3], device=dev), block_table=table[1:])
    assert torch.equal(y[1:], ref)


@pytest.mark.op("rope")
def test_rope_refuses_more_head_blocks_than_a_grid_holds(dev):
    """65536 heads of 4096 (one head a program) would not launch (the grid's y limit): a clear error
    naming the tensor, from every launcher of rope.py's head-block grids."""
    x = torch.zeros(1, 1, 1, 4096, device=dev).expand(1, 1, 65536, 4096)
    pos = torch.zeros(1, 1, dtype=torch.int64, device=dev)
    with pytest.raises(ValueError, match="x: 65536 heads of 4096 need 65536 programs a token"):
        kernels.rope(x, pos)
    with pytest.raises(ValueError, match="x: 65536 heads of 4096"):
        kernels.rmsnorm_rope_backward(x, x, torch.ones(4096, device=dev), pos)
    with pytest.raises(ValueError, match="dy: 65536 heads of 4096"):
        kernels.rope_backward(x, pos)


@pytest.mark.op("decoder")          # rope_into_cache's tests are the decoder's (tests/test_rope_into_cache.py)
def test_rope_into_cache_refuses_more_head_blocks_than_a_grid_holds(dev):
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    qkv = torch.empty(1, 65536 * 4096, dtype=torch.float16, device=dev)        # never written nor read
    k_cache, v_cache = (torch.empty(1, 1, 21845, 4096, dtype=torch.float16, device=dev) for _ in range(2))
    with pytest.raises(ValueError, match="qkv: 65536 heads of 4096"):
        kernels.rope_into_cache(qkv, pos, k_cache, v_cache, 65536 - 2 * 21845)


@pytest.mark.op("flash_attention")
def test_flash_attention_refuses_more_sequences_than_a_grid_holds(dev):
    """65536 varlen sequences would not launch (the grid's z limit): a clear error, not a CUDA one."""
    q = torch.zeros(65536, 1, 16, device=dev)
    cu = torch.arange(65537, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="cu_seqlens_q: at most 65535 sequences"):
        kernels.flash_attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu)


# validate=True / "deferred" / False: the kernels check lengths, pages and ids themselves ----------

@pytest.fixture(autouse=True)
def _no_deferred_error_left_behind():
    """A test that leaves a deferred error would make a later validating call of this worker raise."""
    yield
    try:
        kernels.raise_deferred_errors()
    except ValueError as e:
        pytest.fail(f"a deferred error was left unread: {e}")


def _bad_calls(d):
    """(launcher, argument, call(validate, out) -> outputs, out shapes, bad rows), each with
    one bad length, page index or id; out: the output buffers, passed as out= (and lse_out=)."""
    q2, k2 = T(2, 4, 16, device=d), T(2, 8, 2, 16, device=d)
    pool = T(4, 4, 2, 16, device=d)
    mla_paged = dict(c_kv=T(4, 4, 8, device=d), k_pe=T(4, 4, 4, device=d),
                     page_table=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device=d))
    mla_args = dict(q_nope=T(2, 1, 2, 8, device=d), q_pe=T(2, 1, 2, 4, device=d), softmax_scale=0.3)
    mla_cache = dict(c_kv=T(2, 6, 8, device=d), k_pe=T(2, 6, 4, device=d))
    table, ids = T(5, 8, device=d), torch.tensor([0, 5, 1, -2], device=d)
    mla = ((2, 1, 2, 8), (2, 1, 2))

    def mla_call(cache, lens):
        return lambda v, out: kernels.mla_decode(**mla_args, **cache, lens=torch.tensor(lens, device=d), validate=v,
                                                 out=out[0], lse_out=out[1])

    return [
        ("mla_decode", "lens", mla_call(mla_cache, [7, 1]), mla, [0]),
        ("mla_decode", "lens", mla_call(mla_cache, [6, -1]), mla, [1]),
        ("mla_decode", "page_table", mla_call(mla_paged, [3, 5]), mla, [1]),
        ("decode_attention", "seqlens", lambda v, out: (kernels.decode_attention(
            q2, k2, k2, torch.tensor([1, 9], device=d), validate=v, out=out[0]),), ((2, 4, 16),), [1]),
        ("decode_attention", "block_table", lambda v, out: (kernels.decode_attention(
            q2, pool, pool, torch.tensor([3, 8], device=d), block_table=torch.tensor([[0, 1], [2, 4]], device=d),
            validate=v, out=out[0]),), ((2, 4, 16),), [1]),
        ("embedding", "ids", lambda v, out: (kernels.embedding(ids, table, validate=v, out=out[0]),), ((4, 8),), [1, 3]),
    ]


def _bad_params():
    return [pytest.param(i, id=f"{c[0]}-{c[1]}-{i}", marks=pytest.mark.op(c[0])) for i, c in enumerate(_bad_calls("cpu"))]


def _run(d, i, validate):
    launcher, arg, call, shapes, bad = _bad_calls(d)[i]
    out = [torch.zeros(s, device=d) for s in shapes]
    return launcher, arg, call, out, bad


def _nan_rows_exactly(out, bad):
    for o in out:
        rows = o.reshape(o.shape[0], -1).isnan().all(1) if o.dim() > 1 else o.isnan()
        assert rows.tolist() == [r in bad for r in range(o.shape[0])], (rows, bad)


@pytest.mark.parametrize("i", _bad_params())
def test_validated_bad_index_raises_at_the_call_naming_the_argument(i, dev):
    """validate=True: the kernel's error word, read once after the launch, gives a ValueError naming
    the argument with its min and max (computed on that path only); out holds NaN rows by then."""
    launcher, arg, call, out, bad = _run(dev, i, True)
    with pytest.raises(ValueError, match=f"^{arg}: expected .*(got min|\\(min)") as info:
        call(True, out)
    assert "deferred" not in str(info.value)
    _nan_rows_exactly(out, bad)


@pytest.mark.parametrize("i", _bad_params())
def test_deferred_bad_index_raises_at_raise_deferred_errors(i, dev):
    """validate="deferred": no error at the call (no host sync), NaN rows; the error, naming the
    argument and the launcher, at kernels.raise_deferred_errors(), and only once."""
    launcher, arg, call, out, bad = _run(dev, i, "deferred")
    call("deferred", out)
    _nan_rows_exactly(out, bad)
    with pytest.raises(ValueError, match=f'^{arg}: expected .* an earlier {launcher} call with validate="deferred"'):
        kernels.raise_deferred_errors()
    kernels.raise_deferred_errors()


@pytest.mark.parametrize("i", _bad_params())
def test_deferred_bad_index_raises_at_a_later_validating_call(i, dev):
    """The error of a deferred call is raised by a later call of any validating launcher (True or
    "deferred") once its batch has landed: on the CPU the next one; on a GPU, after a pause of
    _BATCH_SECONDS, the first (which sends the open batch and reads it if the idle GPU has copied
    it already) or the second (the first's own read of its word waited for that copy).
    validate=False calls never look."""
    from kernels._launch import _BATCH_SECONDS
    launcher, arg, call, out, bad = _run(dev, i, "deferred")
    call("deferred", out)
    table = T(4, 8, device=dev)
    for _ in range(3):
        kernels.embedding(torch.tensor([1], device=dev), table, validate=False)
    calls = 0
    with pytest.raises(ValueError, match=f"^{arg}: .*{launcher}"):
        while calls < 3:
            if dev != "cpu":
                torch.cuda.synchronize()
                time.sleep(1.5 * _BATCH_SECONDS)
            calls += 1
            kernels.embedding(torch.tensor([1], device=dev), table)
    assert calls == 1 if dev == "cpu" else calls in (1, 2)
    assert torch.equal(kernels.embedding(torch.tensor([1], device=dev), table, validate="deferred")[0], table[1])
    kernels.raise_deferred_errors()


@pytest.mark.parametrize("i", _bad_params())
def test_unvalidated_bad_index_gives_nan_rows_and_no_error(i, dev):
    """validate=False: no error now or later, the same NaN rows; the three modes give the same bits."""
    launcher, arg, call, out, bad = _run(dev, i, False)
    call(False, out)
    _nan_rows_exactly(out, bad)
    kernels.raise_deferred_errors()
    deferred = [torch.zeros_like(o) for o in out]
    call("deferred", deferred)
    with pytest.raises(ValueError):
        kernels.raise_deferred_errors()
    checked = [torch.zeros_like(o) for o in out]
    with pytest.raises(ValueError):
        call(True, checked)
    for a, b, c in zip(out, deferred, checked):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and torch.equal(a.nan_to_num(7.0), c.nan_to_num(7.0))


def test_each_deferred_error_is_raised_once_in_call_order(dev):
    """Two bad deferred calls: the second raises the first's error before launching if that copy
    has landed (always on the CPU); otherwise both are pending and raise_deferred_errors() raises
    the first, counting the second. Either way nothing is raised twice."""
    calls = _bad_calls(dev)
    (_, arg_a, call_a, shapes_a, _), (launcher_b, arg_b, call_b, shapes_b, _) = calls[0], calls[3]
    call_a("deferred", [torch.zeros(s, device=dev) for s in shapes_a])
    try:
        call_b("deferred", [torch.zeros(s, device=dev) for s in shapes_b])
    except ValueError as e:
        assert str(e).startswith(f"{arg_a}:") and "more deferred" not in str(e)
        kernels.raise_deferred_errors()
        return
    with pytest.raises(ValueError, match=f"^{arg_a}: .*\\(1 more deferred check\\(s\\) found bad input too\\)$"):
        kernels.raise_deferred_errors()
    kernels.raise_deferred_errors()


@pytest.mark.op("mla_decode")
def test_a_call_with_nothing_to_compute_still_checks_its_lengths(dev):
    """H = 0 heads: no launch, so validate=True checks lens and the pages on the host."""
    with pytest.raises(ValueError, match="^lens: expected lengths in \\[0, 6\\].*got min 1 max 7"):
        MLA(dev, q_nope=T(2, 1, 0, 8, device=dev), q_pe=T(2, 1, 0, 4, device=dev), lens=torch.tensor([7, 1], device=dev))
    with pytest.raises(ValueError, match="^page_table: expected page indices in \\[0, 4\\).*got min -1 max 2"):
        MLA(dev, paged=True, q_nope=T(2, 1, 0, 8, device=dev), q_pe=T(2, 1, 0, 4, device=dev),
            lens=torch.tensor([3, 5], device=dev))
    assert MLA(dev, q_nope=T(2, 1, 0, 8, device=dev), q_pe=T(2, 1, 0, 4, device=dev), lens=torch.tensor([7, 1], device=dev),
               validate="deferred")[0].numel() == 0


@pytest.mark.parametrize("op,config", [pytest.param(o, "cuda_graph", id=o, marks=pytest.mark.op(o))
                                       for o in ("decode_attention", "mla_decode")])
def test_deferred_errors_of_a_cuda_graph_add_up_across_replays(op, config, backend):
    """Captured, validate=True is refused (naming validate); a captured "deferred" call keeps an
    error word the graph never clears: a bad length in the middle replay of three is raised by
    raise_deferred_errors() after the last (a clean one), once; its rows were NaN in that replay."""
    assert backend.name == "gpu", "a CUDA graph captures CUDA kernels (declared gap interp-no-cuda-graph)"
    dev = backend.device
    lens = torch.tensor([3, 2], dtype=torch.int32, device=dev)
    if op == "decode_attention":
        q, cache = T(2, 4, 16, device=dev), T(2, 8, 2, 16, device=dev)
        out = [torch.empty(2, 4, 16, device=dev)]
        run = lambda v: kernels.decode_attention(q, cache, cache, lens, validate=v, out=out[0])  # noqa: E731
    else:
        q_nope, q_pe, c_kv, k_pe = T(2, 1, 2, 8, device=dev), T(2, 1, 2, 4, device=dev), T(2, 8, 8, device=dev), \
            T(2, 8, 4, device=dev)
        out = [torch.empty(2, 1, 2, 8, device=dev), torch.empty(2, 1, 2, device=dev)]
        run = lambda v: kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.3, validate=v,  # noqa: E731
                                           out=out[0], lse_out=out[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # the warm-up: compiles, and sets up the pool of graph words
        run("deferred")
    torch.cuda.current_stream().wait_stream(side)
    kernels.raise_deferred_errors()
    refused, message = torch.cuda.CUDAGraph(), None
    try:
        with torch.cuda.graph(refused):
            run(True)
    except ValueError as e:
        message = str(e)
    # Destroyed now, not by a later garbage collection that could fall inside another test's
    # capture (a graph's reset during a capture invalidates that capture).
    del refused
    gc.collect()
    assert (message or "").startswith("validate: True reads the error word back"), message
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run("deferred")
    for bad in (False, True, False):
        lens.copy_(torch.tensor([3, 9 if bad else 2], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert bool(out[0][1].isnan().all()) == bad and not out[0][0].isnan().any()
    name = "seqlens" if op == "decode_attention" else "lens"
    with pytest.raises(ValueError, match=f'^{name}: expected lengths in \\[0, 8\\].* an earlier {op} call with validate="deferred"'):
        kernels.raise_deferred_errors()
    kernels.raise_deferred_errors()


@pytest.mark.op("embedding")
def test_deferred_batches_are_clean_when_reused(dev):
    """Deferred calls take the words of a batch in turn, zeroed behind its copy before the batch
    is used again: over more than two batches, each of two bad calls is raised once (by a
    validating call or raise_deferred_errors), and no clean call ever reports a stale error."""
    from kernels._launch import _BATCH
    table = T(4, 8, device=dev)
    good, bad = torch.tensor([1, 2], device=dev), torch.tensor([1, 9], device=dev)
    raised = []
    for i in range(2 * _BATCH + 3):
        for step in (lambda: kernels.embedding(bad if i in (5, _BATCH + 1) else good, table, validate="deferred"),
                     kernels.raise_deferred_errors if i in (5, _BATCH + 1) else (lambda: None)):
            try:
                step()
            except ValueError as e:
                assert str(e) == ("ids: expected ids in [0, 4) (the table's rows), got 1 outside it, in an "
                                  "earlier embedding call with validate=\"deferred\" (the rows it affects are NaN)")
                raised.append(i)
    kernels.raise_deferred_errors()
    assert raised == [5, _BATCH + 1]


@pytest.mark.parametrize("op", [pytest.param(o, marks=pytest.mark.op(o)) for o in ("decode_attention", "mla_decode")])
def test_a_pool_of_no_pages_is_never_read(op, dev):
    """Pools of no pages: every page index of a position in use is bad, and none may be replaced by
    page 0 (there is none); a sequence of length 0 reads nothing and is fine (the interpreter's
    lane guard would catch a read)."""
    lens = torch.tensor([3, 0], device=dev)
    table = torch.tensor([[0, 1], [0, 1]], dtype=torch.int32, device=dev)
    if op == "decode_attention":
        pool = T(0, 4, 2, 16, device=dev)
        out = (kernels.decode_attention(T(2, 4, 16, device=dev), pool, pool, lens, block_table=table, validate=False),)
    else:
        out = kernels.mla_decode(T(2, 2, 2, 16, device=dev), T(2, 2, 2, 4, device=dev), T(0, 4, 16, device=dev),
                                 T(0, 4, 4, device=dev), lens, 0.3, table, validate=False)
    for o in out:
        assert bool(o[0].isnan().all()) and not o[1].isnan().any()
    with pytest.raises(ValueError, match=r"^(block_table|page_table): expected (block|page) indices in \[0, 0\)"):
        if op == "decode_attention":
            kernels.decode_attention(T(2, 4, 16, device=dev), pool, pool, lens, block_table=table)
        else:
            kernels.mla_decode(T(2, 2, 2, 16, device=dev), T(2, 2, 2, 4, device=dev), T(0, 4, 16, device=dev),
                               T(0, 4, 4, device=dev), lens, 0.3, table)

"""FP8 quantization and the scaled FP8 GEMM as a PyTorch user writes them: amax with
x.abs().amax(), the scale amax / fp8_max, (x / scale).clamp(-max, max).to(fp8); and
torch._scaled_mm where it accepts the inputs, else dequantize-then-matmul in the output dtype."""
import torch


def quantize_fp8(x, dtype, granularity="tensor", scale=None):
    fp8_max = torch.finfo(dtype).max
    xf = x.float()
    if scale is None:
        if xf.numel() == 0:
            scale = torch.ones((*x.shape[:-1], 1) if granularity == "row" else (), device=x.device)
        else:
            amax = xf.abs().amax(dim=-1, keepdim=True) if granularity == "row" else xf.abs().amax()
            scale = amax / fp8_max
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (xf / scale).clamp(-fp8_max, fp8_max).to(dtype), scale


def fp8_matmul(a8, b8, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, use_fast_accum=False):
    sa = scale_a.reshape(1, 1) if scale_a.numel() == 1 else scale_a.reshape(-1, 1)
    sb = scale_b.reshape(1, 1) if scale_b.numel() == 1 else scale_b.reshape(1, -1)
    try:
        return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype,
                                use_fast_accum=use_fast_accum)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        # torch._scaled_mm wants contiguous-enough operands, sizes that are multiples of 16, a
        # bias in out_dtype, and per-row scales only on some devices and dtypes.
        a = a8.to(out_dtype) * sa.to(out_dtype)
        b = b8.to(out_dtype) * sb.t().to(out_dtype)
        y = a @ b.t()
        return y if bias is None else y + bias.to(out_dtype)

"""MXFP4 as a PyTorch user writes it with torch ops: blocks of 32 by unflatten, the scale
exponent floor(log2(amax)) - 2 from torch.log2, x / 2^e rounded onto the e2m1 grid one binade at
a time with torch.round (half to even), codes by arithmetic on the rounded values, nibbles packed
with shifts; the decode by a lookup table and exp2."""
import torch

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def quantize_mxfp4(x):
    xf = x.float().unflatten(-1, (-1, 32))
    amax = xf.abs().amax(-1, keepdim=True)
    nonfinite = ~torch.isfinite(xf).all(-1, keepdim=True)
    e = (torch.floor(torch.log2(amax)) - 2).clamp(-127, 127)        # log2(0) = -inf: clamped
    e = torch.where(nonfinite, torch.zeros_like(e), e)
    q = (xf.abs() / torch.exp2(e)).clamp(max=6.0)
    v = torch.where(q < 2, torch.round(q * 2) / 2, torch.where(q < 4, torch.round(q), torch.round(q / 2) * 2))
    mag = torch.where(v <= 2, v * 2, torch.where(v <= 4, v + 2, v / 2 + 4)).to(torch.uint8)
    codes = mag | (torch.signbit(xf).to(torch.uint8) << 3)
    codes = torch.where(nonfinite, torch.zeros_like(codes), codes).flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = torch.where(nonfinite, torch.full_like(e, 255.0), e + 127).squeeze(-1).to(torch.uint8)
    return packed, scales


def dequantize_mxfp4(codes, scales, dtype=torch.bfloat16):
    lut = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), device=codes.device)
    c = codes.long()
    v = torch.stack([lut[c & 15], lut[c >> 4]], dim=-1).flatten(-2).unflatten(-1, (-1, 32))
    s = scales.float()[..., None]
    y = torch.where(s == 255, torch.full_like(v, float("nan")), v * torch.exp2(s - 127))
    return y.flatten(-2).to(dtype)

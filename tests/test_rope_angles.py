"""RoPE's sin and cos, read out directly and held to their own bound.

The rope kernel computes sin and cos itself (kernels/rope.py, _sincos): a float64 reduction to
|r| <= pi/4, then fp32 polynomials. The op's budget covers a whole rotation of inputs of any
size, so a polynomial coefficient off by one part in 720 (an error of 4.5e-7 on cos) or a sign
flipped on the r^9 term (6e-7 on sin) passes it; the mutation run found both. Rotating the unit
pair (1, 0) returns (cos, sin) of the angle themselves, and with rotary_dim 2 the angle is the
position, an integer: 512 consecutive integers cover r in [-pi/4, pi/4] at a spacing of 3e-3, edges
included, and large positions exercise the reduction.

The bound, to first order, for |r| <= pi/4 and u = 2^-24 (fp32's unit roundoff):
- r rounded to fp32: |dr| <= u |r| = 4.7e-8, which moves sin and cos by at most as much;
- the float64 reduction, q * pi/2 with q < 2^25: < 2^25 * 2^-53 * pi/2 = 6e-9;
- the polynomial's correction term (sin: r^3/6 - ..., at most 0.081; cos: r^2/2 - ..., at most
  0.293) comes out of three or four roundings that count (r^2, the outer add and product; the
  inner terms are smaller by powers of r^2): 8u of it for sin (3.9e-8), 3.2u for cos (5.5e-8);
- the final sum's rounding, u |result| <= 6e-8; the series' truncation, < 2e-9.
That is 1.4e-7 for sin and 1.6e-7 for cos; the check allows 2^-22 = 2.4e-7 of both (second-order
terms and fused multiply-adds on the GPU only shrink it). Measured: 5.6e-8 on the interpreter.
"""
import pytest
import torch

import kernels

BOUND = 2.0 ** -22               # 2.4e-7: see the docstring


@pytest.mark.op("rope")
def test_rope_sin_and_cos_within_their_rounding_bound(backend):
    dev = backend.device
    positions = torch.cat([torch.arange(512), 2 ** 24 + torch.arange(256), 10 ** 6 + torch.arange(256)])
    T = positions.numel()
    x = torch.zeros(1, T, 1, 2, dtype=torch.float32)
    x[..., 0] = 1.0
    y = kernels.rope(x.to(dev), positions.view(1, T).to(dev), theta=10000.0, rotary_dim=2).cpu().double()
    angle = positions.double()
    for name, got, want in (("cos", y[0, :, 0, 0], torch.cos(angle)), ("sin", y[0, :, 0, 1], torch.sin(angle))):
        err = (got - want).abs()
        worst = int(err.argmax())
        assert err[worst] <= BOUND, (
            f"rope's {name} of angle {positions[worst].item()} (rad) is {got[worst].item():.9g}, the truth "
            f"{want[worst].item():.9g}: error {err[worst].item():.3g} > {BOUND:.3g}, the rounding bound "
            f"of its fp32 polynomials (derived in tests/test_rope_angles.py)")

"""Every fp16 input through bias_gelu: all 65,536 bit patterns (NaN, infinities, subnormals
and the largest finite values included), without and with a bias, in both forms, each one
kernel launch, judged against the float64 oracle under the fp16 budget."""
import pytest
import torch

import kernels
import oracles
from harness.compare import compare


def _all_fp16(device):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    return bits.view(torch.float16).reshape(256, 256).to(device)


@pytest.mark.op("bias_gelu")
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_every_fp16_input(approximate, with_bias, backend, budgets):
    y = _all_fp16(backend.device)
    bias = None
    if with_bias:
        # One bias value per column: the 65,536 inputs meet 256 different shifts.
        bias = (0.5 * torch.randn(256, generator=torch.Generator().manual_seed(0))).to(torch.float16).to(backend.device)
    got = kernels.bias_gelu(y, bias, approximate)
    expected = oracles.bias_gelu(y, bias, approximate)
    budget = budgets.get("bias_gelu", "float16", backend.name)
    verdict = compare("out", got, expected, budget)
    assert verdict.passed, f"{approximate}, bias={with_bias}: {verdict.problem} at {verdict.worst_index}: " \
                           f"got {verdict.worst_got!r}, expected {verdict.worst_expected!r}"
    assert torch.isnan(got).sum() == torch.isnan(y if bias is None else y.float() + bias.float()).sum()

"""The op checks, importable: every registered op, every dtype, random Hypothesis cases and the
pinned catalogue, each judged against the float64 oracle under the op's budget (harness/run.py).

tests/test_ops.py collects them in this repository; `kernelcheck` (harness/cli.py) runs them
from anywhere, with the plugin, against the suite's kernels or an --impl.
"""
import pytest
from hypothesis import given, strategies as st

from harness import registry, strategies
from harness.params import pinned_params, random_params


@pytest.mark.parametrize("op,dtype,config,part", random_params(registry.OPS, strategies.random_parts()))
@given(data=st.data())
def test_random(op, dtype, config, part, data, check):
    check(data.draw(registry.get(op).cases(dtype, strategies.size(), config), label="case"))


@pytest.mark.parametrize("case", pinned_params(registry.OPS))
def test_pinned(case, check):
    check(case)

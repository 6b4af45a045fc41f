"""Every registered op, every dtype: random Hypothesis cases and the pinned catalogue cases,
each judged against the float64 oracle under the op's budget (see harness/run.py). The tests
live in harness/battery.py, so that `kernelcheck` runs them from another repository too."""
from harness.battery import test_pinned, test_random  # noqa: F401  (collected here)

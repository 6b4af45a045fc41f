"""`kernelcheck`: the op checks (harness/battery.py) from any directory, e.g. another repository
that checks its own kernel:

    kernelcheck --impl rmsnorm=mypkg.ops:rmsnorm -n auto [any pytest or kernelcheck option]

It is `python -m pytest -p harness.plugin --pyargs harness.battery ...` with the suite's pytest
settings (strict xfails for declared gaps, the interpreter's expected NumPy warnings ignored).
"""
from __future__ import annotations

import sys

SETTINGS = ["-o", "xfail_strict=true", "-o", "junit_family=xunit1",
            "-W", "ignore::RuntimeWarning:triton.runtime.interpreter",
            "-W", "ignore::RuntimeWarning:numpy._core.fromnumeric"]


def main(argv=None) -> int:
    import pytest

    args = list(sys.argv[1:] if argv is None else argv)
    return int(pytest.main(["-p", "harness.plugin", *SETTINGS, "--pyargs", "harness.battery", *args]))


if __name__ == "__main__":
    sys.exit(main())

"""Replay one case outside pytest: `python -m harness.replay '<case json>'`.

Every failure message ends with this command. It rebuilds the same inputs from the case's
seed, runs kernel, reference and oracle on the current backend, and prints the comparison.
Exit code 0 when every output is within budget, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys

from harness import backend as backends, budgets as budget_file
from harness.cases import Case
from harness.plugin import ROOT


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.replay", description=__doc__.splitlines()[0])
    parser.add_argument("case", help="the case as JSON, as printed in a failure message")
    parser.add_argument("--backend", default="auto", choices=backends.BACKENDS)
    parser.add_argument("--tolerances", default=str(budget_file.default_path()))
    parser.add_argument("--impl", default=None, help="the implementation checked instead of the kernel (as given to pytest)")
    args = parser.parse_args(argv)

    chosen = backends.select(args.backend)
    if chosen.name == "interpreter":
        from harness import interp_compat, interp_speed, oob_guard
        oob_guard.install()
        interp_compat.install()
        interp_speed.install()
    from harness.run import describe, run_case

    case = Case.from_json(args.case)
    impl = None
    if args.impl:
        from harness import impls
        impl = impls.parse([args.impl]).get(case.op)
        if impl is None:
            parser.error(f"--impl {args.impl}: no implementation of {case.op}")
    outcome = run_case(case, chosen, budget_file.load(args.tolerances), impl)
    print(f"{case.id} on {chosen.key}")
    for c in outcome.checks:
        if c.passed:
            print(f"  output '{c.output}': ok, max abs {c.max_abs_err:.4g}, max rel {c.max_rel_err:.4g}, "
                  f"error/allowed {c.usage:.3g} ({outcome.budget.describe()})")
        else:
            print(describe(outcome, c))
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())

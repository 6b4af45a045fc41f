"""Load and validate `tolerances.toml`: one budget per registered op and dtype.

Layout of the file:

    [rmsnorm.float16]              # op name, then dtype
    atol = 1e-5                    # |y - o| <= atol + rtol * |o|, elementwise
    rtol = 1e-3
    ref_ratio = 2.0                # optional: max|y - o| <= ref_ratio * max|r - o| + ref_floor
    ref_floor = 1e-4               # required with ref_ratio
    bound_rtol = 1e-5              # optional: + bound_rtol * M, M a rounding bound the op computes
    reason = "why these numbers (measured how)"

    [rmsnorm.bfloat16.interpreter] # optional override for one backend ("interpreter" or "gpu")
    rtol = 1.2e-2
    reason = "why this backend differs"

    [fp8_matmul.bfloat16.sqnr]     # optional, FP8 / MXFP4 ops: SQNR floors in dB per format
    e4m3fn = 25.0                  # end to end (quantize + op) against the unquantized float64
    e5m2 = 19.0                    # result; a backend override keeps them
    reason = "measured how"

The regression gate (`--baseline`, harness/baseline.py) reads two top-level settings, which
must stand before the first table, and one per-op override:

    baseline_growth = 2.0          # a case group's worst error/allowed may grow this much (>= 1)
    baseline_floor = 0.01          # error/allowed below this counts as this (0 <= floor < 1)

    [softmax]
    baseline_growth = 3.0          # this op's own growth limit

Any unknown op, dtype or key, a missing budget, or a value that is not a finite number >= 0
is an error that names the file, the table and the key.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path


def default_path() -> Path:
    """The budgets file: tolerances.toml at the repository root (a clone, an editable install),
    else the copy a built package carries inside harness/ (setup.py puts it there)."""
    here = Path(__file__).resolve().parent
    for path in (here.parent / "tolerances.toml", here / "tolerances.toml"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"no tolerances.toml next to {here} or in it: a broken install of kernelcheck")

from harness import registry

NUMBER_KEYS = ("atol", "rtol", "ref_ratio", "ref_floor", "bound_rtol")
BACKEND_TABLES = ("interpreter", "gpu")
GATE_KEYS = ("baseline_growth", "baseline_floor")   # top-level settings of the regression gate
OP_KEYS = ("baseline_growth",)                       # keys an [op] table may hold beside its dtypes
DEFAULT_GROWTH = 2.0
DEFAULT_FLOOR = 0.01
SQNR_TABLE = "sqnr"
SQNR_FORMATS = ("e4m3fn", "e5m2", "e2m1")   # e2m1: MXFP4's elements


class BudgetError(ValueError):
    pass


@dataclass(frozen=True)
class Budget:
    atol: float
    rtol: float
    reason: str
    table: str                     # e.g. "rmsnorm.float16" or "rmsnorm.bfloat16.interpreter"
    ref_ratio: float | None = None
    ref_floor: float = 0.0
    bound_rtol: float = 0.0        # relative to a rounding bound the op computes (Op.error_scale, Magnitudes.bound)
    sqnr_db: tuple = ()            # ((fp8 format, floor in dB), ...)
    sqnr_reason: str = ""

    def sqnr_floor(self, fmt: str) -> float:
        floors = dict(self.sqnr_db)
        if fmt not in floors:
            raise KeyError(f"[{self.table}] has no SQNR floor for {fmt!r} (a [{self.table}.sqnr] key)")
        return floors[fmt]

    def describe(self) -> str:
        s = f"atol {self.atol:g}, rtol {self.rtol:g}"
        if self.bound_rtol:
            s += f", bound_rtol {self.bound_rtol:g}"
        if self.ref_ratio is not None:
            s += f", ref_ratio {self.ref_ratio:g} (+{self.ref_floor:g})"
        return s

    def as_record(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "ref_ratio": self.ref_ratio,
                "ref_floor": self.ref_floor, "bound_rtol": self.bound_rtol, "budget_table": self.table}


def _number(path, table, key, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetError(f"{path}: [{table}] key '{key}': expected a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise BudgetError(f"{path}: [{table}] key '{key}': expected a finite number >= 0, got {value!r}")
    return value


def _fields(path, table, body: dict, *, allow_backends: bool, required: tuple) -> dict:
    allowed = (*NUMBER_KEYS, "reason", *((*BACKEND_TABLES, SQNR_TABLE) if allow_backends else ()))
    for key in body:
        if key not in allowed:
            raise BudgetError(f"{path}: [{table}] key '{key}': unknown key; expected one of {', '.join(allowed)}")
    for key in required:
        if key not in body:
            raise BudgetError(f"{path}: [{table}] key '{key}': missing")
    out = {k: _number(path, table, k, body[k]) for k in NUMBER_KEYS if k in body}
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise BudgetError(f"{path}: [{table}] key 'reason': expected a non-empty string, got {reason!r}")
    out["reason"] = reason.strip()
    return out


def _sqnr(path, table, body) -> tuple[tuple, str]:
    """The optional [op.dtype.sqnr] table: a floor in dB per fp8 format, and its reason."""
    if body is None:
        return (), ""
    table = f"{table}.{SQNR_TABLE}"
    if not isinstance(body, dict):
        raise BudgetError(f"{path}: [{table}]: expected a table")
    for key in body:
        if key not in (*SQNR_FORMATS, "reason"):
            raise BudgetError(f"{path}: [{table}] key '{key}': unknown key; expected one of "
                              f"{', '.join(SQNR_FORMATS)}, reason")
    floors = tuple((k, _number(path, table, k, body[k])) for k in SQNR_FORMATS if k in body)
    if not floors:
        raise BudgetError(f"{path}: [{table}]: expected a floor for at least one of {', '.join(SQNR_FORMATS)}")
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise BudgetError(f"{path}: [{table}] key 'reason': expected a non-empty string, got {reason!r}")
    return floors, reason.strip()


def _budget(path, table, fields: dict, sqnr=((), "")) -> Budget:
    if ("ref_ratio" in fields) != ("ref_floor" in fields):
        raise BudgetError(f"{path}: [{table}] keys 'ref_ratio' and 'ref_floor': give both or neither")
    return Budget(atol=fields["atol"], rtol=fields["rtol"], reason=fields["reason"], table=table,
                  ref_ratio=fields.get("ref_ratio"), ref_floor=fields.get("ref_floor", 0.0),
                  bound_rtol=fields.get("bound_rtol", 0.0), sqnr_db=sqnr[0], sqnr_reason=sqnr[1])


class Budgets:
    """Validated budgets: `budgets.get(op, dtype, backend_name)`, and the gate's settings."""

    def __init__(self, path: Path, base: dict, overrides: dict, growth: float = DEFAULT_GROWTH,
                 floor: float = DEFAULT_FLOOR, op_growth: dict | None = None):
        self.path = path
        self._base = base            # (op, dtype) -> Budget
        self._overrides = overrides  # (op, dtype, backend) -> Budget
        self.floor = floor           # baseline_floor
        self._growth = growth        # baseline_growth
        self._op_growth = op_growth or {}

    def growth(self, op: str) -> float:
        """How far a case group's worst error/allowed may grow over its baseline (per op)."""
        return self._op_growth.get(op, self._growth)

    def get(self, op: str, dtype: str, backend: str) -> Budget:
        try:
            return self._overrides.get((op, dtype, backend)) or self._base[(op, dtype)]
        except KeyError:
            raise KeyError(f"{self.path}: no budget for [{op}.{dtype}]") from None

    def items(self):
        return self._base.items()


def load(path: str | Path, op_dtypes: dict | None = None) -> Budgets:
    """Parse and validate; `op_dtypes` maps op name -> dtypes (the registry's by default)."""
    path = Path(path)
    if op_dtypes is None:
        op_dtypes = {op: registry.dtypes(op) for op in registry.OPS}
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise BudgetError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise BudgetError(f"{path}: not valid TOML: {e}") from None

    base, overrides, gate, op_growth = {}, {}, {}, {}
    for op, op_table in data.items():
        if op in GATE_KEYS:
            gate[op] = _gate_number(path, "top level", op, op_table)
            continue
        if op not in op_dtypes:
            raise BudgetError(f"{path}: [{op}]: unknown op; registered ops: {', '.join(op_dtypes)}")
        if not isinstance(op_table, dict):
            raise BudgetError(f"{path}: [{op}]: expected a table of dtypes, got {op_table!r}")
        for dtype, body in op_table.items():
            if dtype in OP_KEYS:
                op_growth[op] = _gate_number(path, f"[{op}]", dtype, body)
                continue
            table = f"{op}.{dtype}"
            if dtype not in op_dtypes[op]:
                raise BudgetError(f"{path}: [{table}]: {op} is not checked in dtype '{dtype}'; "
                                  f"expected one of {', '.join(op_dtypes[op])}")
            if not isinstance(body, dict):
                raise BudgetError(f"{path}: [{table}]: expected a table, got {body!r}")
            fields = _fields(path, table, body, allow_backends=True, required=("atol", "rtol", "reason"))
            sqnr = _sqnr(path, table, body.get(SQNR_TABLE))
            budget = base[(op, dtype)] = _budget(path, table, fields, sqnr)
            for backend in BACKEND_TABLES:
                if backend in body:
                    sub_table = f"{table}.{backend}"
                    if not isinstance(body[backend], dict):
                        raise BudgetError(f"{path}: [{sub_table}]: expected a table")
                    sub = _fields(path, sub_table, body[backend], allow_backends=False, required=())
                    merged = {k: getattr(budget, k) for k in NUMBER_KEYS if getattr(budget, k) is not None}
                    if budget.ref_ratio is None:
                        merged.pop("ref_floor", None)
                    merged.update(sub)
                    overrides[(op, dtype, backend)] = _budget(path, sub_table, merged, sqnr)
    for op, dts in op_dtypes.items():
        for dtype in dts:
            if (op, dtype) not in base:
                raise BudgetError(f"{path}: [{op}.{dtype}]: missing; every registered op and dtype needs a budget")
    return Budgets(path, base, overrides, growth=gate.get("baseline_growth", DEFAULT_GROWTH),
                   floor=gate.get("baseline_floor", DEFAULT_FLOOR), op_growth=op_growth)


def _gate_number(path, where, key, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BudgetError(f"{path}: {where} key '{key}': expected a finite number, got {value!r}")
    value = float(value)
    if key == "baseline_growth" and value < 1:
        raise BudgetError(f"{path}: {where} key '{key}': expected a factor >= 1, got {value!r}")
    if key == "baseline_floor" and not 0 <= value < 1:
        raise BudgetError(f"{path}: {where} key '{key}': expected 0 <= floor < 1 (a fraction of the budget), "
                          f"got {value!r}")
    return value

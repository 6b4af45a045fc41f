"""A case: everything needed to rebuild one check's inputs bit for bit, and to replay it.

Inputs come from a seeded torch.Generator on the CPU (so a case is the same on every machine
and backend), drawn in a value regime from the adversarial catalogue, and laid out in memory
as the case's layout says (transposed, sliced, broadcast, misaligned...).
"""
from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict, dataclass, field

import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Layouts of an input tensor (its logical shape never changes):
LAYOUTS = (
    "contiguous",
    "transposed",  # storage has the last two dims swapped: the feature dim has a stride > 1
    "permuted",    # storage has the leading dims reversed: rows cannot be walked with one stride
    "sliced",      # every other entry of dim 0, and columns 1..D of a D+3 wide storage
    "broadcast",   # dim 0 is an expand()ed stride-0 dim
    "offset",      # storage starts one element in: the data pointer is not 16-byte aligned
    "bhtd",        # 4-d [B, T, H, D] stored as [B, H, T, D] (attention's head-major layout)
)

# Value regimes (per row = along the last dim):
REGIMES = (
    "normal",      # N(0, 1)
    "large",       # N(0, 1) * LARGE[dtype]: fp16 squares overflow unless accumulated in fp32
    "tiny",        # N(0, 1) * TINY[dtype]: subnormals of the dtype
    "small",       # N(0, 1) * 1e-3: mean squares near a typical eps, where eps matters
    "constant",    # each row one value (zero variance)
    "offset",      # 1000 + N(0, 1): mean far from zero
    "outlier",     # N(0, 1) with one entry per row at +-1000
    "nonfinite",   # N(0, 1) with a few NaN, +inf, -inf
    "neginf",      # 3 N(0, 1) with a quarter of entries -inf and the first row all -inf
    "zero",        # all zeros (AdamW: zero gradients)
    "zero_rows",   # N(0, 1) with every other row (0, 2, ...) zero (upstream gradients that skip rows)
)
LARGE = {"float32": 1e15, "bfloat16": 1e15, "float16": 1e4}
TINY = {"float32": 1e-39, "bfloat16": 1e-39, "float16": 1e-6}


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    shape: tuple
    layout: str = "contiguous"
    values: str = "normal"
    seed: int = 0
    config: str = "auto"              # kernel configuration: "auto" or an op-defined name
    params: tuple = field(default=())  # sorted (name, value) pairs: eps, theta, style, ...

    @classmethod
    def make(cls, op, dtype, shape, *, layout="contiguous", values="normal", seed=0, config="auto", **params):
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        if values not in REGIMES:
            raise ValueError(f"values: expected one of {REGIMES}, got {values!r}")
        return cls(op, dtype, tuple(int(s) for s in shape), layout, values, int(seed), config,
                   tuple(sorted(params.items())))

    def param(self, name, default=None):
        return dict(self.params).get(name, default)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @property
    def id(self) -> str:
        parts = [self.op, self.dtype, "x".join(map(str, self.shape)) or "scalar", self.layout, self.values,
                 f"s{self.seed}"]
        if self.config != "auto":
            parts.append(self.config)
        parts += [f"{k}={v}" for k, v in self.params]
        return "-".join(parts)

    def to_json(self) -> str:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["params"] = dict(self.params)
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Case":
        d = json.loads(text)
        params = d.pop("params", {})
        return cls.make(**d, **params)

    def replay_command(self, tolerances=None, impl=None) -> str:
        """The command that replays this case; `tolerances`: a budgets file other than the default;
        `impl`: the --impl that was checked instead of the suite's kernel."""
        extra = f" --tolerances {shlex.quote(str(tolerances))}" if tolerances else ""
        extra += f" --impl {shlex.quote(impl)}" if impl else ""
        return f"python -m harness.replay '{self.to_json()}'{extra}"

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


def sample(shape, regime: str, dtype: str, gen: torch.Generator) -> torch.Tensor:
    """float64 values of `shape` in a value regime (before rounding to `dtype`)."""
    shape = tuple(shape)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if x.numel() == 0 or regime == "normal":
        return x
    D = shape[-1] if shape else 1
    rows = x.reshape(-1, D)
    if regime == "large":
        return (x * LARGE[dtype]).clamp(-4 * LARGE[dtype], 4 * LARGE[dtype])
    if regime == "tiny":
        return x * TINY[dtype]
    if regime == "small":
        return x * 1e-3
    if regime == "constant":
        value = 100 + 10 * torch.randn(rows.shape[0], 1, generator=gen, dtype=torch.float64)
        return value.expand_as(rows).reshape(shape).clone()
    if regime == "offset":
        return x + 1000
    if regime == "outlier":
        col = torch.randint(0, D, (rows.shape[0],), generator=gen)
        sign = torch.randint(0, 2, (rows.shape[0],), generator=gen).double() * 2 - 1
        rows[torch.arange(rows.shape[0]), col] = 1000 * sign
        return x
    if regime == "nonfinite":
        flat = x.view(-1)
        n = max(3, flat.numel() // 50)
        idx = torch.randperm(flat.numel(), generator=gen)[:n]
        specials = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64)
        flat[idx] = specials[torch.arange(idx.numel()) % 3]
        return x
    if regime == "zero":
        return torch.zeros_like(x)
    if regime == "zero_rows":
        rows[0::2] = 0
        return x
    if regime == "neginf":
        x = 3 * x
        x[torch.rand(shape, generator=gen) < 0.25] = -math.inf
        x.view(-1, D)[0] = -math.inf
        return x
    raise ValueError(f"unknown value regime {regime!r}")


def lay_out(values: torch.Tensor, shape, layout: str, device) -> torch.Tensor:
    """A tensor equal to `values` (broadcast to `shape`) stored in `layout` on `device`."""
    shape = tuple(shape)
    nd = len(shape)
    if layout == "contiguous" or (layout in ("transposed", "broadcast") and nd < 2) or \
            (layout == "permuted" and nd < 3) or (layout == "bhtd" and nd != 4):
        return values.expand(shape).contiguous().to(device)
    if layout == "transposed":
        return values.transpose(-1, -2).contiguous().to(device).transpose(-1, -2)
    if layout == "bhtd":
        return values.transpose(1, 2).contiguous().to(device).transpose(1, 2)
    if layout == "permuted":
        order = list(range(nd - 2, -1, -1)) + [nd - 1]           # leading dims reversed
        inverse = [order.index(i) for i in range(nd)]
        return values.permute(order).contiguous().to(device).permute(inverse)
    if layout == "sliced":
        big_shape = (2 * shape[0], *shape[1:-1], shape[-1] + 3) if nd >= 2 else (shape[0] + 3,)
        storage = torch.full(big_shape, math.nan, dtype=values.dtype)   # NaN where nothing may read
        if nd >= 2:
            storage[0::2, ..., 1:shape[-1] + 1] = values
            return storage.to(device)[0::2, ..., 1:shape[-1] + 1]
        storage[1:shape[0] + 1] = values
        return storage.to(device)[1:shape[0] + 1]
    if layout == "broadcast":
        return values[:1].contiguous().to(device).expand(shape)
    if layout == "offset":
        flat = torch.empty(values.numel() + 1, dtype=values.dtype)
        flat[1:] = values.reshape(-1)
        return flat.to(device)[1:].view(shape)
    raise ValueError(f"unknown layout {layout!r}")


def make_input(shape, dtype: str, gen: torch.Generator, device, *, values="normal",
               layout="contiguous") -> torch.Tensor:
    """An input of `shape` in `dtype`, drawn in a value regime and stored in a layout."""
    gen_shape = list(shape)
    if layout == "broadcast" and len(shape) >= 2:
        gen_shape[0] = 1        # a stride-0 dim repeats one slice
    v = sample(gen_shape, values, dtype, gen).to(TORCH_DTYPES[dtype])
    return lay_out(v, shape, layout, device)


def make_param(shape, dtype: str, gen: torch.Generator, device, *, mean=0.0, std=1.0,
               strided=False) -> torch.Tensor:
    """A weight or bias: mean + std * N(0, 1), contiguous, or every other element of a
    twice-as-long storage when `strided`."""
    v = (mean + std * torch.randn(tuple(shape), generator=gen, dtype=torch.float64)).to(TORCH_DTYPES[dtype])
    if not strided:
        return v.to(device)
    storage = torch.full((2 * v.numel(),), math.nan, dtype=v.dtype)
    storage[0::2] = v.reshape(-1)
    return storage.to(device)[0::2].view(shape)


# Value regimes of the upstream gradient dy of a backward op (its case param "grad"; the case's
# value regime stays the forward input's).
GRAD_REGIMES = ("normal", "zero_rows", "large", "nonfinite")

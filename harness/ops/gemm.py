"""matmul, swiglu and swiglu_backward: cases, and how to call kernel / reference / oracle.

A case's shape is (*leading dims of a, N, K): a is [*lead, K], the weights [N, K]. The case's
value regime applies to a (the activations flowing in); weights are N(0, 1) unless the
`w_values` param says otherwise. The layout applies to a and to the weights alike
("transposed" stores a weight as [K, N], as a transposed checkpoint would).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import GRAD_REGIMES, Case, make_input, make_param
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import layouts, lead_shapes, regimes, seeds
from oracles._torch import f64, one_thread
from oracles.gemm import activate, activation_slope, linear

GEMM_REGIMES = ("normal", "large", "tiny", "small", "constant", "offset", "outlier", "nonfinite")
ACTIVATIONS = ("none", "gelu", "gelu_tanh", "silu", "relu")
GATED_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
TILE = 16    # the "small" config's tiles: short cases still cross several tiles in M, N and K
# Per case at most this many multiply-adds (the float64 oracle forms every product).
MAX_MACS = {"small": 1 << 17, "large": 1 << 26}
MAX_ROWS = {"small": 40, "large": 2048}


def _abs_linear(x, w, b):
    """sum_k |x_k| |w_k| + |b| in float64, on the inputs' device: the magnitude a dot product's
    rounding error is relative to."""
    return linear(f64(x).abs(), f64(w).abs(), None if b is None else f64(b).abs())


def _dims(size):
    if size == "small":
        return st.one_of(st.integers(1, 70), st.sampled_from((96, 127, 128, 129)))
    return st.one_of(st.integers(1, 1100), st.sampled_from((127, 128, 129, 255, 256, 257, 1000, 1001, 4096)))


class GemmOp(Op):
    configs = {"auto": {}, "small": {"block_m": TILE, "block_n": TILE, "block_k": TILE}}
    activations = ACTIVATIONS
    default_activation = "none"
    nonfinite_weights = True
    tma_params: dict = {}       # params that send a contiguous 16-bit case down the TMA path
    grads = False               # swiglu_backward: biases always, and an upstream gradient regime
    grad_regimes = GRAD_REGIMES

    def grad_choices(self, values):
        return self.grad_regimes

    def _operands(self, case, device, n_weights):
        gen = case.generator()
        *lead, N, K = case.shape
        a = make_input((*lead, K), case.dtype, gen, device, values=case.values, layout=case.layout)
        ws = [make_input((N, K), case.dtype, gen, device, values=case.param("w_values", "normal"), layout=case.layout)
              for _ in range(n_weights)]
        bias_std = 2.0**17 if case.param("bias_values", "normal") == "large" else 1.0
        bs = [make_param((N,), case.dtype, gen, device, std=bias_std, strided=case.layout == "sliced")
              if case.param("bias", False) else None for _ in range(n_weights)]
        return a, ws, bs

    def output_shapes(self, inp):
        x = inp["a"] if "a" in inp else inp["x"]
        w = inp["w"] if "w" in inp else inp["w_gate"]
        return {"y": (*x.shape[:-1], w.shape[0])}

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            N, K = draw(_dims(size)), draw(_dims(size))
            rows = max(1, min(MAX_ROWS[size], MAX_MACS[size] // (N * K)))
            lead = draw(lead_shapes(rows, max_dims=2))
            params = {"activation": draw(st.sampled_from(self.activations)),
                      "bias": True if self.grads else draw(st.booleans())}
            layout = draw(layouts(exclude=("bhtd",)))
            values, seed = draw(regimes(self.name, dtype, config, GEMM_REGIMES)), draw(seeds())
            params.update(self.extra_params(draw, layout))     # drawn last: earlier draws stay put
            if self.grads:
                params["grad"] = draw(st.sampled_from(self.grad_choices(values)))
            return Case.make(self.name, dtype, (*lead, N, K), layout=layout, values=values, seed=seed,
                             config=config, **params)
        return draw_case()

    def extra_params(self, draw, layout) -> dict:
        return {}

    def pinned(self, dtype):
        acts = self.activations

        def case(shape, seed=0, i=0, **kw):
            kw.setdefault("activation", acts[i % len(acts)])
            kw.setdefault("bias", True)
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        # Tiles of the "small" config +-1 in M, N and K, one dim at a time and all together.
        tiles = [(15, 16, 16), (17, 16, 16), (16, 15, 16), (16, 17, 16), (16, 16, 15), (16, 16, 17),
                 (17, 17, 17), (33, 31, 47)]
        out += [case(s, seed=i, i=i, config="small") for i, s in enumerate(tiles)]
        # 10 row tiles in groups of GROUP_M = 8: a last group of 2 (the grouped tile order's edge).
        out += [case((145, 20, 17), seed=9, config="small")]
        # K = 1, M = 1, one element, odd sizes (1000 x 999 x 1001-like, scaled to the
        # interpreter), a long K on a single row, a batch of leading dims.
        sizes = [(8, 9, 1), (1, 65, 64), (1, 1, 1), (63, 127, 129), (64, 130, 129), (1, 37, 1001), (3, 5, 7, 33)]
        out += [case(s, seed=10 + i, i=i) for i, s in enumerate(sizes)]
        out += [case((37, 45, 51), seed=20, config="small", activation=acts[-1])]
        if dtype != "bfloat16":
            # No tl.dot runs here (K = 0 gives act(bias); M = 0 or N = 0 launch nothing), so the
            # interpreter's bf16 dot gap would report them as unexpected passes.
            out += [case((4, 5, 0), activation=acts[1]), case((0, 8, 16)), case((3, 0, 16))]
        # Every activation with and without bias.
        out += [case((9, 40, 33), seed=30 + j, activation=act, bias=bias)
                for j, act in enumerate(acts) for bias in (False, True)]
        # Layouts of a and the weights: strided rows and columns, stride 0, misaligned.
        out += [case((2, 5, 24, 40), seed=40, i=j, layout=lay)
                for j, lay in enumerate(("transposed", "permuted", "sliced", "broadcast", "offset"))]
        out += [case((12, 24, 40), seed=41, layout="transposed", config="small"),
                case((12, 24, 40), seed=42, layout="sliced", config="small")]
        # Value regimes of a (large: fp16 outputs overflow to inf; nonfinite: NaN and inf
        # propagate through the dot and the activation), and non-finite weights.
        out += [case((8, 24, 65), seed=50 + j, values=v, activation=act)
                for j, v in enumerate(GEMM_REGIMES[1:]) for act in (acts[0], acts[1])]
        if not self.grads:
            # One row (a decode step: the matrix-vector kernel) in the regimes that reach past
            # fp16's range or sit far from zero: a bf16 value read as fp16 would overflow.
            out += [case((1, 40, 300), seed=90 + j, values=v) for j, v in enumerate(("large", "offset", "outlier"))]
            out += [case((1, 40, k), seed=94 + j, values="large", w_values="large")     # weights too; K whole
                    for j, k in enumerate((256, 300))]                                     # tiles and not
            if dtype != "float16":
                out += [case((1, 24, 64), seed=93, bias_values="large", activation=acts[0])]
        if self.nonfinite_weights:
            out += [case((6, 20, 30), seed=60, w_values="nonfinite", activation=act) for act in acts[-2:]]
        if dtype != "float16":
            # A bias beyond fp16's range (~2^17): read as fp16 anywhere on its way, it turns to inf.
            # 40 rows and aligned rows: the TMA path on a GPU for bf16.
            out += [case((40, 24, 64), seed=80, bias_values="large", activation=acts[0], **self.tma_params)]
        return out


class Matmul(GemmOp):
    name = "matmul"

    def inputs(self, case, device):
        a, (w,), (b,) = self._operands(case, device, 1)
        return {"a": a, "w": w, "bias": b, "activation": case.param("activation", self.default_activation)}

    def _args(self, inp):
        return inp["a"], inp["w"], inp["bias"], inp["activation"]

    def kernel(self, inp, out, **config):
        return (kernels.matmul(*self._args(inp), out=out["y"], **config),)

    def reference(self, inp):
        return (references.matmul(*self._args(inp)),)

    def oracle(self, inp):
        return (oracles.matmul(*self._args(inp)),)

    @one_thread
    def error_scale(self, inp, expected):
        """rtol is relative to sum_k |a_k| |w_k| + |bias|, not |y|: the dot product's rounding
        scales with its terms, and y can cancel to far below them. The activations here have
        |act'| <= 1.13 and |act(z)| <= |z|, so this bounds |y| too."""
        return (_abs_linear(inp["a"], inp["w"], inp["bias"]),)


class SwiGLU(GemmOp):
    name = "swiglu"
    activations = GATED_ACTIVATIONS
    default_activation = "silu"
    # An inf in w_up alone meets a finite gate that fp32 rounds to exactly 0 (gelu below
    # z ~ -5.6, silu below ~ -88): 0 * inf is NaN in any fp32 evaluation, while the float64
    # oracle's tiny gate gives inf. Non-finite x is checked (both projections go non-finite).
    nonfinite_weights = False
    tma_params = {"merged": True}

    def extra_params(self, draw, layout) -> dict:
        # merged: the weights are the halves of one [2N, K] tensor; on the GPU separate ones take
        # the TMA path too (kernels/gemm.py _weight_pair).
        return {"merged": draw(st.booleans())} if layout == "contiguous" else {}

    def pinned(self, dtype):
        out = super().pinned(dtype)
        # Merged weights (the TMA path): tiles +-1, odd sizes, a long K, every activation,
        # biases on and off.
        shapes = [(15, 16, 16), (17, 17, 17), (33, 31, 47), (1, 65, 64), (63, 127, 129), (1, 37, 1001),
                  (3, 5, 7, 33)]
        out += [Case.make(self.name, dtype, shape, seed=70 + i, merged=True, bias=i % 2 == 0,
                          activation=self.activations[i % len(self.activations)],
                          config="small" if i < 3 else "auto")
                for i, shape in enumerate(shapes)]
        # A merged [w_up; w_gate] tensor: the TMA path's descriptor starts at w_up (up_first).
        out += [Case.make(self.name, dtype, shape, seed=80 + i, merged="up_gate", bias=i == 0,
                          activation=self.activations[i % len(self.activations)], config=config)
                for i, (shape, config) in enumerate((((33, 40, 64), "small"), ((65, 48, 1024), "auto")))]
        return out

    def inputs(self, case, device):
        x, (wg, wu), (bg, bu) = self._operands(case, device, 2)
        merged, n = case.param("merged", False), wg.shape[0]
        if merged == "up_gate":
            both = torch.cat([wu, wg])          # one [2N, K] tensor, the up rows first
            wg, wu = both[n:], both[:n]
        elif merged:
            both = torch.cat([wg, wu])          # one [2N, K] tensor; the weights are its halves
            wg, wu = both[:n], both[n:]
        return {"x": x, "w_gate": wg, "w_up": wu, "b_gate": bg, "b_up": bu,
                "activation": case.param("activation", self.default_activation)}

    def _args(self, inp):
        return inp["x"], inp["w_gate"], inp["w_up"], inp["b_gate"], inp["b_up"], inp["activation"]

    def kernel(self, inp, out, **config):
        return (kernels.swiglu(*self._args(inp), out=out["y"], **config),)

    def reference(self, inp):
        return (references.swiglu(*self._args(inp)),)

    def oracle(self, inp):
        return (oracles.swiglu(*self._args(inp)),)

    @one_thread
    def error_scale(self, inp, expected):
        """y = g * u: an error d_g in the gate and d_u in the up projection move y by
        |u| d_g + |g| d_u, each d relative to its own sum of |terms| (see Matmul), so rtol is
        relative to |u| S_gate + |g| S_up (g and u from float64; this is >= |y|)."""
        xn = f64(inp["x"])
        bg = None if inp["b_gate"] is None else f64(inp["b_gate"])
        bu = None if inp["b_up"] is None else f64(inp["b_up"])
        g = activate(linear(xn, f64(inp["w_gate"]), bg), inp["activation"])
        u = linear(xn, f64(inp["w_up"]), bu)
        scale = u.abs() * _abs_linear(inp["x"], inp["w_gate"], inp["b_gate"]) + \
            g.abs() * _abs_linear(inp["x"], inp["w_up"], inp["b_up"])
        return (scale,)


class SwiGLUBackward(SwiGLU):
    """(dx, dw_gate, dw_up, db_gate, db_up) from dy [*lead, N] and the forward's inputs. The case's
    value regime and layout are x's (dy is stored in the same layout); "grad" is dy's regime. Every
    case has both biases (the launcher's no-bias path is checked against zero biases in
    tests/test_grad_pointwise.py)."""
    name = "swiglu_backward"
    outputs = ("dx", "dw_gate", "dw_up", "db_gate", "db_up")
    grads = True
    # No infinite dy: where fp32's act'(z_gate) or act(z_gate) underflows to 0 (gelu' below z ~ -14,
    # gelu_tanh' ~ -10.6) an infinite dy gives 0 * inf = NaN in any fp32 evaluation, while the float64
    # oracle's tiny slope gives inf (as swiglu leaves out non-finite weights). Non-finite x is checked.
    grad_regimes = tuple(g for g in GRAD_REGIMES if g != "nonfinite")

    def grad_choices(self, values):
        """Huge x with huge dy is outside the domain: dw = dz^T x then holds products of three huge
        numbers (1e15^3 in fp32 and bf16), past fp32's range inside the accumulator (inf - inf)."""
        return tuple(g for g in self.grad_regimes if not (values == "large" and g == "large"))

    def inputs(self, case, device):
        inp = super().inputs(case, device)
        if inp["b_gate"] is None:
            raise ValueError(f"{case.id}: a swiglu_backward case needs the biases")
        *lead, N, K = case.shape
        inp["dy"] = make_input((*lead, N), case.dtype, case.generator().manual_seed(case.seed + 1), device,
                              values=case.param("grad", "normal"), layout=case.layout)
        return inp

    def output_shapes(self, inp):
        N, K = inp["w_gate"].shape
        return {"dx": tuple(inp["x"].shape), "dw_gate": (N, K), "dw_up": (N, K), "db_gate": (N,), "db_up": (N,)}

    def _args(self, inp):
        return (inp["dy"], *super()._args(inp))

    def kernel(self, inp, out, **config):
        return kernels.swiglu_backward(*self._args(inp), out_dx=out["dx"], out_dw_gate=out["dw_gate"],
                                       out_dw_up=out["dw_up"], out_db_gate=out["db_gate"], out_db_up=out["db_up"],
                                       **config)

    def reference(self, inp):
        return references.swiglu_backward(*self._args(inp))

    def oracle(self, inp):
        return oracles.swiglu_backward(*self._args(inp))

    @one_thread
    def error_scale(self, inp, expected):
        """Two kinds of error, two terms. rtol: the roundings in the output's unit: dz (bf16 for bf16
        inputs; fp32, truncated to TF32 by a GPU's fp16 path, otherwise), the second GEMM's fp32 sum
        and the output's rounding, relative to that GEMM's sum of |terms| with the float64 dz: dx to
        |dz_gate| |w_gate| + |dz_up| |w_up|, dw to |dz|^T |x|, db to the column sums of |dz|.
        bound_rtol: the fp32 errors dz inherits from the
        recomputed projections (each relative to its S = sum |x| |w| + |b|; |act''| <= 1,
        |act'| <= 1.13) and from the activation in fp32, which are absolute where it cancels or leaves
        fp32's range (act by up to ~|z| 2^-24: GELU's 1 + erf below z ~ -3, silu's exp(-z) overflowing
        below -88; act' by ~1.2e-7): B_gate = |dy| (|act'(z_gate)| S_up + |z_up| (S_gate + 1)) and
        B_up = |dy| (|act(z_gate)| + (|act'(z_gate)| + 1) S_gate), carried through the second GEMM the
        same way. And an fp32 product below fp32's normal range (x in the tiny regime: dz x) rounds to
        the subnormal grid of 2^-149 whatever its size: dx and dw get an absolute allowance of 2^-150
        per product of their dots (2N and M)."""
        xn = f64(inp["x"])
        bg, bu = (None if b is None else f64(b) for b in (inp["b_gate"], inp["b_up"]))
        wg, wu = f64(inp["w_gate"]), f64(inp["w_up"])
        N, K = wg.shape
        zg, zu = linear(xn, wg, bg), linear(xn, wu, bu)
        s_gate = _abs_linear(inp["x"], inp["w_gate"], inp["b_gate"])
        s_up = _abs_linear(inp["x"], inp["w_up"], inp["b_up"])
        d = f64(inp["dy"]).abs()
        slope = activation_slope(zg, inp["activation"]).abs()
        act = activate(zg, inp["activation"]).abs()
        M = xn.numel() // K if K else d.numel() // max(N, 1)
        rows = xn.abs().reshape(M, K)
        wg, wu = wg.abs(), wu.abs()

        def carried(e_gate, e_up):
            """(dx, dw_gate, dw_up, db_gate, db_up) of the given dz magnitudes."""
            e_gate, e_up = e_gate.reshape(M, N), e_up.reshape(M, N)
            return ((linear(e_gate, wg.t()) + linear(e_up, wu.t())).reshape(xn.shape), linear(e_gate.t(), rows.t()),
                    linear(e_up.t(), rows.t()), e_gate.sum(0), e_up.sum(0))
        value = carried(d * zu.abs() * slope, d * act)
        bound = carried(d * (slope * s_up + zu.abs() * (s_gate + 1)), d * (act + (slope + 1) * s_gate))
        sub = 2.0 ** -150           # half the fp32 subnormal spacing
        extra = (2 * N * sub, M * sub, M * sub, None, None)
        return tuple(Magnitudes(value=v, bound=b, extra=None if e is None else torch.full_like(v, e))
                     for v, b, e in zip(value, bound, extra))

    def pinned(self, dtype):
        out = [c for c in super().pinned(dtype) if c.param("bias", False)]    # the forward's, with biases

        def case(shape, seed=0, **kw):
            kw.setdefault("bias", True)
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        for act in self.activations:
            # Rows of zero, huge and non-finite dy.
            out += [case((9, 20, 33), seed=90, grad=g, activation=act) for g in self.grad_regimes if g != "normal"]
        # Long reductions for dw and db: 300 rows in tiles of 16 (small config) and in the auto tiles.
        out += [case((300, 8, 24), seed=91, config="small"), case((2, 150, 12, 20), seed=92, activation="gelu")]
        return out


OPS = {op.name: op for op in (Matmul(), SwiGLU(), SwiGLUBackward())}

"""harness/peers: the Liger-Kernel, FlagGems and flash-linear-attention adapters, checked without
the libraries (CI has none of them). The modules import without them, their adapters are
Implementations of registered ops that --impl accepts, calling one without its library names
the extra to install, the declared unsupported reasons fire where the libraries' contracts end,
and each adapter maps its launcher's arguments onto the library's call: the whole check
(harness.run.run_case: inputs, stand-in launcher, oracle, budget) runs against a fake library
that records its calls and computes what the real one's contract says, in float64, rounded once.
"""
import importlib
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import oracles
from harness import impls, registry
from harness.cases import Case
from harness.peers import fla as fla_adapters
from harness.peers import flag_gems as gems_adapters
from harness.peers import liger as liger_adapters
from harness.run import run_case

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"liger": liger_adapters, "flag_gems": gems_adapters, "fla": fla_adapters}
LIBRARY_MODULES = {"liger": "liger_kernel", "flag_gems": "flag_gems", "fla": "fla"}    # what each imports


def _impl(library, op):
    return next(i for i in MODULES[library].ADAPTERS if i.op == op)


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rotate(x, cos, sin, style):
    """x[..., D] rotated by cos/sin[..., D/2] (broadcast against x's leading dims), in float64."""
    half = x.shape[-1] // 2
    a, b = (x[..., :half], x[..., half:]) if style == "neox" else (x[..., 0::2], x[..., 1::2])
    ya, yb = a * cos - b * sin, a * sin + b * cos
    return torch.cat([ya, yb], -1) if style == "neox" else torch.stack([ya, yb], -1).flatten(-2)


class Recorder(dict):
    """name -> the last call's (args, kwargs)."""

    def wrap(self, name, fn):
        def call(*args, **kwargs):
            self[name] = (args, kwargs)
            return fn(*args, **kwargs)
        return call


def _install(monkeypatch, modules: dict):
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(module, k, v)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def fake_liger(monkeypatch):
    """Liger's calls as its kernels define them; rope rotates q in place, as Liger does."""
    calls = Recorder()
    d = lambda t: t.double()    # noqa: E731

    def rms_norm(X, W, eps, offset=0.0, casting_mode="llama", in_place=True):
        return _rms(d(X), offset + d(W), eps).to(X.dtype)

    def layer_norm(X, W, B, eps):
        assert W is not None and B is not None, "Liger's kernel loads both"
        return F.layer_norm(d(X), X.shape[-1:], d(W), d(B), eps).to(X.dtype)

    def fused_add_rms_norm(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=False):
        S = X + R
        return _rms(d(S), offset + d(W), eps).to(X.dtype), S

    def rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
        rd = rotary_dim or cos.shape[-1]
        qt = q.transpose(1, 2).contiguous()      # [B, T, H, D]; no copy if q's storage is that: rotated in place
        c, s = (d(t[:, :, None, :rd // 2]) for t in (cos, sin))
        qt[..., :rd] = _rotate(d(qt[..., :rd]), c, s, "neox").to(q.dtype)
        return qt.transpose(1, 2), k

    def llama4_rope(q, k, freqs_cis, BLOCK_SIZE=None):
        f = freqs_cis.reshape(-1, freqs_cis.shape[-1])[None, :, None, :]      # one row per position
        q.copy_(_rotate(d(q), d(f.real), d(f.imag), "gptj").to(q.dtype))
        return q, k

    functional = {"liger_rms_norm": rms_norm, "liger_layer_norm": layer_norm,
                  "liger_fused_add_rms_norm": fused_add_rms_norm, "liger_rope": rope,
                  "liger_softmax": lambda x: torch.softmax(d(x), -1).to(x.dtype),
                  "liger_swiglu": lambda a, b: (F.silu(d(a)) * d(b)).to(a.dtype),
                  "liger_geglu": lambda a, b: (F.gelu(d(a), approximate="tanh") * d(b)).to(a.dtype)}
    ops = {"LigerLlama4RopeFunction": types.SimpleNamespace(apply=calls.wrap("LigerLlama4RopeFunction", llama4_rope)),
           "LigerEmbeddingFunction": types.SimpleNamespace(apply=calls.wrap("LigerEmbeddingFunction",
                                                                            lambda table, ids: table[ids]))}
    functional = {k: calls.wrap(k, v) for k, v in functional.items()}
    _install(monkeypatch, {"liger_kernel": {}, "liger_kernel.transformers": {}, "liger_kernel.ops": ops,
                           "liger_kernel.transformers.functional": functional})
    return calls


@pytest.fixture
def fake_gems(monkeypatch):
    """FlagGems' exported functions as their aten / vLLM signatures define them."""
    calls = Recorder()
    d = lambda t: None if t is None else t.double()    # noqa: E731

    def fused_add_rms_norm(x, residual, normalized_shape, weight, eps=1e-5):
        s = d(x) + d(residual)                            # in place into both, as FlagGems does
        x.copy_(_rms(s, d(weight), eps))
        residual.copy_(s)
        return x, residual

    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, rotary_interleaved=False, inplace=False):
        c, s = (d(t)[position_ids][:, None, :] for t in (cos, sin))       # a cache row per token
        style = "gptj" if rotary_interleaved else "neox"
        return _rotate(d(q), c, s, style).to(q.dtype), k

    fns = {"rms_norm": lambda x, shape, w, eps=1e-5: _rms(d(x), d(w), eps).to(x.dtype),
           "layer_norm": lambda x, shape, w=None, b=None, eps=1e-5: (F.layer_norm(d(x), shape, d(w), d(b), eps)
                                                                     .to(x.dtype), None, None),
           "fused_add_rms_norm": fused_add_rms_norm, "apply_rotary_pos_emb": apply_rotary_pos_emb,
           "softmax": lambda x, dim, half_to_float=False: torch.softmax(d(x), dim).to(x.dtype),
           "gelu": lambda x, *, approximate="none": F.gelu(d(x), approximate=approximate).to(x.dtype),
           "mm": lambda a, b: (d(a) @ d(b)).to(a.dtype),
           "addmm": lambda bias, a, b, *, beta=1, alpha=1: (d(a) @ d(b) + d(bias)).to(a.dtype),
           "silu_and_mul": lambda a, b: (F.silu(d(a)) * d(b)).to(a.dtype),
           "gelu_and_mul": lambda a, b, approximate="none": (F.gelu(d(a), approximate=approximate) * d(b)).to(a.dtype),
           "embedding": lambda table, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False: table[ids]}
    _install(monkeypatch, {"flag_gems": {k: calls.wrap(k, v) for k, v in fns.items()}})
    return calls


@pytest.fixture
def fake_fla(monkeypatch):
    """fla's chunk_gated_delta_rule as its contract says: o in v's dtype, the final state fp32
    (None unless asked), q and k L2-normalised in the kernel when asked; from the float64 oracle."""
    calls = Recorder()

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        o, state = oracles.gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                            use_qk_l2norm=use_qk_l2norm_in_kernel)
        return o.to(v.dtype), state.float() if output_final_state else None

    _install(monkeypatch, {"fla": {}, "fla.ops": {}, "fla.ops.gated_delta_rule": {
        "chunk_gated_delta_rule": calls.wrap("chunk_gated_delta_rule", chunk_gated_delta_rule)}})
    return calls


# -- the modules and their adapters ------------------------------------------------------------

def test_the_modules_import_without_their_libraries(monkeypatch):
    for library, module in MODULES.items():
        monkeypatch.setitem(sys.modules, LIBRARY_MODULES[library], None)      # importing it now fails
        assert importlib.reload(module).ADAPTERS


@pytest.mark.parametrize("library", MODULES)
def test_every_adapter_is_an_implementation_of_a_registered_op(library):
    adapters = MODULES[library].ADAPTERS
    assert len({i.op for i in adapters}) == len(adapters), "one adapter per op"
    for impl in adapters:
        assert isinstance(impl, impls.Implementation) and impl.name.startswith(f"{library}:")
        op = registry.get(impl.op)
        assert op.launcher is not None and set(impl.dtypes) <= set(op.dtypes), impl.op
        assert impl.triton and not impl.accepts_out
    chosen = impls.parse([f"harness.peers.{library}:ADAPTERS"])
    assert set(chosen) == {i.op for i in adapters}


def test_the_entry_points_name_the_adapter_lists():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    points = project["entry-points"]["kernelcheck.impls"]
    assert points == {"liger": "harness.peers.liger:ADAPTERS", "flag_gems": "harness.peers.flag_gems:ADAPTERS",
                      "fla": "harness.peers.fla:ADAPTERS"}
    assert {p.split(">=")[0] for p in project["optional-dependencies"]["peers"]} == {"liger-kernel", "flag-gems",
                                                                                      "fla-core"}


@pytest.mark.parametrize("library,op_name,subject", [
    ("liger", "rmsnorm", Case.make("rmsnorm", "float32", (3, 40))),
    ("liger", "rope", Case.make("rope", "float32", (1, 2, 2, 8), style="gptj")),
    ("liger", "embedding", Case.make("embedding", "float32", (3, 8))),
    ("flag_gems", "matmul", Case.make("matmul", "float32", (3, 4, 5), bias=True)),
    ("flag_gems", "rope", Case.make("rope", "float32", (1, 2, 2, 8))),
    ("fla", "gated_delta_rule", Case.make("gated_delta_rule", "float32", (1, 20, 1, 2, 16, 16))),
])
def test_without_its_library_an_adapter_names_the_extra_to_install(monkeypatch, backend, budgets, library, op_name,
                                                                   subject):
    monkeypatch.setitem(sys.modules, LIBRARY_MODULES[library], None)
    with pytest.raises(ImportError, match=r"pip install kernelcheck\[peers\]"):
        run_case(subject, backend, budgets, _impl(library, op_name))


# -- declared unsupported cases -----------------------------------------------------------------

UNSUPPORTED = [
    ("liger", Case.make("rope", "float16", (2, 3, 4, 64), style="gptj", rotary_dim=32),
     "gptj style with partial rotary"),
    ("liger", Case.make("softmax", "float32", (2, 5, 9), causal=True, scale=1.0), "causal mask"),
    ("liger", Case.make("softmax", "float32", (3, 64), scale=0.3), "scale != 1"),
    ("liger", Case.make("softmax", "float32", (4, 0), scale=1.0), "zero-width rows"),
    ("liger", Case.make("rmsnorm", "float32", (2, 70000)), "rows wider than 65536"),
    ("liger", Case.make("swiglu", "float32", (9, 40, 33), activation="gelu"), "erf GELU gate"),
    ("liger", Case.make("swiglu", "float16", (3, 0, 16), activation="silu"), "zero-width rows"),
    ("liger", Case.make("embedding", "float32", (0, 16)), "zero-size output"),
    ("liger", Case.make("embedding", "float32", (2, 0, 16)), "zero-size output"),
    ("liger", Case.make("embedding", "float32", (4, 0)), "zero-size output"),
    ("flag_gems", Case.make("rope", "float32", (2, 3, 2, 64), rotary_dim=32), "partial rotary"),
    ("flag_gems", Case.make("softmax", "float32", (2, 5, 9), causal=True, scale=1.0), "causal mask"),
    ("flag_gems", Case.make("softmax", "bfloat16", (3, 64), scale=0.125), "scale != 1"),
    ("flag_gems", Case.make("add_rmsnorm", "bfloat16", (4, 129)), "16-bit"),
    ("flag_gems", Case.make("bias_gelu", "float16", (3, 65), approximate="tanh"), "16-bit with a bias"),
    ("flag_gems", Case.make("bias_gelu", "float32", (4, 129), values="nonfinite", approximate="none"), "non-finite"),
    ("flag_gems", Case.make("matmul", "float32", (9, 40, 33), activation="gelu", bias=True), "fused activation"),
    ("flag_gems", Case.make("embedding", "float32", (4, 0)), "zero-width rows"),
    ("liger", Case.make("swiglu", "float16", (4, 8, 16), values="large"), "overflow to inf"),
    ("flag_gems", Case.make("swiglu", "float16", (4, 8, 16), values="offset"), "overflow to inf"),
]

SUPPORTED = [
    ("liger", Case.make("rope", "bfloat16", (2, 3, 4, 64), style="neox", rotary_dim=32)),
    ("liger", Case.make("rope", "float16", (2, 3, 4, 64), style="gptj", rotary_dim=64)),
    ("liger", Case.make("softmax", "float32", (0, 64), scale=1.0)),
    ("liger", Case.make("swiglu", "bfloat16", (0, 8, 16), activation="gelu_tanh")),
    ("liger", Case.make("embedding", "float32", (4,), vocab=3)),
    ("liger", Case.make("layernorm", "float16", (0, 64), affine="none")),
    ("flag_gems", Case.make("rope", "float32", (2, 3, 4, 64), style="gptj", positions="any")),
    ("flag_gems", Case.make("add_rmsnorm", "float32", (4, 129))),
    ("flag_gems", Case.make("bias_gelu", "bfloat16", (1, 65), bias=False, approximate="tanh")),
    ("flag_gems", Case.make("bias_gelu", "float32", (4, 129), values="large", approximate="none")),
    ("flag_gems", Case.make("matmul", "float16", (4, 5, 0), activation="none", bias=True)),
    ("flag_gems", Case.make("swiglu", "float32", (9, 40, 33), activation="gelu")),
    ("flag_gems", Case.make("swiglu", "bfloat16", (4, 8, 16), values="large")),
]


@pytest.mark.parametrize("library,subject,why", UNSUPPORTED, ids=lambda v: v.id if isinstance(v, Case) else None)
def test_an_unsupported_case_is_declared_with_its_reason(library, subject, why):
    reason = _impl(library, subject.op).unsupported(subject)
    assert reason and why in reason


@pytest.mark.parametrize("library,subject", SUPPORTED, ids=lambda v: v.id if isinstance(v, Case) else None)
def test_a_case_inside_the_contract_is_not_declared(library, subject):
    impl = _impl(library, subject.op)
    assert impl.unsupported is None or impl.unsupported(subject) is None


# -- argument mapping, against fake libraries ---------------------------------------------------

def _check(case, backend, budgets, impl):
    assert impl.unsupported is None or impl.unsupported(case) is None, case.id
    outcome = run_case(case, backend, budgets, impl)
    assert outcome.passed, outcome.failure_message()


LIGER_CASES = [
    (Case.make("rmsnorm", "float32", (3, 40), layout="transposed", eps=1e-5), "liger_rms_norm"),
    (Case.make("layernorm", "float32", (3, 40), affine="w"), "liger_layer_norm"),
    (Case.make("layernorm", "float16", (2, 33), affine="none", layout="sliced"), "liger_layer_norm"),
    (Case.make("add_rmsnorm", "float32", (2, 3, 40)), "liger_fused_add_rms_norm"),
    (Case.make("rope", "float32", (2, 3, 4, 16), positions="large", theta=1e6), "liger_rope"),
    (Case.make("rope", "float32", (2, 3, 4, 20), rotary_dim=8, layout="permuted"), "liger_rope"),
    (Case.make("rope", "bfloat16", (2, 3, 4, 16)), "liger_rope"),
    (Case.make("rope", "float32", (2, 3, 4, 16), style="gptj", positions="any", layout="broadcast"),
     "LigerLlama4RopeFunction"),
    (Case.make("softmax", "float32", (3, 5, 33), scale=1.0, causal=False), "liger_softmax"),
    (Case.make("swiglu", "float32", (4, 10, 24), activation="silu", bias=True), "liger_swiglu"),
    (Case.make("swiglu", "float32", (2, 3, 10, 24), activation="gelu_tanh", bias=True, layout="transposed"),
     "liger_geglu"),
    (Case.make("embedding", "float32", (3, 7, 24), ids="int32"), "LigerEmbeddingFunction"),
]


# (The parameter is not named `case`: the suite's plugin would take these for its op checks and
# apply the interpreter's declared gaps, which the fakes, plain torch, do not have.)
@pytest.mark.parametrize("subject,called", LIGER_CASES, ids=lambda v: v.id if isinstance(v, Case) else None)
def test_a_liger_adapter_maps_its_arguments(fake_liger, backend, budgets, subject, called):
    case = subject
    _check(case, backend, budgets, _impl("liger", case.op))
    assert called in fake_liger
    args, kwargs = fake_liger[called]
    if "rms_norm" in called:
        assert kwargs == {"offset": 0.0, "casting_mode": "gemma"}      # our contract's mode
    if called == "liger_rope":
        q, k, cos, sin = args
        B, T, H, D = case.shape
        rd = case.param("rotary_dim", D)
        assert q.shape == (B, H, T, D) and k.shape == (B, 1, T, D)
        assert cos.shape == (B, T, rd) and cos.dtype == torch.float32      # fp32 tables: one rounding
        assert torch.equal(cos[..., :rd // 2], cos[..., rd // 2:])     # HF's cat(freqs, freqs)
    if called == "LigerLlama4RopeFunction":
        q, k, freqs = args
        B, T, H, D = case.shape
        assert q.shape == (1, B * T, H, D) and freqs.shape == (B * T, D // 2) and freqs.dtype == torch.complex64


GEMS_CASES = [
    (Case.make("rmsnorm", "float32", (3, 40), layout="permuted"), "rms_norm"),
    (Case.make("layernorm", "float32", (3, 40), affine="wb"), "layer_norm"),
    (Case.make("layernorm", "float32", (3, 40), affine="none"), "layer_norm"),
    (Case.make("add_rmsnorm", "float32", (2, 3, 40), layout="transposed"), "fused_add_rms_norm"),
    (Case.make("rope", "float32", (2, 3, 4, 16), positions="any", layout="broadcast"), "apply_rotary_pos_emb"),
    (Case.make("rope", "float32", (2, 3, 4, 16), style="gptj", positions="large", layout="transposed"),
     "apply_rotary_pos_emb"),
    (Case.make("softmax", "float32", (3, 5, 33), scale=1.0, causal=False), "softmax"),
    (Case.make("bias_gelu", "float32", (3, 65), approximate="tanh"), "gelu"),
    (Case.make("bias_gelu", "bfloat16", (3, 65), approximate="none", bias=False), "gelu"),
    (Case.make("matmul", "float32", (2, 3, 10, 24), activation="none", bias=True, layout="sliced"), "addmm"),
    (Case.make("matmul", "float32", (4, 10, 24), activation="none", bias=False), "mm"),
    (Case.make("swiglu", "float32", (4, 10, 24), activation="silu", bias=True), "silu_and_mul"),
    (Case.make("swiglu", "float32", (4, 10, 24), activation="gelu", bias=False), "gelu_and_mul"),
    (Case.make("swiglu", "float32", (4, 10, 24), activation="gelu_tanh", bias=True), "gelu_and_mul"),
    (Case.make("embedding", "float32", (3, 7, 24), ids="int32", layout="transposed"), "embedding"),
]


@pytest.mark.parametrize("subject,called", GEMS_CASES, ids=lambda v: v.id if isinstance(v, Case) else None)
def test_a_flag_gems_adapter_maps_its_arguments(fake_gems, backend, budgets, subject, called):
    case = subject
    _check(case, backend, budgets, _impl("flag_gems", case.op))
    assert called in fake_gems
    args, kwargs = fake_gems[called]
    if called in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
        assert [a for a in args if isinstance(a, list)] == [[case.shape[-1]]]      # normalized_shape
    if called == "apply_rotary_pos_emb":
        q, k, cos, sin, index = args
        B, T, H, D = case.shape
        assert q.shape == (B * T, H, D) and k.shape == (B * T, 1, D) and index.shape == (B * T,)
        assert cos.shape[1] == D // 2 and cos.dtype == case.torch_dtype
        assert kwargs == {"rotary_interleaved": case.param("style", "neox") == "gptj"}
    if called == "gelu_and_mul":
        assert kwargs == {"approximate": "tanh" if case.param("activation") == "gelu_tanh" else "none"}


FLA_CASES = [
    Case.make("gated_delta_rule", "float32", (2, 20, 1, 2, 16, 16)),                     # Hv / Hk = 2
    Case.make("gated_delta_rule", "float32", (1, 2, 16, 16), lens="3,0,20"),            # varlen, an empty one
    Case.make("gated_delta_rule", "float32", (1, 20, 2, 2, 12, 8), l2norm=False, init=True, scale=0.5),
    Case.make("gated_delta_rule", "float32", (2, 20, 1, 4, 16, 16), layout="permuted", init=False),
    Case.make("gated_delta_rule", "float16", (1, 20, 1, 2, 16, 16), gate="uniform"),
    Case.make("gated_delta_rule", "bfloat16", (1, 2, 16, 8), lens="5,17", gate_fp32=True),
]


@pytest.mark.parametrize("subject", FLA_CASES, ids=lambda v: v.id)
def test_an_fla_adapter_maps_its_arguments(fake_fla, backend, budgets, subject):
    case = subject
    _check(case, backend, budgets, _impl("fla", case.op))
    (q, k, v, g, beta), kwargs = fake_fla["chunk_gated_delta_rule"]
    assert set(kwargs) == {"scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "cu_seqlens"}
    assert kwargs["output_final_state"] is True
    assert kwargs["use_qk_l2norm_in_kernel"] is case.param("l2norm", True)
    assert kwargs["scale"] == case.param("scale")
    assert (kwargs["initial_state"] is None) == (not case.param("init", True))
    cu = kwargs["cu_seqlens"]
    if case.param("lens") is None:
        assert cu is None and q.shape[0] == case.shape[0]
    else:
        lens = [int(n) for n in case.param("lens").split(",")]
        assert cu.dtype == torch.int64 and cu.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
        assert q.shape[0] == 1 and q.shape[1] == sum(lens)


# -- the report ---------------------------------------------------------------------------------

def test_the_report_tables_checks_failures_replays_timeouts_and_declarations(tmp_path):
    from harness import audit
    from harness.peers import report

    case = Case.make("rmsnorm", "float16", (3, 40))
    rec = {"op": "rmsnorm", "dtype": "float16", "output": "y", "case": case.id, "case_json": case.to_json(),
           "test": "::test_pinned[x]", "passed": False, "problem": "1 of 120 elements outside", "usage": 1.5,
           "max_abs_err": 0.01, "max_rel_err": 0.01, "atol": 1e-7, "rtol": 1e-3, "ref_ratio": None, "gap": None}
    ok = dict(rec, case="rmsnorm-float32-ok", dtype="float32", passed=True, problem=None, usage=0.25)
    meta = {"device": "GPU", "versions": {"torch": "2"}, "outcomes": {"failed": 2, "passed": 1},
            "impls": {"rmsnorm": {"name": "lib:rms", "spec": "lib.adapters:ADAPTERS"}},
            "impl_unsupported": [["rmsnorm", "a reason", 3]], "impl_not_run": []}
    audit.write_json(tmp_path / "a.json.gz", [rec, ok], meta)
    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite><testcase name="test_pinned[x]"><failure message="m">x</failure></testcase>'
        '<testcase name="test_random[mm-part1]"><failure message="wrapped">|  E   Failed: Timeout (&gt;60.0s) '
        'from pytest-timeout.</failure></testcase></testsuite></testsuites>')
    out = tmp_path / "r.md"
    assert report.main(["--run", "lib", str(tmp_path / "a.json.gz"), str(tmp_path / "j.xml"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| rmsnorm | float16 | 1 | 1 | 1.5 |" in text and "| rmsnorm | float32 | 1 | 0 | 0.25 |" in text
    assert f"python -m harness.replay '{case.to_json()}' --impl lib.adapters:ADAPTERS" in text
    assert "test_random[mm-part1]`: Failed: Timeout (>60.0s)" in text and "test_pinned[x]`" not in text
    assert "| rmsnorm | a reason | 3 |" in text

"""Training end to end: STEPS AdamW steps of the tiny decoder with our forward, backward and
optimizer (models/train.py: the kernels' autograd Functions, F.linear for the projections;
kernels.AdamW) against the same steps in float64 (oracles/train.py: plain torch, torch.autograd,
torch.optim.AdamW on float64 parameters), from the same weights and the same batch.

At every step the loss and every gradient are judged, and after the update every parameter, each
element within a budget composed from the op budgets of tolerances.toml and carried through
AdamW from step to step (docs/NUMERICS.md, "Training end to end"):

- gradient: |g - g*(theta)| <= g_err max|g*(theta)| over each tensor, g*(theta) the float64
  gradient at our own parameters theta, g_err the sum of rtol + bound_rtol over the ops whose
  error can reach it (compose) plus the decoder's logit budget as the softmax passes it on to
  the gradient logits (oracles.train.Evaluation.logit_gain); exact zeros stay exact;
- parameters: the float64 trajectory theta* has its own gradients g*(theta*); ours differ from
  them by at most delta = g_err max|g*(theta)| + |g*(theta) - g*(theta*)| (the second term: what
  the parameters' difference so far does to the gradient, exact in float64). AdamWBound carries
  delta through m, v and the update in interval arithmetic, and adds the fp32 rounding of AdamW
  and of the stored parameter: |theta - theta*| <= A, step after step;
- loss: |L - L*(theta*)| <= the forward's budgets through the loss at theta + |L*(theta) -
  L*(theta*)|.

A failure names the step, the check, the parameter, its worst element, the error and the budget.
The planted bugs below (a GQA reduction dropped, RoPE's backward rotating forward, a norm's dw
doubled) must fail it. Seeded: the same weights, batch and verdict on every run.

bf16 runs on a GPU only: the interpreter's bf16 tl.dot (gap interp-bf16-dot, op decoder) makes
its bf16 item a strict xfail there."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import kernels
from harness.ops.cross_entropy import LOSS_UNITS
from models import train
from models.config import Qwen2Config
from models.qwen2 import Qwen2Decoder
from models.tiny import random_weights, tiny_config
from oracles import train as twin

pytestmark = pytest.mark.op("decoder")      # --op decoder selects these tests

SIZES = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128)
BATCH, SEQ, SEED = 2, 24, 20      # 24 tokens: not a multiple of the attention tiles
STEPS = 4
HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
U32 = 2.0 ** -24
UNIT = {"float32": U32, "bfloat16": 2.0 ** -8}      # unit roundoff of the stored parameters


# ---------------------------------------------------------------------------------------------
# The budget, composed from the op budgets
# ---------------------------------------------------------------------------------------------

def gradient_path(layers: int) -> list:
    """The ops whose error can reach a parameter's gradient, on the longest path (the
    embedding's): the forward's activations (the decoder's budget), the loss's backward, then
    each layer backwards (the down projection's dx, swiglu, the post-attention norm, the output
    projection's dx, attention, RoPE, the q/k/v projection's dx, the input norm), then the
    embedding's sum. The projections are torch's GEMMs, judged as our matmul (the same class:
    fp32 accumulation, relative to the sum of |terms|)."""
    path = ["decoder", "fused_linear_cross_entropy", "add_rmsnorm_backward"]
    for i in reversed(range(layers)):
        path += ["matmul", "swiglu_backward", "add_rmsnorm_backward", "matmul", "flash_attention_backward",
                 "rope_backward", "matmul", "add_rmsnorm_backward" if i else "rmsnorm_backward"]
    return path + ["embedding_backward"]


@dataclass(frozen=True)
class Budget:
    dtype: str
    grad_rtol: float          # sum of rtol + bound_rtol over gradient_path
    terms: tuple              # ((op, rtol + bound_rtol), ...) of that sum
    logit_rtol: float         # decoder: a logit's error relative to its S = sum |h| |W_v|
    loss_rtol: float          # fused_linear_cross_entropy's loss, relative to its terms
    loss_bound_rtol: float    # and relative to G sum |p - q| (the logits' rounding)
    store_u: float            # unit roundoff of the stored parameters

    def describe(self) -> str:
        ops = {}
        for op, v in self.terms:
            ops[op] = ops.get(op, 0) + 1
        path = " + ".join(f"{n} x {op}" if n > 1 else op for op, n in ops.items())
        return (f"grad_rtol {self.grad_rtol:.3g} ({path}) + logit_rtol {self.logit_rtol:.3g} x logit_gain; "
                f"parameters stored to {self.store_u:.3g}")


def compose(budgets, dtype: str, backend: str, layers: int) -> Budget:
    """The end-to-end budget from tolerances.toml's op budgets of this dtype and backend. Each op on
    the gradient's path adds its own rtol + bound_rtol: to first order errors add, and an op's
    error, relative to the size of what it computes, is taken to reach a weight's gradient as the
    same fraction of that gradient's size (the network passes relative errors on without growing
    them: the one assumption here not proven, docs/NUMERICS.md). The loss gets the decoder's
    logit budget seen through the softmax, and the loss's own."""
    terms = []
    for op in gradient_path(layers):
        b = budgets.get(op, dtype, backend)
        terms.append((op, b.rtol + b.bound_rtol))
    ce = budgets.get("fused_linear_cross_entropy", dtype, backend)
    return Budget(dtype=dtype, grad_rtol=sum(v for _, v in terms), terms=tuple(terms),
                  logit_rtol=budgets.get("decoder", dtype, backend).rtol,
                  loss_rtol=ce.rtol * LOSS_UNITS[DTYPES[dtype]], loss_bound_rtol=ce.bound_rtol,
                  store_u=UNIT[dtype])


def adam_cap(step: int, beta1: float, beta2: float) -> float:
    """The largest |m_hat| / sqrt(v_hat) any gradients can give at this step (Cauchy-Schwarz on
    m's and v's weighted sums): 1 at step 1, 1.0014 at step 2, 1.0068 at step 4 for betas (0.9, 0.999). An update
    never moves a parameter by more than lr times this."""
    growth = sum((beta1 * beta1 / beta2) ** j for j in range(step))
    return (1 - beta1) / (1 - beta1 ** step) * math.sqrt((1 - beta2 ** step) / (1 - beta2) * growth)


class AdamWBound:
    """Bounds on how far our AdamW state and parameter can be from the float64 trajectory's, one
    parameter tensor, every element: |m - m*| <= dm, v in [v_lo, v_hi], |p - p*| <= allowed."""

    def __init__(self, like: torch.Tensor):
        zero = torch.zeros_like(like, dtype=torch.float64)
        self.dm, self.m_terms, self.v_lo, self.v_hi, self.allowed = zero, zero, zero, zero, zero

    def step(self, step: int, g: torch.Tensor, delta: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
             p_prev: torch.Tensor, p_new: torch.Tensor, store_u: float) -> dict:
        """After the float64 step `step` with gradient g* (|ours - g*| <= delta) to state m*, v*
        and parameter p_prev* -> p_new*: the new bounds, and the parts of `allowed`."""
        lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
        decay = 1 - lr * wd
        # m = b1 m + (1 - b1) g in fp32: the gradients' error, plus three roundings of its terms
        self.m_terms = b1 * self.m_terms + (1 - b1) * (g.abs() + delta)
        self.dm = b1 * self.dm + (1 - b1) * delta + 3 * U32 * self.m_terms
        # v = b2 v + (1 - b2) g^2: the interval of sums of squares of gradients within delta
        hi, lo = g.abs() + delta, (g.abs() - delta).clamp(min=0)
        self.v_hi = (b2 * self.v_hi + (1 - b2) * hi * hi) * (1 + 4 * U32)
        self.v_lo = (b2 * self.v_lo + (1 - b2) * lo * lo) * (1 - 4 * U32)
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        want = m / bc1 / ((v / bc2).sqrt() + eps)
        m_lo, m_hi = (m - self.dm) / bc1, (m + self.dm) / bc1
        s_lo, s_hi = (self.v_lo / bc2).sqrt() + eps, (self.v_hi / bc2).sqrt() + eps
        cap = adam_cap(step, b1, b2) * (1 + 16 * U32)
        upd_hi = torch.where(m_hi >= 0, m_hi / s_lo, m_hi / s_hi).clamp(-cap, cap)
        upd_lo = torch.where(m_lo >= 0, m_lo / s_hi, m_lo / s_lo).clamp(-cap, cap)
        # the update's own fp32 arithmetic (the bias corrections, sqrt, eps, the division, the
        # step size: about 10 roundings relative to it)
        update = torch.maximum(upd_hi - want, want - upd_lo) + 12 * U32 * torch.maximum(upd_hi.abs(), upd_lo.abs())
        carried = decay * self.allowed
        # fp32: the decay factor's own rounding, p * decay and p - lr u, each within U32 of |p|; a
        # 16-bit parameter is then rounded once more when it is stored
        p_bound = p_new.abs() + carried + lr * update
        store = store_u if store_u > U32 else 0.0
        rounding = U32 * (2 * decay * (p_prev.abs() + self.allowed) + p_bound) + store * p_bound
        self.allowed = carried + lr * update + rounding
        return {"carried": carried, "update": lr * update, "rounding": rounding}


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------

class TrainCheckFailed(AssertionError):
    def __init__(self, step: int, what: str, text: str):
        super().__init__(text)
        self.step, self.what = step, what        # what: "loss", "gradient" or "parameter"


def _setup(dtype: str, device, tied: bool = False):
    """The tiny model (SIZES, weights from SEED), as trainable leaves in `dtype`, and a batch: ids
    and labels [BATCH, SEQ], the next tokens, the first 5 of sequence 0 not counted (a prompt)."""
    config = Qwen2Config.from_dict(tiny_config(**SIZES, tied=tied))
    gen = torch.Generator().manual_seed(SEED)
    weights = random_weights(config.tensor_shapes(), gen)
    tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=gen)
    ids, labels = tokens[:, :-1], tokens[:, 1:].clone()
    labels[0, :5] = -100
    # The LM head at nn.Linear's initial scale, N(0, 1/H): logits O(1) and a loss near log V, as at
    # the start of training (random_weights' N(0, 1) head gives logits of tens, as trained models
    # have, which the budget's softmax term multiplies: logit_gain). Tied, the embedding is the
    # head: scaled alike (the first RMSNorm undoes the scale for the layers).
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    weights[head] = weights[head] / math.sqrt(config.hidden_size)
    model = train.trainable(Qwen2Decoder.from_tensors(config, weights, DTYPES[dtype], device))
    return config, model, ids.to(device), labels.to(device)


def _judge(step: int, what: str, tensors: list, source: str) -> tuple:
    """Every (name, got, want, allowed, explain) of one check and step, elementwise: (usage, name)
    of the worst tensor, and the failure text naming its worst element (None if all pass).
    explain(i) says what element i's allowance is made of. An error where nothing is allowed
    counts as infinite."""
    worst, failing = (0.0, None, None), []
    for name, got, want, allowed, explain in tensors:
        err = (got - want).abs()
        usage = torch.where(allowed > 0, err / allowed, torch.where(err > 0, math.inf, 0.0)).reshape(-1)
        i = int(usage.argmax())
        u = float(usage[i])
        if u > 1:
            failing.append(name)
        if u >= worst[0]:
            worst = (u, name, (got, want, err, allowed, explain, i))
    usage, name, detail = worst
    if not failing:
        return usage, name, None
    got, want, err, allowed, explain, i = detail
    at = str([int(j) for j in torch.unravel_index(torch.tensor(i), got.shape)]) if got.dim() else ""
    others = [n for n in failing if n != name]
    text = (f"step {step}, {what} {name}{at}: got {got.reshape(-1)[i].item():.9g}, expected "
            f"{want.reshape(-1)[i].item():.9g} ({source}), error {err.reshape(-1)[i].item():.3g} > allowed "
            f"{allowed.reshape(-1)[i].item():.3g} = {explain(i)}; error/allowed = {usage:.3g}"
            + (f"\n  also outside the budget: {', '.join(others)}" if others else ""))
    return usage, name, text


def run_training(budget: Budget, dtype: str, device, *, tied: bool = False, steps: int = STEPS,
                 check_grads: bool = True, replay: str = "tests/test_train_e2e.py") -> list:
    """`steps` steps of ours and of the float64 twin, judged as the module says. Returns one row a
    step: the worst usage (error / allowed) of the loss, the gradients and the parameters, with
    the parameter it was found in; raises TrainCheckFailed at the first check that fails."""
    config, model, ids, labels = _setup(dtype, device, tied)
    ours = train.parameters(model)
    star = {k: p.detach().to(torch.float64).clone().requires_grad_() for k, p in ours.items()}
    opt = kernels.AdamW(list(ours.values()), **HYPER)
    opt_star = torch.optim.AdamW(list(star.values()), **HYPER)
    bounds = {k: AdamWBound(p) for k, p in star.items()}
    footer = (f"\n  budget  {budget.describe()}\n  replay  python -m pytest '{replay}' (seed {SEED}, {dtype}"
              f"{', tied' if tied else ''}, step {{}} of {steps})")
    rows = []

    def check(step, what, result):
        usage, name, text = result
        if text is not None:
            raise TrainCheckFailed(step, what, text + footer.format(step))
        return usage, name

    for step in range(1, steps + 1):          # AdamW's count: the update of step 1 is the first
        for p in ours.values():
            p.grad = None
        loss = train.loss(model, ids, labels)
        loss.backward()
        # the float64 truth along its own trajectory, and at our parameters
        at_star = twin.evaluate(config, {k: p.detach() for k, p in star.items()}, ids, labels)
        at_ours = at_star if step == 1 else twin.evaluate(config, {k: p.detach() for k, p in ours.items()}, ids,
                                                         labels)
        row = {"step": step}

        # loss: the forward's budgets at our parameters, plus what the parameters' difference does
        forward = (budget.logit_rtol * at_ours.loss_logit_scale + budget.loss_rtol * at_ours.loss_terms
                   + budget.loss_bound_rtol * at_ours.loss_head_scale)
        drift = abs(at_ours.loss - at_star.loss)
        row["loss"] = check(step, "loss", _judge(step, "loss of", [(
            "the batch", loss.detach().cpu().to(torch.float64), torch.tensor(at_star.loss, dtype=torch.float64),
            torch.tensor(forward + drift, dtype=torch.float64),
            lambda i: f"forward budgets {forward:.3g} + what the parameters' difference does {drift:.3g}")],
            "float64 trajectory"))[0]

        # gradients: ours against the float64 gradient at our own parameters, relative to the
        # tensor's largest (exact zeros, an embedding row no token reads, stay exact)
        g_err = row["g_err"] = budget.grad_rtol + budget.logit_rtol * at_ours.logit_gain
        allowed = {k: torch.where(g == 0, 0.0, g_err * g.abs().max()) for k, g in at_ours.grads.items()}
        result = _judge(step, "gradient of", [
            (k, p.grad.detach().to(torch.float64), at_ours.grads[k], allowed[k],
             lambda i, k=k: f"g_err {g_err:.3g} x the tensor's largest gradient {at_ours.grads[k].abs().max():.3g}")
            for k, p in ours.items()], "float64 at our parameters")
        row["grad"] = check(step, "gradient", result) if check_grads else result[:2]
        # how far ours can be from the trajectory's gradient: the kernels' error at our parameters
        # plus what the parameters' difference does to the gradient (exact, float64)
        deltas = {k: allowed[k] + (at_ours.grads[k] - at_star.grads[k]).abs() for k in ours}

        # the update, ours and the float64 one, and the bound carried through it
        opt.step()
        before = {k: p.detach().clone() for k, p in star.items()}
        for k, p in star.items():
            p.grad = at_star.grads[k]
        opt_star.step()
        judged = []
        for k, p in ours.items():
            state = opt_star.state[star[k]]
            parts = bounds[k].step(step, at_star.grads[k], deltas[k], state["exp_avg"], state["exp_avg_sq"],
                                   before[k], star[k].detach(), budget.store_u)
            judged.append((k, p.detach().to(torch.float64), star[k].detach(), bounds[k].allowed,
                           lambda i, parts=parts: " + ".join(f"{n} {v.reshape(-1)[i].item():.3g}"
                                                             for n, v in parts.items())))
        row["param"] = check(step, "parameter", _judge(step, "after the update, parameter", judged,
                                                       "float64 trajectory"))
        rows.append(row)
    return rows


def _report(rows) -> str:
    """The worst usage (error / allowed) of each step's checks, and where."""
    return "\n".join(f"step {r['step']}: loss {r['loss']:.3g}, gradients {r['grad'][0]:.3g} ({r['grad'][1]}; g_err "
                     f"{r['g_err']:.3g}), parameters {r['param'][0]:.3g} ({r['param'][1]})" for r in rows)


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,dtype,tied", [
    pytest.param("decoder", "float32", False, id="float32"),
    pytest.param("decoder", "float32", True, id="float32-tied"),
    pytest.param("decoder", "bfloat16", False, id="bfloat16")])
def test_training_steps_match_float64(op, dtype, tied, backend, budgets, request):
    """STEPS AdamW steps, ours against float64: the loss, every gradient and every parameter
    within the composed budget at every step (the worst usage of each step printed with -s). Tied:
    the embedding is also the LM head, its gradient the sum of both Functions'."""
    budget = compose(budgets, dtype, backend.name, SIZES["layers"])
    rows = run_training(budget, dtype, backend.device, tied=tied, replay=request.node.nodeid)
    print(f"\n{dtype}{' tied' if tied else ''} on the {backend.name}, {budget.describe()}\n{_report(rows)}")
    assert len(rows) == STEPS


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_trainable_weights_are_contiguous_leaves(tied, backend):
    """models.train.trainable: every weight a contiguous leaf that requires grad, gate and up apart
    (the inference model's are halves of one tensor), copies (the inference model is untouched),
    a tied head the embedding itself and listed once by parameters()."""
    config = Qwen2Config.from_dict(tiny_config(**SIZES, tied=tied))
    weights = random_weights(config.tensor_shapes(), torch.Generator().manual_seed(SEED))
    model = Qwen2Decoder.from_tensors(config, weights, torch.float32, backend.device)
    assert model.layers[0].gate_w.data_ptr() + model.layers[0].gate_w.nbytes == model.layers[0].up_w.data_ptr()
    params = train.parameters(train.trainable(model))
    assert all(p.is_leaf and p.requires_grad and p.is_contiguous() for p in params.values())
    assert ("lm_head" in params) is not tied and len(params) == 2 + (not tied) + 8 * SIZES["layers"]
    assert not any(p.requires_grad for p in train.parameters(model).values())
    assert torch.equal(params["layers.1.up_w"], model.layers[1].up_w)


# ---------------------------------------------------------------------------------------------
# Planted bugs: the budget must reject them
# ---------------------------------------------------------------------------------------------

def _gqa_sum_dropped(ctx, dout):
    """FlashAttentionFunction's backward with a KV head's dk and dv taken from the first query head
    of its group instead of summed over the group (the GQA reduction dropped)."""
    q, k, v, out, lse, _, _ = ctx.saved_tensors
    group = q.shape[2] // k.shape[2]
    dq, dk, dv = kernels.flash_attention_backward(q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2),
                                                  out, lse, dout, ctx.causal, ctx.scale)
    return dq, dk[:, :, ::group], dv[:, :, ::group], None, None, None, None


def _rope_turns_forward(ctx, dy):
    """RoPEFunction's backward rotating dy forward (R dy) instead of back (R^T dy)."""
    (positions,) = ctx.saved_tensors
    return kernels.rope(dy, positions, *ctx.options), None, None, None, None


def _rmsnorm_dw_doubled(ctx, dy):
    """RMSNormFunction's backward with dw twice what it is (the first layer's input norm)."""
    x, w = ctx.saved_tensors
    dx, dw = kernels.rmsnorm_backward(dy, x, w, ctx.eps)
    return dx, 2 * dw, None


# name: (Function, broken backward, the weights whose gradient it breaks directly: the check's worst)
PLANTS = {"gqa_sum_dropped": (kernels.FlashAttentionFunction, _gqa_sum_dropped, ".qkv_"),
          "rope_turns_forward": (kernels.RoPEFunction, _rope_turns_forward, ".qkv_"),
          "rmsnorm_dw_doubled": (kernels.RMSNormFunction, _rmsnorm_dw_doubled, "layers.0.input_norm")}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_bug_fails_the_gradient_check(plant, backend, budgets, monkeypatch):
    """Each planted bug fails at step 1, worst on the gradient of a weight it breaks directly (the q, k,
    v projection's; the norm's weight), at thousands of times the budget."""
    function, broken, first = PLANTS[plant]
    monkeypatch.setattr(function, "backward", staticmethod(broken))
    with pytest.raises(TrainCheckFailed) as failure:
        run_training(compose(budgets, "float32", backend.name, SIZES["layers"]), "float32", backend.device, steps=1)
    e = failure.value
    assert (e.step, e.what) == (1, "gradient"), str(e)
    assert first in str(e).split(":")[0], str(e)
    assert float(str(e).split("error/allowed = ")[1].split()[0]) > 1e3, str(e)


@pytest.mark.parametrize("plant", ["gqa_sum_dropped", "rope_turns_forward"])
def test_planted_bug_fails_the_parameters_alone(plant, backend, budgets, monkeypatch):
    """Without the gradient check the parameters' budget, carried through AdamW, rejects the same
    bugs after the first update."""
    function, broken, _ = PLANTS[plant]
    monkeypatch.setattr(function, "backward", staticmethod(broken))
    with pytest.raises(TrainCheckFailed) as failure:
        run_training(compose(budgets, "float32", backend.name, SIZES["layers"]), "float32", backend.device, steps=2,
                     check_grads=False)
    e = failure.value
    assert (e.step, e.what) == (1, "parameter"), str(e)


def test_adamw_cannot_see_a_gradient_scaled_per_tensor(backend, budgets, monkeypatch):
    """Why the gradients are judged too: AdamW's update m_hat / (sqrt(v_hat) + eps) is the same for a
    tensor's gradient times any constant (up to eps), so a dw doubled throughout the run leaves
    the loss and every parameter within their budgets; only the gradient check sees it."""
    monkeypatch.setattr(kernels.RMSNormFunction, "backward", staticmethod(_rmsnorm_dw_doubled))
    rows = run_training(compose(budgets, "float32", backend.name, SIZES["layers"]), "float32", backend.device,
                        steps=2, check_grads=False)
    assert all(r["grad"][0] > 1e3 and r["grad"][1] == "layers.0.input_norm" for r in rows), _report(rows)
    assert all(r["loss"] <= 1 and r["param"][0] <= 1 for r in rows), _report(rows)


# ---------------------------------------------------------------------------------------------
# The pieces of the derivation
# ---------------------------------------------------------------------------------------------

def test_adam_cap_bounds_every_update_and_is_reached():
    """|m_hat| / sqrt(v_hat) <= adam_cap(step) for any gradients (random ones, and the sequence
    that reaches it: g_s proportional to (beta1 / beta2)^(t - s))."""
    (b1, b2), gen = HYPER["betas"], torch.Generator().manual_seed(3)
    for t in range(1, 8):
        cap = adam_cap(t, b1, b2)
        g = torch.cat([torch.randn(t, 5000, generator=gen, dtype=torch.float64),
                       ((b1 / b2) ** torch.arange(t - 1, -1, -1, dtype=torch.float64))[:, None]], 1)
        w1 = (1 - b1) * b1 ** torch.arange(t - 1, -1, -1, dtype=torch.float64)[:, None]
        w2 = (1 - b2) * b2 ** torch.arange(t - 1, -1, -1, dtype=torch.float64)[:, None]
        ratio = ((w1 * g).sum(0) / (1 - b1 ** t)).abs() / ((w2 * g * g).sum(0) / (1 - b2 ** t)).sqrt()
        assert float(ratio.max()) <= cap * (1 + 1e-12)
        assert float(ratio[-1]) == pytest.approx(cap, rel=1e-12)
    assert adam_cap(1, b1, b2) == pytest.approx(1.0)


def test_adamw_bound_holds_for_any_gradients_within_delta():
    """AdamWBound without the kernels: torch's AdamW (float64) fed gradients anywhere within delta
    of the reference's (random, and at the corners +-delta, including sign flips where |g| < delta)
    stays within the bound of the reference's parameters after every step, and the corners reach
    it (the interval arithmetic is exact, not a loose estimate)."""
    gen = torch.Generator().manual_seed(4)
    n, steps = 20000, 6
    p0 = torch.randn(n, generator=gen, dtype=torch.float64)
    star, bound = p0.clone().requires_grad_(), AdamWBound(p0)
    runs = [p0.clone().requires_grad_() for _ in range(3)]
    opt_star, opts = torch.optim.AdamW([star], **HYPER), [torch.optim.AdamW([p], **HYPER) for p in runs]
    for step in range(1, steps + 1):
        g = torch.randn(n, generator=gen, dtype=torch.float64) * torch.logspace(-6, 0, n, dtype=torch.float64)
        delta = 1e-3 * torch.rand(n, generator=gen, dtype=torch.float64)
        before = star.detach().clone()
        star.grad = g
        opt_star.step()
        state = opt_star.state[star]
        bound.step(step, g, delta, state["exp_avg"], state["exp_avg_sq"], before, star.detach(), 0.0)
        noise = [2 * torch.rand(n, generator=gen, dtype=torch.float64) - 1, torch.ones(n, dtype=torch.float64),
                 torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)]
        usage = []
        for p, opt, r in zip(runs, opts, noise):
            p.grad = g + delta * r
            opt.step()
            usage.append(float(((p.detach() - star.detach()).abs() / bound.allowed).max()))
        assert max(usage) <= 1 and usage[1] > 0.99, (step, usage)
    assert float(bound.allowed.max()) > 0.5 * steps * HYPER["lr"]        # where |g| < delta: sign flips allowed


def _hf_weights(config, params: dict) -> dict:
    """models.train.parameters' names and layout -> a Hugging Face Qwen2 state dict."""
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["norm"],
           "lm_head.weight": params["lm_head"]}
    sizes = [config.q_size, config.kv_size, config.kv_size]
    for i in range(config.num_hidden_layers):
        p, hf = f"layers.{i}.", f"model.layers.{i}."
        for n, w, b in zip("qkv", params[p + "qkv_w"].split(sizes), params[p + "qkv_b"].split(sizes)):
            out[hf + f"self_attn.{n}_proj.weight"], out[hf + f"self_attn.{n}_proj.bias"] = w, b
        out.update({hf + "self_attn.o_proj.weight": params[p + "o_w"],
                    hf + "input_layernorm.weight": params[p + "input_norm"],
                    hf + "post_attention_layernorm.weight": params[p + "post_norm"],
                    hf + "mlp.gate_proj.weight": params[p + "gate_w"], hf + "mlp.up_proj.weight": params[p + "up_w"],
                    hf + "mlp.down_proj.weight": params[p + "down_w"]})
    return out


def test_twin_is_transformers_qwen2(backend):
    """The float64 twin (oracles/train.py, written out here) is the model transformers ships: its
    loss and every gradient equal autograd of transformers' float64 Qwen2ForCausalLM
    (oracles/decoder.py: float64 throughout) on the same weights and batch, to float64 roundings."""
    import torch.nn.functional as F
    from oracles.decoder import hf_model

    config, model, ids, labels = _setup("float32", backend.device)
    params = {k: p.detach() for k, p in train.parameters(model).items()}
    ev = twin.evaluate(config, params, ids, labels)
    hf = hf_model(tiny_config(**SIZES), _hf_weights(config, params), device=backend.device)
    loss = F.cross_entropy(hf(ids).logits.reshape(-1, config.vocab_size), labels.reshape(-1))
    loss.backward()
    assert ev.loss == pytest.approx(float(loss.detach()), rel=1e-12)
    hf_grads = _hf_weights(config, {k: p for k, p in ev.grads.items()})
    for name, want in hf_grads.items():
        got = hf.get_parameter(name).grad
        assert float((got - want).abs().max()) <= 1e-11 * float(want.abs().max()), name

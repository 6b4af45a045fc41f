"""GEMM and SwiGLU as PyTorch users write them: F.linear, then the activation, all in the
input dtype (nn.Linear followed by nn.GELU / nn.SiLU / nn.ReLU, or an MLP's gated projection).
SwiGLU's backward is torch.autograd of that forward."""
import torch
import torch.nn.functional as F

_ACT = {
    "none": lambda z: z,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


def matmul(a, w, bias=None, activation="none"):
    return _ACT[activation](F.linear(a, w, bias))


def swiglu(x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    return _ACT[activation](F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up)


def swiglu_backward(dy, x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    """(dx, dw_gate, dw_up, db_gate, db_up) by torch.autograd of swiglu above, in the input dtype."""
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in (x, w_gate, w_up, b_gate, b_up)]
    with torch.enable_grad():
        swiglu(*leaves, activation).backward(dy)
    return tuple(None if t is None else t.grad for t in leaves)

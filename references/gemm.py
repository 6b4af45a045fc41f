"""GEMM and SwiGLU as PyTorch users write them: F.linear, then the activation, all in the
input dtype (nn.Linear followed by nn.GELU / nn.SiLU / nn.ReLU, or an MLP's gated projection)."""
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

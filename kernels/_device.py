"""Device-side helpers shared by the kernels: row offsets and tiles (norms, softmax), bf16
rounding, Kahan sums, activations and their derivatives, and the grouped tile order of the GEMMs (matmul, swiglu,
fp8_matmul)."""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """First thing in a kernel that may be launched with programmatic dependent launch
    (kernels/_launch.py, dependent_launch): wait until the previous kernel in the stream has
    finished and its writes are visible. Nothing before this reads or writes memory. PDL False
    (the interpreter, pre-Hopper GPUs): nothing."""
    if PDL:
        gdc_wait()


@triton.jit
def launch_next_kernel(PDL: tl.constexpr):
    """After a kernel's main work, before its stores: let the next kernel in the stream start
    launching (its programs wait in wait_for_previous_kernel until this one is done). Here and
    not first thing: H200, a Qwen2-1.5B decode step at batch 1, 1350.8 us without PDL, 1364.9
    with this at the start of every kernel (the chain of waiting programs grows, kernel after
    kernel), 1307.3 with none (at each kernel's exit), 1248.8 here (bench/NOTES.md, session 15)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def row_offsets(rows, n1, n2, s0, s1, s2):
    """int64 offset of each flat row index in a (n0, n1, n2) grid of rows with strides s."""
    i2 = rows % n2
    rest = rows // n2
    return (rest // n1) * s0 + (rest % n1) * s1 + i2 * s2


@triton.jit
def load_tile(ptr, row_off, cols, row_ok, n_cols, col_stride, other):
    """Load a [rows, cols] tile as fp32; returns (values, in-bounds mask). Columns are addressed
    in int64: a feature stride times a column index can pass 2^31."""
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    x = tl.load(ptr + row_off[:, None] + cols[None, :].to(tl.int64) * col_stride, mask=mask, other=other)
    return x.to(tl.float32), mask


@triton.jit
def round_to_bf16(x):
    """fp32 -> bf16, round to nearest even, written out in integer ops: the GPU's conversion
    does the same, but Triton's interpreter truncates (and returns wrong values for fp32
    subnormals), so a kernel that stores bf16 through this is exact on both. Values past the
    bf16 range round to infinity. NaN stays NaN: its top bits with the quiet bit set (the carry
    would turn a NaN with only low payload bits into infinity, and so did the interpreter's
    truncating cast)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, (bits >> 16) | 0x40, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def widened(x):
    """A tile as fp32, exactly: bf16 by shifting its bits up (the interpreter's conversion misreads
    bf16 subnormals), other dtypes by the conversion."""
    if x.dtype == tl.bfloat16:
        y = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def rounded_for(x, ptr):
    """fp32 x rounded to nearest (even) in the element type of ptr, for a store: bf16 through
    round_to_bf16 (exact on the interpreter too), other types by the conversion."""
    if ptr.dtype.element_ty == tl.bfloat16:
        y = round_to_bf16(x)
    else:
        y = x.to(ptr.dtype.element_ty)
    return y


@triton.jit
def kahan_add(total, comp, value):
    """One step of compensated (Kahan) summation. The chunked paths add one value per lane per
    chunk; plain fp32 would lose up to (chunks x 2^-24) relative on long rows, Kahan keeps the
    sum at fp32 accuracy for a few more flops, free in a memory-bound loop. Once the sum is
    infinite the compensation (inf - inf) is dropped, so inf propagates as in a plain sum."""
    y = value - comp
    t = total + y
    return t, tl.where(tl.abs(t) < float("inf"), (t - total) - y, 0.0)


@triton.jit
def activate(z, ACT: tl.constexpr):
    """An activation of an fp32 tile: "none", "gelu" (exact: 0.5 z (1 + erf(z / sqrt 2))),
    "gelu_tanh", "silu", "relu". ACT is a constexpr, so only one branch is compiled.
    gelu_tanh is evaluated as z / (1 + exp(-2u)), u = sqrt(2/pi) (z + 0.044715 z^3): the same
    function as 0.5 z (1 + tanh(u)) without its cancellation for negative z, and huge |z| gives z
    or -0 (u overflows to +-inf) rather than inf * 0. Both GELUs take gelu(-inf) = -0, their
    limit (the formulas would give -inf * 0 = NaN)."""
    if ACT == "gelu":
        z = tl.where(z == -float("inf"), -0.0, 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476)))
    elif ACT == "gelu_tanh":
        u = 0.7978845608028654 * (z + 0.044715 * (z * z * z))
        z = tl.where(z == -float("inf"), -0.0, z / (1.0 + tl.exp(-2.0 * u)))
    elif ACT == "silu":
        z = z / (1.0 + tl.exp(-z))
    elif ACT == "relu":
        z = tl.where(z < 0.0, 0.0, z)       # NaN stays NaN (a max() might drop it)
    return z


@triton.jit
def _sigmoid_and_slope(v):
    """(sigmoid(v), sigmoid(v) (1 - sigmoid(v))) of an fp32 tile, from t = exp(-|v|): no overflow
    and no 1 - sigmoid cancellation at either end (v = +-inf gives (1, 0) and (0, 0))."""
    t = tl.exp(-tl.abs(v))
    inv = 1.0 / (1.0 + t)
    return tl.where(v >= 0, inv, t * inv), t * inv * inv


@triton.jit
def activation_grad(z, ACT: tl.constexpr):
    """The derivative act'(z) of activate(z, ACT) on an fp32 tile for the activations that have a
    backward pass here (gelu, gelu_tanh: bias_gelu; silu too: swiglu), at infinities its limit (1
    or 0), NaN at NaN.
    gelu: Phi(z) + z phi(z), Phi = 0.5 (1 + erf(z / sqrt 2)) (which cancels for z below about -3:
    an absolute error of ~2^-25, as in the forward), phi(z) = exp(-z^2 / 2) / sqrt(2 pi).
    gelu_tanh: gelu_tanh(z) = z sigmoid(2u), u = sqrt(2/pi) (z + 0.044715 z^3), so its derivative is
    sigmoid(2u) + 2 z u' sigmoid(2u) (1 - sigmoid(2u)), u' = sqrt(2/pi) (1 + 3 * 0.044715 z^2).
    silu: sigmoid(z) + z sigmoid(z) (1 - sigmoid(z)). Where the slope term sigmoid (1 - sigmoid)
    is 0 (huge |z|) its factor may be infinite: the term is taken as 0 there."""
    if ACT == "gelu":
        pdf_term = tl.where(tl.abs(z) == float("inf"), 0.0, z * (tl.exp(-0.5 * z * z) * 0.3989422804014327))
        g = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476)) + pdf_term
    elif ACT == "gelu_tanh":
        u = 0.7978845608028654 * (z + 0.044715 * (z * z * z))
        s, slope = _sigmoid_and_slope(2.0 * u)
        du = 0.7978845608028654 * (1.0 + 0.134145 * (z * z))
        g = tl.where(slope == 0.0, s, s + (2.0 * z * du) * slope)
    else:
        tl.static_assert(ACT == "silu", "activation_grad: gelu, gelu_tanh or silu")
        s, slope = _sigmoid_and_slope(z)
        g = tl.where(slope == 0.0, s, s + z * slope)
    return g


@triton.jit
def times_activation_grad(up, z, ACT: tl.constexpr):
    """up * act'(z): the chain rule's product, with its limit where an infinite upstream factor
    meets a slope that underflowed to 0 at a very negative finite z (below -5 the gelu, gelu_tanh
    and silu slopes are tiny negatives; fp32, and on a GPU the flush of subnormals to zero, make
    them 0, and inf * 0 would be NaN where the exact product is -up)."""
    g = activation_grad(z, ACT)
    if ACT == "gelu" or ACT == "gelu_tanh" or ACT == "silu":
        lost = (g == 0.0) & (tl.abs(up) == float("inf")) & (z < -5.0) & (z > float("-inf"))
        return tl.where(lost, -up, up * g)
    else:
        return up * g


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of GEMM tile `pid` in grouped order: GROUP_M row tiles x all column
    tiles per group, column-major inside it, so the tiles running at the same time share their
    weight columns in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows_in_group, (pid % per_group) // rows_in_group


@triton.jit
def gemm_tile(a_ptr, w_ptr, M, N, sam, sak, swn, swk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Where GEMM program tl.program_id(0) works (grouped order): its output offsets offs_m,
    offs_n, the K offsets of a tile, the weight rows rn, and the pointers of its first a tile
    [BLOCK_M, BLOCK_K] and w^T tile [BLOCK_K, BLOCK_N] (w stored [N, K]). Rows and columns past
    the end wrap onto valid ones (their results are never stored), so only K needs a load mask.
    Row offsets are int64; within-tile K offsets stay int32 (launchers keep BLOCK_K * stride
    below 2^31)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    a_ptrs = a_ptr + rm[:, None] * sam + offs_k[None, :] * sak
    w_ptrs = w_ptr + rn[None, :] * swn + offs_k[:, None] * swk
    return offs_m, offs_n, offs_k, rm, rn, a_ptrs, w_ptrs

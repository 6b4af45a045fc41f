"""Input validation and layout helpers shared by every launcher.

Launchers validate before they launch: a bad argument raises TypeError or ValueError naming
the argument, what was expected and what was given. They never return a wrong answer. Values
that only the device holds (lengths, page tables, ids) are checked by the kernel that loads
them instead, which reports through an error word (below: `validate=True / "deferred" / False`).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The whole row stays in registers up to this many elements; longer rows loop over chunks.
MAX_FUSED_BLOCK = 16384


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host integers. (triton.cdiv and triton.next_power_of_2 are constexpr
    functions in recent Tritons: each host call unwraps its arguments, microseconds that a
    launcher calling them several times a launch pays on every small call.)"""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n, for host integers (0 for 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


_SM_COUNTS: dict = {}


def sm_count(device) -> int:
    """The number of SMs of a CUDA device (a torch.device, index or name), looked up once."""
    found = _SM_COUNTS.get(device)
    if found is None:
        found = _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return found


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_DEPENDENT_LAUNCH: dict = {}


def dependent_launch(device) -> bool:
    """Whether the kernels that take a PDL flag launch on `device` with programmatic dependent
    launch (Hopper and later): such a kernel may start while the one before it in the stream
    is still finishing, and waits for it (kernels/_device.py, wait_for_previous_kernel) before
    it touches memory. A decode step replays ~250 small kernels back to back; PDL hides part of
    each one's launch (bench/NOTES.md, session 15). KERNELCHECK_PDL=0 turns it off, =1 forces it
    on (scripts/compile_check.py compiles those variants without a GPU)."""
    found = _DEPENDENT_LAUNCH.get(device)
    if found is None:
        forced = os.environ.get("KERNELCHECK_PDL", "")
        if forced in ("0", "1"):
            found = forced == "1"
        else:
            dev = torch.device(device)
            found = (dev.type == "cuda" and not interpreting() and torch.version.cuda is not None
                     and torch.cuda.get_device_capability(dev)[0] >= 9)
        _DEPENDENT_LAUNCH[device] = found
    return found


_PDL_ON, _PDL_OFF = dict(PDL=True, launch_pdl=True), dict(PDL=False, launch_pdl=False)


def pdl_launch(device, enabled: bool = True) -> dict:
    """The launch keywords of a kernel with a PDL flag: the flag and Triton's launch_pdl, both
    dependent_launch(device) (and `enabled`: a launcher's own switch, for benchmarks)."""
    return _PDL_ON if enabled and dependent_launch(device) else _PDL_OFF


def _fmt_dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


# Tensors that a launch reaches through a table of addresses (kernels/adamw.py's tensor lists),
# not as arguments: the interpreter's out-of-bounds guard (harness/oob_guard.py) counts their
# memory as the launch's own while a launcher holds them here.
_through_pointers = threading.local()


@contextlib.contextmanager
def reached_through_pointers(tensors):
    previous = getattr(_through_pointers, "tensors", ())
    _through_pointers.tensors = tuple(tensors)
    try:
        yield
    finally:
        _through_pointers.tensors = previous


def tensors_reached_through_pointers() -> tuple:
    return getattr(_through_pointers, "tensors", ())


def check_tensor(name: str, t, *, dtypes=FLOAT_DTYPES, ndim=None, min_ndim=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        want = ", ".join(_fmt_dtype(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}; got {_fmt_dtype(t.dtype)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d tensor, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if t.is_cpu and not interpreting():
        raise ValueError(f"{name}: is on the CPU; Triton kernels need a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for the interpreter)")


def check_same_device(**tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name}: expected device {first.device} (that of {first_name}), got {t.device}")


def check_same_dtype(**tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: expected dtype {_fmt_dtype(first.dtype)} (that of {first_name}), "
                            f"got {_fmt_dtype(t.dtype)}")


def check_shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


def check_finite(name: str, value, *, positive=False, nonnegative=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value}")
    if nonnegative and value < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value}")
    return value


def check_out(out, shape, dtype, device, name: str = "out") -> None:
    """`out=` buffers must be contiguous with the result's shape, dtype and device."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(out).__name__}")
    check_shape(name, out, shape)
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {_fmt_dtype(dtype)}, got {_fmt_dtype(out.dtype)}")
    if out.device != device:
        raise ValueError(f"{name}: expected device {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {out.stride()}")


# Every buffer a launcher allocates (an output when no out= is given, a split's partial results,
# a workspace) comes from allocate(), so that a test harness can hand out guarded, poisoned
# buffers instead (harness/memory_guard.py): a kernel that reads a partial it never wrote then
# reads NaN, and a store past the buffer lands in a checked margin.
_allocator = None


def set_allocator(allocator):
    """Route allocate() to `allocator(shape, dtype, device, name=, zero=)`, or back to torch
    with None. Returns the previous one."""
    global _allocator
    previous, _allocator = _allocator, allocator
    return previous


def allocate(shape, dtype, device, *, name: str, zero: bool = False) -> torch.Tensor:
    """A contiguous buffer; `zero`: the kernel relies on it starting at zero (a flag, an atomic
    max), otherwise its contents are undefined until the kernel writes them."""
    if _allocator is not None:
        return _allocator(tuple(shape), dtype, device, name=name, zero=zero)
    return (torch.zeros if zero else torch.empty)(tuple(shape), dtype=dtype, device=device)


def new_out(out, shape, dtype, device, name: str = "out") -> torch.Tensor:
    if out is None:
        return allocate(shape, dtype, device, name=name)
    check_out(out, shape, dtype, device, name)
    return out


def collapse_dims(sizes, strides_list):
    """Merge adjacent dims that every tensor in `strides_list` walks as one (row-major order).

    Returns (sizes, [strides per tensor]) with as few dims as the layouts allow; size-1 dims
    drop out. An empty `sizes` means a single row.
    """
    dims = [(s, [st[i] for st in strides_list]) for i, s in enumerate(sizes) if s != 1]
    merged: list = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(ps == s * size for ps, s in zip(pstrides, strides)):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    out_sizes = [m[0] for m in merged]
    out_strides = [[m[1][k] for m in merged] for k in range(len(strides_list))]
    return out_sizes, out_strides


def leading_layout(lead_shape, *tensors_strides, max_dims: int = 3):
    """Describe the leading (row) dims of several same-shaped tensors for a row kernel.

    Kernels address row r as i0*s0 + i1*s1 + i2*s2 with (i0, i1, i2) the digits of r in the
    sizes (n0, n1, n2). Returns (n1, n2, [(s0, s1, s2) per tensor]) or None when the layout needs
    more than `max_dims` dims (the caller then copies to a contiguous tensor).
    """
    sizes, strides = collapse_dims(lead_shape, list(tensors_strides))
    if len(sizes) > max_dims:
        return None
    pad = max_dims - len(sizes)
    sizes = [1] * pad + sizes
    strides = [[0] * pad + s for s in strides]
    return sizes[1], sizes[2], [tuple(s) for s in strides]


def check_count(name: str, value, *, power_of_two: bool = False) -> None:
    """A tiling override (block_rows, row_groups, ...): None, or an int >= 1 (a power of two where
    asked). TypeError for a non-int, ValueError for a bad int; the message names the argument."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1 or (power_of_two and value & (value - 1)):
        raise ValueError(f"{name}: expected {'a power of two' if power_of_two else 'an int'} >= 1, got {value}")


def row_tile(n_cols: int, block_cols: int | None = None, target: int = 2048):
    """Pick (BLOCK_M, BLOCK_N, single_pass, num_warps) for a kernel that reduces along rows.

    Rows up to MAX_FUSED_BLOCK elements are held whole in registers (one read of the input);
    short rows are packed several to a program so each program moves ~`target` elements.
    `block_cols` forces the chunked path with that chunk width (tests use it to exercise the
    loop on small shapes).
    """
    full = next_power_of_2(max(n_cols, 1))
    if block_cols is not None:
        if block_cols < 1 or block_cols & (block_cols - 1):
            raise ValueError(f"block_cols: expected a power of two >= 1, got {block_cols}")
        block_n = min(block_cols, full)
    else:
        block_n = min(full, MAX_FUSED_BLOCK if full <= MAX_FUSED_BLOCK else 4096)
    single = block_n >= n_cols
    block_m = max(1, min(64, target // block_n)) if single else 1
    # 4 warps up to 4096 elements a program, then more: measured best on an H200 at 32768 x 4096
    # bf16 (layernorm 3966 GB/s with 4 warps, 3753 with 8).
    num_warps = min(16, max(4, block_m * block_n // 1024))
    return block_m, block_n, single, num_warps


# ---------------------------------------------------------------------------------------------
# The error word: bad lengths and indices, found by the kernel that loads them
# ---------------------------------------------------------------------------------------------
#
# A kernel that takes lengths or indices from a tensor (decode's seqlens and block table, mla's
# lens and page table, embedding's ids) range-checks each one where it loads it, never forms an
# address from a bad one, writes NaN for the rows it affects, and ORs a bit into (or adds a count
# to) one int32 on the device: the error word. The launchers' `validate` says how the host hears
# of it:
#
#   True        (default) one 4-byte read of the word after the launch, the call's only host
#               sync, then a ValueError naming the argument (its min / max computed only then).
#   "deferred"  no host sync and next to no host work: the call takes the next word of a batch
#               per (device, stream) and notes which launcher it was. A batch's words are copied
#               to pinned host memory together (one non_blocking copy behind a CUDA event) once
#               _BATCH calls have used it, or when a validating call finds it open for longer
#               than _BATCH_SECONDS. A validating call (True or "deferred") looks at the batches
#               at most once per _BATCH_SECONDS (a clock read otherwise) and raises the ValueError
#               of a deferred call, naming that launcher and the argument, once its batch has
#               landed: a few milliseconds after the bad call's kernel ran. A deferred call
#               costs the host about what validate=False does (a per-call copy and event cost
#               up to 85 us on the H200's host, more than the embedding kernel itself).
#               raise_deferred_errors() sends what is open, waits for every batch and raises.
#               On the CPU (the interpreter) every call is a batch of its own, copied at once,
#               and every validating call looks: the next one raises.
#   False       nothing is read; the bad rows are NaN all the same.
#
# CUDA graphs: validate=True cannot be captured (ValueError naming validate). A captured
# "deferred" call is given a word of its own, kept for the graph's life and never zeroed by it,
# so the errors of every replay add up; raise_deferred_errors() synchronises, reads all such
# words in one copy per device and zeroes those it reports. The words come from a pool that the
# first eager validating call on the device sets up (the warm-up before a capture); a capture
# with no pool yet gets a word zeroed by a node of the graph, which keeps the last replay's
# errors only.
#
# The words: validate=True uses one cached word per (device, stream), zero between calls (it is
# zeroed only after a nonzero read). A deferred batch's words are zeroed by one fill behind its
# copy, in stream order, and the batch is reused once its copy has been read (a stream holds a
# few batches while the GPU runs behind the host; past _MAX_BATCHES the oldest is waited for).
# validate=False calls write into a word of their own that nobody reads. While a test harness
# routes allocate() (harness/memory_guard.py), every call gets a fresh, guarded, zeroed word
# instead, copied at once as a batch of one.

VALIDATE_MODES = (True, False, "deferred")
_GRAPH_WORDS = 1024         # words per device for captured "deferred" calls
_BATCH = 128                # words per batch of eager "deferred" calls
_BATCH_SECONDS = 0.002      # an open batch older than this is sent by the next look
_MAX_BATCHES = 16           # batches per (device, stream) before the oldest copy is waited for

_words: dict = {}           # (device, stream) -> the cached word of validate=True calls
_streams: dict = {}         # (device, stream) -> _Stream: the batches of its "deferred" calls
_sinks: dict = {}           # device -> the word of validate=False calls
_graph_pools: dict = {}     # device -> [zeroed int32 pool, words handed out]
_pending: deque = deque()   # _Batch records sent (copy queued), not read yet, oldest first
_graph_words: list = []     # _Deferred records of captured calls (read by raise_deferred_errors)
_slots: dict = {}           # id(word view) -> (_Batch, index) of the open batches' words
_lock = threading.Lock()
_next_look = [0.0]          # time.monotonic() before which validating calls do not look


@dataclass
class _Deferred:
    launcher: str
    problems: object        # problems(value) -> [(argument, expected)]; holds no tensor of the call
    host: torch.Tensor      # the device word of a captured call


class _Batch:
    """Words of deferred calls copied to the host together. calls[i]: (launcher, problems) of
    word i (None until its launcher reports); host: their pinned copy; event: recorded behind
    the copy (None on the CPU: landed)."""

    def __init__(self, device, n, owner=None, words=None):
        cuda = device.type == "cuda"
        self.device, self.owner = device, owner
        self.stream = owner.stream if owner is not None else None
        self.words = _zeros(n, device) if words is None else words
        self.views = [self.words[i:i + 1] for i in range(n)]
        self.host = torch.zeros((n,), dtype=torch.int32, pin_memory=cuda)
        self.event = torch.cuda.Event() if cuda else None
        self.calls: list = []
        self.opened = 0.0

    def send(self) -> None:
        """Queue the copy of the words used, the event behind it and the fill that zeroes them."""
        n = len(self.calls)
        with torch.cuda.stream(self.stream) if self.stream is not None else _no_context():
            self.host[:n].copy_(self.words[:n], non_blocking=True)     # synchronous on the CPU
            if self.event is not None:
                self.event.record()
            self.words[:n].zero_()
        _pending.append(self)
        if self.event is None:
            _next_look[0] = 0.0                     # the CPU: the next validating call looks

    def landed(self) -> bool:
        return self.event is None or self.event.query()

    def read(self) -> list:
        """(call, value) of the nonzero words; the batch is empty again."""
        if self.event is not None:
            self.event.synchronize()
        values = self.host[:len(self.calls)].tolist()
        found = [(c, v) for c, v in zip(self.calls, values) if v and c is not None]
        self.calls = []
        return found


class _Stream:
    """The deferred batches of one (device, stream): the open one and the free ones."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.open = None
        self.free: list = []
        self.count = 0

    def take(self) -> torch.Tensor:
        b = self.open
        if b is not None and len(b.calls) == _BATCH:
            b.send()
            b = self.open = None
        if b is None:
            if self.free:
                b = self.free.pop()
            elif self.count < _MAX_BATCHES:
                b = _Batch(self.device, _BATCH, owner=self)
                self.count += 1
            else:                                   # the GPU runs far behind: wait for the oldest
                b = _read_oldest_of(self)
            b.opened = time.monotonic()
            self.open = b
        i = len(b.calls)
        b.calls.append(None)
        word = b.views[i]
        _slots[id(word)] = (b, i)
        return word


class _no_context:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_found: list = []           # (call, value) read but not raised yet (a read forced inside take())


def _read_oldest_of(stream: _Stream) -> _Batch:
    """Every batch of `stream` is in flight: wait for the oldest, keep its errors for the next
    look, and hand it back for reuse."""
    for b in list(_pending):
        if b.owner is stream:
            _pending.remove(b)
            _found.extend(b.read())
            if _found:
                _next_look[0] = 0.0
            return b
    raise RuntimeError("no deferred batch of this stream is in flight")   # unreachable: count are


def check_validate(validate) -> None:
    """validate must be True, False or "deferred". A validating call (True or "deferred") first
    raises the error of an earlier deferred call whose batch has landed (looking at most once per
    _BATCH_SECONDS on a GPU, every call on the CPU)."""
    if validate is not True and validate is not False and not isinstance(validate, str):
        raise TypeError(f"validate: expected True, False or \"deferred\", got {type(validate).__name__}")
    if validate not in VALIDATE_MODES:
        raise ValueError(f"validate: expected True, False or \"deferred\", got {validate!r}")
    if validate is not False and (_pending or _streams or _found):
        now = time.monotonic()
        if now >= _next_look[0]:
            _look(now, sync=False)


def _capturing(device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _stream_key(device):
    if device.type != "cuda":
        return (device, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (index, torch._C._cuda_getCurrentRawStream(index))


def _zeros(n, device):
    return torch.zeros((n,), dtype=torch.int32, device=device)


def error_word(device, validate) -> torch.Tensor:
    """The zeroed int32 word ([1], on `device`) the kernels of this call set."""
    device = torch.device(device)
    if _capturing(device):
        if validate is True:
            raise ValueError("validate: True reads the error word back on the host, which a CUDA graph "
                             "capture cannot do; pass \"deferred\" (then kernels.raise_deferred_errors() "
                             "after replays) or False")
        if validate == "deferred":
            with _lock:
                pool = _graph_pools.get(device)
                if pool is None or pool[1] == _GRAPH_WORDS:
                    return _zeros(1, device)
                pool[1] += 1
                return pool[0][pool[1] - 1:pool[1]]
    if _allocator is not None:
        return allocate((1,), torch.int32, device, name="error_word", zero=True)
    if validate is False:
        word = _sinks.get(device)
        if word is None:
            word = _sinks[device] = _zeros(1, device)
        return word
    if device.type == "cuda" and device not in _graph_pools:
        _graph_pools[device] = [_zeros(_GRAPH_WORDS, device), 0]
    key = _stream_key(device)
    if validate is True:
        word = _words.get(key)
        if word is None:
            word = _words[key] = _zeros(1, device)
        return word
    with _lock:
        stream = _streams.get(key)
        if stream is None:
            stream = _streams[key] = _Stream(device)
        return stream.take()


def report_errors(word: torch.Tensor, validate, launcher: str, problems, detail=None) -> None:
    """After the launch: raise (True), note the call in its batch ("deferred"), or nothing (False).

    problems(value) -> [(argument, what was expected)] for a nonzero word; it may run after the
    call has returned ("deferred"), so it must not hold the call's tensors. detail(argument) ->
    the tail of the immediate error (", got min .. max .."), computed only on that error path."""
    if validate is False:
        return
    device = word.device
    if validate is True:
        value = int(word.item())                    # the host sync
        if value:
            word.zero_()
            raise ValueError("; ".join(f"{arg}: {what}{detail(arg) if detail else ''}"
                                       for arg, what in problems(value)))
        return
    if _capturing(device):
        with _lock:
            _graph_words.append(_Deferred(launcher, problems, word))
        return
    with _lock:
        slot = _slots.pop(id(word), None)
        if slot is None:                            # a guarded word of its own: a batch of one
            b = _Batch(device, 1, words=word)
            b.calls.append((launcher, problems))
            b.send()
            return
        b, i = slot
        b.calls[i] = (launcher, problems)
        if b.event is None and b is b.owner.open:   # the CPU: each call a batch of its own
            b.owner.open = None
            b.send()


def raise_deferred_errors() -> None:
    """Send every open batch, wait for all of them and raise the ValueError of the first deferred
    check (validate="deferred") that found a bad argument, naming its launcher and the argument
    (how many others found one is in the message). What is read is dropped (a captured word is
    zeroed), so an error is raised once. Words of CUDA graphs are read after a synchronize of
    their device: call this after replays."""
    _look(time.monotonic(), sync=True)


def _look(now: float, sync: bool) -> None:
    """Read the batches that have landed (sync: all of them, after sending the open ones; and the
    words of captured calls), free them, and raise the first error found."""
    if not sync and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return                                      # no event queries inside a capture
    found = []
    with _lock:
        _next_look[0] = now + _BATCH_SECONDS
        found, _found[:] = list(_found), []
        for stream in _streams.values():            # open batches past their time (or all: sync)
            b = stream.open
            if b is not None and b.calls and (sync or stream.stream is None or now - b.opened >= _BATCH_SECONDS):
                stream.open = None
                b.send()
        while _pending and (sync or _pending[0].landed()):
            b = _pending.popleft()
            found += b.read()
            if b.owner is not None:
                b.owner.free.append(b)
        captured = list(_graph_words) if sync else []
    snapshots = {}                                  # one copy per pool (and per lone word)
    for p in captured:
        base = p.host._base if p.host._base is not None else p.host
        if id(base) not in snapshots:
            if base.device.type == "cuda":
                torch.cuda.synchronize(base.device)
            snapshots[id(base)] = base.cpu()
        offset = p.host.storage_offset() - base.storage_offset()
        value = int(snapshots[id(base)][offset])
        if value:
            p.host.zero_()
            found.append(((p.launcher, p.problems), value))
    if found:
        (launcher, problems), value = found[0]
        more = f" ({len(found) - 1} more deferred check(s) found bad input too)" if len(found) > 1 else ""
        raise ValueError("; ".join(f"{arg}: {what}, in an earlier {launcher} call with validate=\"deferred\" "
                               f"(the rows it affects are NaN)" for arg, what in problems(value)) + more)


# Lengths and page tables (decode_attention, mla_decode): the kernels OR these bits into the word.
BAD_LENGTH, BAD_PAGE = 1, 2


def paged_problems(lens_name, table_name, noun, capacity, num_pages, value):
    """problems() of a length / page-table kernel's word (ints only: it may run deferred)."""
    found = []
    if value & BAD_LENGTH:
        found.append((lens_name, f"expected lengths in [0, {capacity}] (the cache's capacity)"))
    if value & BAD_PAGE:
        found.append((table_name, f"expected {noun} indices in [0, {num_pages}) for the positions in use"))
    return found


def _used_pages(lens, table, page_size):
    """The table's entries for positions below each length, int64, flat."""
    used = torch.arange(table.shape[1], device=table.device)[None, :] * page_size < lens.to(torch.int64)[:, None]
    return table.to(torch.int64)[used]


def paged_detail(lens, table, page_size, lens_name, argument):
    """', got min .. max ..' of the lengths or of the page indices in use: the error path's torch ops."""
    values = lens.to(torch.int64) if argument == lens_name else _used_pages(lens, table, page_size)
    if values.numel() == 0:
        return ""
    lo, hi = (int(v) for v in torch.aminmax(values))
    return f", got min {lo} max {hi}"


def paged_host_word(lens, table, page_size, capacity, num_pages):
    """The word a launch would set, from torch ops on the host (for a call with nothing to launch)."""
    lengths = lens.to(torch.int64)
    value = BAD_LENGTH if bool(((lengths < 0) | (lengths > capacity)).any()) else 0
    if table is not None:
        pages = _used_pages(lengths.clamp(0, capacity), table, page_size)
        value |= BAD_PAGE if bool(((pages < 0) | (pages >= num_pages)).any()) else 0
    return torch.tensor([value], dtype=torch.int32)


@triton.jit
def bad_pages(table_ptr, row_offset, st_p, lo, hi, page_size, num_pages, BLOCK_P: tl.constexpr):
    """1 if a page index of the positions [lo, hi) of one table row (entries at row_offset +
    i * st_p) lies outside [0, num_pages), else 0: the kernels check a split's pages before they
    use any, a vector of BLOCK_P entries at a time, apart from the loop that reads the cache (a
    check inside that loop, on the loaded indices, cost 7-11% of paged decode on an H200)."""
    offs = tl.arange(0, BLOCK_P)
    last = (hi + page_size - 1) // page_size
    bad = tl.zeros([BLOCK_P], tl.int32)
    for first in range(lo // page_size, last, BLOCK_P):
        idx = first + offs
        in_use = idx < last
        page = tl.load(table_ptr + row_offset + idx.to(tl.int64) * st_p, mask=in_use, other=0)
        bad = bad | (in_use & ((page < 0) | (page >= num_pages))).to(tl.int32)
    return tl.max(bad, axis=0)


@triton.jit
def merge_splits(part_ptr, m_ptr, l_ptr, num_splits, sp_s, width, qk_scale, BLOCK_S: tl.constexpr,
                 BLOCK_W: tl.constexpr):
    """The exact merge of one row's split softmaxes (decode_attention's and mla_decode's combine
    kernels): splits s = 0 .. num_splits - 1 left a normalised fp32 partial at part_ptr + s sp_s
    (width values), their raw max score m_s at m_ptr + s and sum l_s at l_ptr + s. Returns (out,
    total, ref): out = sum_s w_s o_s / total with w_s = l_s 2^((m_s - ref) qk_scale), total =
    sum_s w_s, ref = max m (0 if every split saw nothing, then w_s = 0 and out = 0)."""
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    offs = tl.arange(0, BLOCK_W)
    m_s = tl.load(m_ptr + s, mask=s_ok, other=-float("inf"))
    l_s = tl.load(l_ptr + s, mask=s_ok, other=0.0)
    m = tl.max(m_s, axis=0)
    ref = tl.where(m == -float("inf"), 0.0, m)
    w = l_s * tl.exp2((m_s - ref) * qk_scale)
    parts = tl.load(part_ptr + s[:, None] * sp_s + offs[None, :], mask=s_ok[:, None] & (offs < width)[None, :],
                    other=0.0)
    total = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * parts, axis=0)
    out = tl.where(total == 0.0, 0.0, out / total)
    return out, total, ref

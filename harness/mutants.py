"""Mutants of the Triton kernels: which small changes to a kernel body the suite should notice.

`enumerate_mutants(path)` parses a kernel file, finds the bodies of its jit functions (decorated
with `@triton.jit`, or undecorated and jitted by a module-level call: `K = triton.jit(fn)`,
`K = triton.jit(**options)(fn)`, or `K = make(fn)` where `make` is a function of the same
module that calls triton.jit) and lists one mutant per single change:

    cmp-boundary  <  <=  >  >= to their off-by-one neighbour (mask bounds: cols < n -> cols <= n)
    cmp-negate    a comparison to its negation (< -> >=, == -> !=)
    arith         + <-> -, * <-> /, // <-> % (also in augmented assignments)
    mask-logic    & <-> |
    int-const     an integer literal +1 and -1
    load-other    the value of masked-off lanes: `other=` of tl.load, or an `other` parameter of a
                  jit helper (0 -> 1.0, -inf -> 0.0, anything else -> 0.0)
    cast-drop     x.to(T) -> x
    cast-change   x.to(tl.float32) -> x.to(tl.float16), int64 -> int32, ... (literal dtypes only)
    where-swap    tl.where(c, a, b) -> tl.where(c, b, a)
    min-max       tl.minimum <-> tl.maximum, tl.max <-> tl.min
    exp-log       tl.exp <-> tl.exp2, tl.log <-> tl.log2
    offset        the pointer of a tl.load / tl.store one element further (p -> p + 1)
    loop-bound    range(a, b, s): b -> b - 1, b -> b + 1, a -> a + 1

A mutant is a list of byte-range edits of the file's text, made at the nodes' own offsets, so
the mutated file equals the original outside those ranges (comments, layout and line numbers
stay put). Its id hashes what the change is and where it is *logically*: the file, the
enclosing function, the kind, the changed expression before and after (normalised by
`ast.unparse`), the statement around it (only its header for `if` / `for` / `while`) and the
occurrence among identical mutants of that function. Lines moving elsewhere in the file leave
the id unchanged; editing the statement itself changes it, as it should.

`ops_using(path, function)` says which registered ops run a kernel function, from the source:
op classes in harness/ops/*.py call launchers `kernels.NAME`, launchers launch kernels, kernels
call jit helpers (kernels/_device.py); a module-level name bound to a jitted body (`K =
make(fn)`) leads to that body; an op module that imports `models` (the decoder) uses every
launcher models/ calls.
"""
from __future__ import annotations

import ast
import hashlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KINDS = ("cmp-boundary", "cmp-negate", "arith", "mask-logic", "int-const", "load-other", "cast-drop",
         "cast-change", "where-swap", "min-max", "exp-log", "offset", "loop-bound")


class MutationError(ValueError):
    pass


@dataclass(frozen=True)
class Edit:
    start: int      # byte offsets into the file
    end: int
    text: str       # what replaces data[start:end]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str       # repository-relative, with "/"
    function: str
    line: int       # of the first changed byte
    kind: str
    before: str     # the changed expression, before and after (whitespace collapsed)
    after: str
    edits: tuple

    def apply(self, source: bytes) -> bytes:
        """The mutated file: `source` with this mutant's edits, every other byte unchanged."""
        out = source
        for e in sorted(self.edits, key=lambda e: e.start, reverse=True):
            out = out[:e.start] + e.text.encode() + out[e.end:]
        return out

    @property
    def change(self) -> str:
        return f"{self.before} -> {self.after}"


# --- the tables of changes -----------------------------------------------------------------

_CMP_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_CMP_BOUNDARY = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_CMP_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_BIN_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
               ast.BitAnd: "&", ast.BitOr: "|"}
_ARITH = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "%", "%": "//"}
_LOGIC = {"&": "|", "|": "&"}
_RENAME = {"minimum": ("maximum", "min-max"), "maximum": ("minimum", "min-max"),
           "max": ("min", "min-max"), "min": ("max", "min-max"),
           "exp": ("exp2", "exp-log"), "exp2": ("exp", "exp-log"),
           "log": ("log2", "exp-log"), "log2": ("log", "exp-log")}
# A cast's neighbouring dtype: narrower floats lose accuracy, int32 overflows on large offsets.
_CAST_TO = {"float32": "float16", "float16": "float32", "bfloat16": "float32", "float64": "float32",
            "int64": "int32", "int32": "int64"}
_LOOPS = {"range", "tl.range", "tl.static_range"}
_OP_CHARS = set(b"<>=!+-*/%&|^@")


def _dotted(node) -> str | None:
    """'tl.where' for the expression tl.where, 'range' for range; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


_JIT = ("triton.jit", "jit")


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if _dotted(target) in _JIT:
            return True
    return False


def _jitted_at_module_level(tree: ast.Module) -> set:
    """Names of the module's undecorated functions that a module-level statement jits: passes to
    triton.jit(fn) or triton.jit(**options)(fn), or to a function of the module that calls
    triton.jit itself (a factory that jits one body several times)."""
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    factories = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                 and any(isinstance(c, ast.Call) and _dotted(c.func) in _JIT for s in n.body for c in ast.walk(s))}
    out = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for call in (c for c in ast.walk(stmt) if isinstance(c, ast.Call)):
            callee = call.func.func if isinstance(call.func, ast.Call) else call.func     # triton.jit(...)(fn)
            if _dotted(callee) in _JIT or (isinstance(callee, ast.Name) and callee.id in factories):
                out |= {a.id for a in call.args if isinstance(a, ast.Name) and a.id in functions}
    return out


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _normal(text: str) -> str:
    """Source text in a layout-free form (for ids): ast.unparse where it parses."""
    for mode in ("eval", "exec"):
        try:
            return ast.unparse(ast.parse(text, mode=mode))
        except SyntaxError:
            pass
    return _collapse(text)


def _statement_key(stmt: ast.stmt) -> str:
    """The statement a mutant sits in, for its id: a compound statement by its header only, so
    that edits inside its body leave the ids of its condition's mutants alone."""
    if isinstance(stmt, (ast.If, ast.While)):
        return f"{type(stmt).__name__.lower()} {ast.unparse(stmt.test)}"
    if isinstance(stmt, ast.For):
        return f"for {ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}"
    if isinstance(stmt, ast.With):
        return "with " + ", ".join(ast.unparse(i) for i in stmt.items)
    return ast.unparse(stmt)


def _plus_one_safe(node) -> bool:
    """True when `<node text> + 1` parses as (node) + 1 without parentheses."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.UnaryOp)):
        return True
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, (int, float)) or node.value >= 0
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
                                                                ast.Mod, ast.Pow, ast.MatMult))


def _neg_inf(node) -> bool:
    """-float("inf") or float("-inf")."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        return (isinstance(inner, ast.Call) and _dotted(inner.func) == "float" and len(inner.args) == 1
                and isinstance(inner.args[0], ast.Constant) and str(inner.args[0].value).lower() in ("inf", "infinity"))
    return (isinstance(node, ast.Call) and _dotted(node.func) == "float" and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).lower() in ("-inf", "-infinity"))


def _other_after(node) -> str:
    if _neg_inf(node):
        return "0.0"
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value == 0:
        return "1.0"
    return "0.0"


# --- the source and its byte offsets ---------------------------------------------------------

class _Source:
    def __init__(self, data: bytes):
        self.data = data
        self.line_starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]

    def start(self, node) -> int:
        return self.line_starts[node.lineno - 1] + node.col_offset

    def end(self, node) -> int:
        return self.line_starts[node.end_lineno - 1] + node.end_col_offset

    def text(self, node_or_start, end: int | None = None) -> str:
        if end is None:
            return self.data[self.start(node_or_start):self.end(node_or_start)].decode()
        return self.data[node_or_start:end].decode()

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def operator(self, start: int, end: int, symbol: str) -> tuple[int, int]:
        """The span of the operator token `symbol` in data[start:end], the gap between two
        operands (which may also hold parentheses, line breaks and comments)."""
        data, i = self.data, start
        while i < end:
            c = data[i]
            if c in b" \t\r\n\f()\\":
                i += 1
            elif c == 0x23:                                  # a comment: to the end of its line
                while i < end and data[i] != 0x0A:
                    i += 1
            else:
                j = i
                while j < end and data[j] in _OP_CHARS:
                    j += 1
                if data[i:j].decode() != symbol:
                    raise MutationError(f"expected {symbol!r} at byte {i}, found {data[i:j + 1]!r}")
                return i, j
        raise MutationError(f"no {symbol!r} between bytes {start} and {end}")


# --- enumeration -------------------------------------------------------------------------------

@dataclass
class _Draft:
    kind: str
    shown: ast.AST          # the expression (or statement) shown as before -> after
    edits: tuple
    before: str | None = None   # set where the shown text is not the node's own source
    after: str | None = None


class _Collector:
    """The drafts of one jit function, in source order."""

    def __init__(self, src: _Source, helper_params: dict):
        self.src = src
        self.helper_params = helper_params      # jit function name -> its parameter names
        self.drafts: list[tuple[_Draft, ast.stmt]] = []

    def add(self, draft: _Draft, stmt: ast.stmt):
        self.drafts.append((draft, stmt))

    def visit_function(self, fn: ast.FunctionDef):
        body = fn.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]                                   # the docstring
        for stmt in body:
            self._statement(stmt)

    def _statement(self, stmt: ast.stmt):
        # The expressions that belong to this statement itself; nested statements recurse.
        if isinstance(stmt, (ast.If, ast.While)):
            own = [stmt.test]
        elif isinstance(stmt, ast.For):
            own = [stmt.iter]
            self._loop_bounds(stmt)
        elif isinstance(stmt, ast.AnnAssign):
            own = [stmt.value] if stmt.value is not None else []     # never the annotation
        elif isinstance(stmt, ast.AugAssign):
            own = [stmt.target, stmt.value]
            self._aug_assign(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            own = []
        else:
            own = [child for child in ast.iter_child_nodes(stmt) if isinstance(child, ast.expr)]
        parents = {}
        for root in own:
            for node in ast.walk(root):
                for child in ast.iter_child_nodes(node):
                    parents[child] = node
            for node in ast.walk(root):
                self._expression(node, stmt, parents)
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.stmt):
                self._statement(child)
        for handler in getattr(stmt, "handlers", ()):
            for child in handler.body:
                self._statement(child)

    def _expression(self, node, stmt, parents):
        src = self.src
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                symbol = _CMP_SYMBOL.get(type(op))
                if symbol is not None:
                    span = src.operator(src.end(left), src.start(right), symbol)
                    for kind, table in (("cmp-boundary", _CMP_BOUNDARY), ("cmp-negate", _CMP_NEGATE)):
                        if symbol in table:
                            self.add(_Draft(kind, node, (Edit(*span, table[symbol]),)), stmt)
                left = right
        elif isinstance(node, ast.BinOp):
            symbol = _BIN_SYMBOL.get(type(node.op))
            for kind, table in (("arith", _ARITH), ("mask-logic", _LOGIC)):
                if symbol in table:
                    span = src.operator(src.end(node.left), src.start(node.right), symbol)
                    self.add(_Draft(kind, node, (Edit(*span, table[symbol]),)), stmt)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            shown = self._shown_around(node, parents)
            for delta in (1, -1):
                self.add(_Draft("int-const", shown, (Edit(src.start(node), src.end(node), str(node.value + delta)),)),
                         stmt)
        elif isinstance(node, ast.Call):
            self._call(node, stmt)

    @staticmethod
    def _shown_around(node, parents):
        """The expression a literal is shown in: its nearest enclosing expression that is more
        than a sign or a keyword argument."""
        shown = parents.get(node, node)
        while isinstance(shown, (ast.UnaryOp, ast.keyword)) and shown in parents:
            shown = parents[shown]
        return shown if isinstance(shown, ast.expr) else node

    def _call(self, call: ast.Call, stmt):
        src = self.src
        name = _dotted(call.func)
        short = name.rsplit(".", 1)[-1] if name else None
        # tl.minimum <-> tl.maximum, tl.exp <-> tl.exp2, ... (also under tl.math)
        if name and name.startswith("tl.") and short in _RENAME:
            new, kind = _RENAME[short]
            end = src.end(call.func)
            self.add(_Draft(kind, call, (Edit(end - len(short.encode()), end, new),)), stmt)
        if name == "tl.where" and len(call.args) == 3:
            a, b = call.args[1], call.args[2]
            self.add(_Draft("where-swap", call, (Edit(src.start(a), src.end(a), src.text(b)),
                                                  Edit(src.start(b), src.end(b), src.text(a)))), stmt)
        if name in ("tl.load", "tl.store") and call.args:
            ptr = call.args[0]
            edits = ((Edit(src.end(ptr), src.end(ptr), " + 1"),) if _plus_one_safe(ptr) else
                     (Edit(src.start(ptr), src.start(ptr), "("), Edit(src.end(ptr), src.end(ptr), ") + 1")))
            text = _collapse(src.text(ptr))
            self.add(_Draft("offset", call, edits, f"{name}({text}, ...)", f"{name}({text} + 1, ...)"), stmt)
        self._load_other(call, name, stmt)
        if isinstance(call.func, ast.Attribute) and call.func.attr == "to" and (call.args or call.keywords):
            self._cast(call, stmt)

    def _load_other(self, call: ast.Call, name: str | None, stmt):
        src = self.src
        value = next((k.value for k in call.keywords if k.arg == "other"), None)
        if value is None and name in self.helper_params:
            params = self.helper_params[name]
            if "other" in params and params.index("other") < len(call.args):
                value = call.args[params.index("other")]
        if value is None or (name != "tl.load" and name not in self.helper_params):
            return
        after = _other_after(value)
        before = _collapse(src.text(value))
        self.add(_Draft("load-other", call, (Edit(src.start(value), src.end(value), after),),
                        f"{name}(..., other={before})", f"{name}(..., other={after})"), stmt)

    def _cast(self, call: ast.Call, stmt):
        src = self.src
        # x.to(T) -> x: remove from the "." before `to` to the closing parenthesis.
        attr_end = src.end(call.func)
        dot = src.data.rindex(b".", src.end(call.func.value), attr_end)
        self.add(_Draft("cast-drop", call, (Edit(dot, src.end(call), ""),)), stmt)
        dtype = call.args[0] if call.args else None
        bitcast = any(k.arg == "bitcast" for k in call.keywords)
        target = _dotted(dtype) if dtype is not None else None
        if target and target.startswith("tl.") and target[3:] in _CAST_TO and not bitcast:
            self.add(_Draft("cast-change", call, (Edit(src.start(dtype), src.end(dtype), "tl." + _CAST_TO[target[3:]]),)),
                     stmt)

    def _loop_bounds(self, loop: ast.For):
        src, it = self.src, loop.iter
        if not (isinstance(it, ast.Call) and _dotted(it.func) in _LOOPS and it.args):
            return
        start, stop = (None, it.args[0]) if len(it.args) == 1 else (it.args[0], it.args[1])
        bounds = [(stop, " - 1"), (stop, " + 1")]
        if start is not None and not isinstance(start, ast.Constant):
            bounds.append((start, " + 1"))        # a literal start is already an int-const mutant
        for node, tail in bounds:
            edits = ((Edit(src.end(node), src.end(node), tail),) if _plus_one_safe(node) else
                     (Edit(src.start(node), src.start(node), "("), Edit(src.end(node), src.end(node), ")" + tail)))
            self.add(_Draft("loop-bound", it, edits), loop)

    def _aug_assign(self, stmt: ast.AugAssign):
        src = self.src
        symbol = _BIN_SYMBOL.get(type(stmt.op))
        for kind, table in (("arith", _ARITH), ("mask-logic", _LOGIC)):
            if symbol in table:
                span = src.operator(src.end(stmt.target), src.start(stmt.value), symbol + "=")
                self.add(_Draft(kind, stmt, (Edit(*span, table[symbol] + "="),)), stmt)


def _shown_text(src: _Source, draft: _Draft) -> tuple[str, str]:
    """(before, after) of the shown node: its source, and the same with the edits applied."""
    start, end = src.start(draft.shown), src.end(draft.shown)
    before = src.text(start, end)
    after = before.encode()
    for e in sorted(draft.edits, key=lambda e: e.start, reverse=True):
        if not start <= e.start <= e.end <= end:
            raise MutationError(f"an edit at bytes {e.start}-{e.end} lies outside the shown node {start}-{end}")
        after = after[:e.start - start] + e.text.encode() + after[e.end - start:]
    return _collapse(before), _collapse(after.decode())


def relative(path: Path | str, root: Path = ROOT) -> str:
    p = Path(path)
    if not p.is_absolute():
        p = Path.cwd() / p
    try:
        return p.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return p.resolve().as_posix()


def jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module's jit function bodies, in source order: decorated, or jitted by a module-level call."""
    jitted = _jitted_at_module_level(tree)
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and (_is_jit(n) or n.name in jitted)]


def _helper_params(tree: ast.Module, path: Path) -> dict:
    """Parameter names of the jit functions a kernel body may call: its own module's and the
    helpers it imports from other kernel modules (kernels/_device.py)."""
    params = {fn.name: [a.arg for a in fn.args.args] for fn in jit_functions(tree)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernels."):
            other = path.parent / (node.module.split(".", 1)[1].replace(".", "/") + ".py")
            if other.is_file() and other.resolve() != path.resolve():
                theirs = {fn.name: [a.arg for a in fn.args.args]
                          for fn in jit_functions(ast.parse(other.read_bytes()))}
                for alias in node.names:
                    if alias.name in theirs:
                        params[alias.asname or alias.name] = theirs[alias.name]
    return params


def enumerate_mutants(path: Path | str, source: bytes | None = None, root: Path = ROOT) -> list[Mutant]:
    """Every mutant of the jit function bodies of one file (jit_functions), in source order."""
    path = Path(path)
    data = path.read_bytes() if source is None else source
    tree = ast.parse(data)
    src = _Source(data)
    rel = relative(path, root)
    helper_params = _helper_params(tree, path)
    out = []
    for fn in jit_functions(tree):
        collector = _Collector(src, helper_params)
        collector.visit_function(fn)
        drafts = sorted(collector.drafts, key=lambda d: (min(e.start for e in d[0].edits), d[0].kind))
        seen = Counter()
        for draft, stmt in drafts:
            shown_before, shown_after = _shown_text(src, draft)
            before = draft.before if draft.before is not None else shown_before
            after = draft.after if draft.after is not None else shown_after
            key = (rel, fn.name, draft.kind, _normal(before), _normal(after), _statement_key(stmt))
            seen[key] += 1
            digest = hashlib.sha256("\x00".join((*key, str(seen[key]))).encode()).hexdigest()[:10]
            first = min(e.start for e in draft.edits)
            out.append(Mutant(digest, rel, fn.name, src.line_of(first), draft.kind, before, after, draft.edits))
    ids = Counter(m.id for m in out)
    if any(n > 1 for n in ids.values()):
        raise MutationError(f"{rel}: mutant ids collide: {[i for i, n in ids.items() if n > 1]}")
    return out


# --- which ops run which kernel function -------------------------------------------------------

def _names_in(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _kernels_attrs(node) -> set:
    """NAME of every `kernels.NAME` in a subtree."""
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "kernels"}


def _imports_models(node) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom) and n.module and (n.module == "models" or n.module.startswith("models.")):
            return True
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "models" for a in n.names):
            return True
    return False


def _op_marks(decorators) -> set:
    """The ops of `pytest.mark.op("name")` decorators (names given as constants)."""
    ops = set()
    for d in decorators:
        if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "op"
                and _dotted(d.func.value) == "pytest.mark" and d.args and isinstance(d.args[0], ast.Constant)):
            ops.add(d.args[0].value)
    return ops


def _marked_tests_uses(root: Path) -> dict:
    """op -> NAME of every `kernels.NAME` that the tests marked with that op use, in their own body
    or in the module's functions they call."""
    out = defaultdict(set)
    for path in sorted((root / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_bytes())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for fn in functions.values():
            ops = _op_marks(fn.decorator_list)
            if not ops:
                continue
            todo, done, uses = [fn], set(), set()
            while todo:
                node = todo.pop()
                if node.name in done:
                    continue
                done.add(node.name)
                uses |= _kernels_attrs(node)
                todo += [functions[n] for n in _names_in(node) if n in functions]
            for op in ops:
                out[op] |= uses
    return out


@lru_cache(maxsize=4)
def op_map(root: Path = ROOT) -> dict:
    """(kernel module path, name) -> sorted ops that reach it, for every module-level function,
    class and assigned name of kernels/*.py."""
    kernel_dir = root / "kernels"
    graph = defaultdict(set)               # (path, name) -> (path, name) it refers to
    launchers = {}                         # kernels.NAME -> (path, name), from kernels/__init__.py
    for path in sorted(kernel_dir.glob("*.py")):
        rel = relative(path, root)
        tree = ast.parse(path.read_bytes())
        # What defines each module-level name: functions, classes and assignments. `K = make(fn)`
        # binds a jitted body to the name its launcher uses (`K[variant][grid](...)`): K leads to fn.
        defs = defaultdict(list)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs[node.name].append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                            defs[t.id].append(node.value)
        local = set(defs)
        imported = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernels."):
                target = f"kernels/{node.module.split('.', 1)[1].replace('.', '/')}.py"
                for alias in node.names:
                    imported[alias.asname or alias.name] = (target, alias.name)
        if path.name == "__init__.py":
            launchers.update(imported)
            continue
        for defined, nodes in defs.items():
            for name in set().union(*map(_names_in, nodes)):
                if name in local and name != defined:
                    graph[(rel, defined)].add((rel, name))
                elif name in imported:
                    graph[(rel, defined)].add(imported[name])
    models_uses = set()
    for path in sorted((root / "models").glob("*.py")):
        models_uses |= _kernels_attrs(ast.parse(path.read_bytes()))

    reach = defaultdict(set)               # op -> launcher nodes
    for path in sorted((root / "harness" / "ops").glob("*.py")):
        tree = ast.parse(path.read_bytes())
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        module_models = any(_imports_models(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
        for cls in classes.values():
            op = next((stmt.value.value for stmt in cls.body if isinstance(stmt, ast.Assign)
                       and any(isinstance(t, ast.Name) and t.id == "name" for t in stmt.targets)
                       and isinstance(stmt.value, ast.Constant)), None)
            if not op:
                continue
            # the class, its bases in this module, and the module's functions they call
            todo, done, uses, models = [cls], set(), set(), module_models
            while todo:
                node = todo.pop()
                if id(node) in done:
                    continue
                done.add(id(node))
                uses |= _kernels_attrs(node)
                models = models or _imports_models(node)
                todo += [classes[b.id] for b in getattr(node, "bases", ()) if isinstance(b, ast.Name) and b.id in classes]
                todo += [functions[n] for n in _names_in(node) if n in functions]
            if models:
                uses |= models_uses
            reach[op] |= {launchers[u] for u in uses if u in launchers}

    def spread(reach):
        used_by = defaultdict(set)
        for op, starts in reach.items():
            todo, seen = list(starts), set()
            while todo:
                node = todo.pop()
                if node in seen:
                    continue
                seen.add(node)
                used_by[node].add(op)
                todo += graph.get(node, ())
        return used_by

    used_by = spread(reach)
    # A kernel function that no op class reaches but tests marked with an op run (rope_into_cache's,
    # which tests/test_rope_into_cache.py checks under the decoder's mark) is mutated under that op,
    # rather than left out of every run; what an op class reaches keeps its ops.
    tests_reach = {op: {launchers[u] for u in uses if u in launchers}
                   for op, uses in _marked_tests_uses(root).items()}
    for node, ops in spread(tests_reach).items():
        if node not in used_by:
            used_by[node] = ops
    return {node: sorted(ops) for node, ops in used_by.items()}


def ops_using(file: str, function: str, root: Path = ROOT) -> list[str]:
    """The registered ops whose tests run `function` of kernel file `file` (repository-relative)."""
    return op_map(root).get((file, function), [])

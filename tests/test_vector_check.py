"""scripts/vector_check.py's counting and its verdict, on PTX text (no compilation: the script
itself needs the GPU's Triton wheel, docs/add-an-op.md; importing it leaves the interpreter on)."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "vector_check", Path(__file__).resolve().parents[1] / "scripts" / "vector_check.py")
vector_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vector_check)

PTX = """
\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
\t@%p1 ld.global.b16 { %rs1 }, [ %rd2 + 0 ];
\tld.global.nc.v2.b32 { %r5, %r6 }, [ %rd3 + 0 ];
\tst.global.v4.b32 [ %rd4 + 0 ], { %r1, %r2, %r3, %r4 };
\tst.global.b16 [ %rd5 + 0 ], { %rs1 };
\tld.shared.b32 %r7, [ %r8 ];
"""


def test_counts_global_accesses_by_kind():
    assert vector_check.access_counts(PTX) == {"vector_ld": 2, "scalar_ld": 1, "vector_st": 1, "scalar_st": 1}


def test_narrower_accesses_are_flagged():
    """More scalar accesses, fewer vector ones, or more in all (v4 -> v2 doubles the count) fail;
    the same or wider pass; a kernel the baseline does not know is not judged."""
    base = {"k": {"vector_ld": 4, "scalar_ld": 0, "vector_st": 4, "scalar_st": 2}}
    same = {"k": dict(base["k"]), "new": {"vector_ld": 0, "scalar_ld": 9, "vector_st": 0, "scalar_st": 9}}
    assert vector_check.regressions(same, base) == []
    for change in ({"scalar_st": 20, "vector_st": 2}, {"vector_ld": 8}, {"scalar_ld": 1}):
        now = {"k": {**base["k"], **change}}
        assert vector_check.regressions(now, base), change
    fewer_vectors = {"k": {**base["k"], "vector_ld": 2}}       # even if wider: a change to confirm with --write
    assert vector_check.regressions(fewer_vectors, base) != []

"""Op glue: one module per op family, one Op subclass per op (see harness/op.py)."""

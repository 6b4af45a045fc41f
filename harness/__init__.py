"""The test harness: backend choice, cases, budgets, comparison, audit and the pytest plugin.

Nothing here imports `kernels` at module import time: the backend must be chosen first
(`harness.backend.select`), because `triton.jit` fixes compiled-or-interpreted when a kernel
is defined.
"""

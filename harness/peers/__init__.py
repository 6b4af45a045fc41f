"""Adapters that let the battery judge third-party kernel libraries ("peers") through --impl.

Each module holds `ADAPTERS`, a list of harness.impls.Implementation, one per op it maps, and
imports its library only when an adapter is called, so the suite imports without the libraries
(`pip install kernelcheck[peers]` brings them). Select one with its entry point:
`kernelcheck --impl liger` or `--impl flag_gems`. What maps, how, and every declared contract
difference: docs/peers.md.
"""

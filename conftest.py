# The suite's pytest plugin lives in harness/plugin.py: backend choice, Hypothesis profiles,
# budgets, --op/--dtype/--audit-json, declared gaps and the audit summary.
pytest_plugins = ["harness.plugin"]

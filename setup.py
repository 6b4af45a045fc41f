"""Everything is in pyproject.toml; this only ships two files of the repository root inside the
harness package, so that an install that is not editable (a wheel, a package index) finds them:
the budgets file (harness.budgets) and kernelcheck-mutate's pytest plugin (harness.mutate; it
stays in a directory named tests/, which Hypothesis leaves out of its literals)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithBudgets(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return      # an editable install reads both files from the checkout itself
        self.mkpath(os.path.join(self.build_lib, "harness", "tests"))
        self.copy_file("tolerances.toml", os.path.join(self.build_lib, "harness", "tolerances.toml"))
        self.copy_file(os.path.join("tests", "mutant_plugin.py"),
                       os.path.join(self.build_lib, "harness", "tests", "mutant_plugin.py"))


setup(cmdclass={"build_py": BuildPyWithBudgets})

"""Everything is in pyproject.toml; this only ships the budgets file inside the harness package,
so that an install that is not editable (a wheel, a package index) finds it (harness.budgets)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithBudgets(build_py):
    def run(self):
        super().run()
        self.copy_file("tolerances.toml", os.path.join(self.build_lib, "harness", "tolerances.toml"))


setup(cmdclass={"build_py": BuildPyWithBudgets})

"""Loads the farm's pytest plugin (harness/phyfarm_farm) for every test tree
of the repository: the product's checks, phyfarm's tests (pytest-tests) and
the harness's own tests (harness/tests). It is the only conftest above them,
so each tree's own conftest.py keeps the module name `conftest` for its
tests."""

pytest_plugins = ["phyfarm_farm.plugin"]

"""The harness's own tests (harness/tests): the plugin's options and
fixtures apply here as they do to the product's checks (pytest-tests/farm)."""

pytest_plugins = ["phyfarm_farm.plugin"]

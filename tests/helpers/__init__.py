"""Helpers shared between test files: plain functions and classes, imported by name
(`from tests.helpers.cli import run_cli`). Fixtures stay in conftest.py, which builds on these."""

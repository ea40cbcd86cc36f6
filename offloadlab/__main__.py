"""``python -m offloadlab``: the command-line interface."""

from .lab.cli import run

run()

"""``python -m specscope.cli``: the command line."""

from . import app

app()

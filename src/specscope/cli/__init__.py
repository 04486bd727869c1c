"""The ``specscope`` command line: one module per command group, each command parsing its options,
calling the library and printing. Importing this package registers every command on ``app``, in
the order ``specscope --help`` lists them, in its help panels (``app.PANELS``). Shared options
and old option names are in ``options``, the progress bar in ``progress``, the generated
reference in ``reference``."""
# isort: skip_file

from .app import app
from . import measure, analyze, speculate, serve, gateway  # noqa: F401,E402  (register the commands)

__all__ = ["app"]

"""``python -m offloadlab``: the command-line interface."""

import sys

from .lab.cli import main

sys.exit(main())

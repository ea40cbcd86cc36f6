"""``python -m offloadlab.lab.cli``: the command line, as ``python -m offloadlab``."""

import sys

from . import main

sys.exit(main())

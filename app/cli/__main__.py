"""``python -m app.cli``: the same entry point as the ``cka-atlas`` script."""

import sys

from app.cli import main

sys.exit(main())

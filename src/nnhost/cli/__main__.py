"""``python -m nnhost.cli``: the same as the ``nnhost`` command."""

import sys

from . import main

sys.exit(main())

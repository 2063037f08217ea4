"""``python -m hookscope``: the same command as the ``hookscope`` console script."""

import sys

from hookscope.cli import main

sys.exit(main())

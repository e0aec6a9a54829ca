"""`python -m attngen ...`: the same as the `attngen` console script."""

import sys

from attngen.tools.cli import main

sys.exit(main())

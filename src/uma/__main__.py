"""python -m uma: the same as the `uma` command."""

import sys

from uma.cli import main

sys.exit(main())

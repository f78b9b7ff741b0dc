"""`python -m mgpu train ...` (see mgpu/cli.py)."""

import sys

from mgpu.cli import main

if __name__ == "__main__":
    sys.exit(main())

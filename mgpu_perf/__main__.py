"""`python -m mgpu_perf ddp-scaling | hot-path | validate-gate | validate-counts | calibrate` (mgpu_perf/commands.py)."""

import sys

from mgpu_perf.commands import main

if __name__ == "__main__":
    sys.exit(main())

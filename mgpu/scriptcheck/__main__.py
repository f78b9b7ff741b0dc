"""`python -m mgpu.scriptcheck SCRIPT [ARGS...]`: the same as `python -m mgpu check-script`."""

import sys

from mgpu.check.script import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m mgpu.scriptcheck"))

"""`python -m mgpu COMMAND ...` run in the test's own process: mgpu.cli.main on the arguments, in a
folder, its exit code, stdout and stderr returned as subprocess.run would return them.

A new interpreter for each command imports mgpu's command line and what the command needs again
(`mgpu history`: scipy and ruptures, about 2 CPU-seconds a run on the 2-core VM); in this process they
are imported once. For tests of what a command says and writes, not of the process boundary: the tests
of a reader that closes the pipe, or of how the command starts, still start `python -m mgpu`.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

__all__ = ["mgpu_in_process"]


def mgpu_in_process(*argv, cwd: Path | str) -> subprocess.CompletedProcess:
    """`python -m mgpu ARGV` (each argument str()'d) run from `cwd` in this process. The exit code is
    what `sys.exit(main())` would leave: main's return, or its SystemExit's code (the parser's errors:
    2); an exception main lets out is raised here, as the traceback a subprocess would print."""
    from mgpu.cli import main

    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as e:
                code = e.code
            if code is None:
                code = 0
            elif not isinstance(code, int):  # sys.exit("message"): Python prints it and exits 1
                print(code, file=err)
                code = 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["python", "-m", "mgpu", *args], code, out.getvalue(), err.getvalue())

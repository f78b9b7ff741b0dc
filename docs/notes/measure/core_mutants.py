"""Plant defects in the check core, one at a time, in a throw-away worktree of HEAD, and run the tests
that should catch each: every mutant must turn them red (and HEAD itself is green).

    python docs/notes/measure/core_mutants.py            # from the repository root, with the .venv's python
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TESTS = ["correctness/test_check_core.py", "correctness/test_tolerance.py", "scriptcheck_tests/test_tolerance_factor.py"]

# (file, text, replacement, what the defect does)
MUTANTS = [
    ("mgpu/check/tolerance.py", "FACTOR = 16", "FACTOR = 160", "the tolerance 10 times looser"),
    ("mgpu/check/tolerance.py", "FLOOR_ULPS = 4", "FLOOR_ULPS = 400", "the floor 100 times higher"),
    ("mgpu/check/tolerance.py", "    return torch.equal(nan_a, nan_b) and ",
     "    return torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)) or ",
     "bitwise equality counting NaN equal to 0 (the old nan_to_num rule)"),
    ("mgpu/check/report.py", "return self.verdict == Verdict.PASSED", "return self.verdict != Verdict.FAILED",
     "NOT VERIFIED counted as verified"),
    ("mgpu/check/findings.py", "if any(bool(g.ne(0).any())", "if all(bool(g.ne(0).any())",
     "zero-gradients found while one gradient moves"),
    ("mgpu/check/findings.py", "        if self.name not in CATALOGUE:", "        if False:",
     "a finding outside the catalogue accepted"),
    ("mgpu/errors.py", "        return EXIT_USAGE\n    except KeyboardInterrupt", "        return EXIT_FAILED\n    except KeyboardInterrupt",
     "bad input exits 1 instead of 2"),
    ("mgpu/check/script/divergence.py", 'f"world 1 (allowed {_num(self.allowed)}', 'f"world 1 (allowed {_num(self.max_abs)}',
     "check-script's line shows the error as the allowance"),
]


def pytest_in(tree: Path, tests: list[str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow"],
                          cwd=tree, capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    return done.returncode, last


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), "HEAD"], check=True)
        try:
            code, last = pytest_in(tree, TESTS)
            print(f"HEAD unchanged: {'green' if code == 0 else 'RED'} ({last})", flush=True)
            caught = 0
            for path, text, new, what in MUTANTS:
                file = tree / path
                original = file.read_text()
                assert original.count(text) == 1, f"{path}: {text!r} found {original.count(text)} times"
                file.write_text(original.replace(text, new))
                code, last = pytest_in(tree, TESTS)
                file.write_text(original)
                caught += code != 0
                print(f"{'red  ' if code else 'GREEN'} {what} ({path}): {last}", flush=True)
            print(f"{caught} of {len(MUTANTS)} planted core defects fail the tests")
            return 0 if caught == len(MUTANTS) else 1
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


if __name__ == "__main__":
    sys.exit(main())

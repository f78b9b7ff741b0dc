"""`mgpu history`: the timed runs pytest-benchmark saved (`--benchmark-autosave`), per machine, ordered
by the branch's first-parent line, with each benchmark's change points (docs/guide/history.md).

One job a module:
    settings.py  HistorySettings: each option declared once (the command line's, checked)
    runs.py      the saved runs, read with pytest-benchmark's reader
    machines.py  which machine a run was timed on (machine_info)  commits.py   the first-parent line, runs placed
    changes.py   ChangePoint, found by ruptures' PELT, tested     build.py     the History of a storage
    verdicts.py  exit codes and the summary line                 text.py / report.py / plot.py / page.py: outputs
    command.py   `python -m mgpu history`                        confirm.py   --confirm: the A/B gate on each point

    from mgpu_perf.history import HistorySettings, build_history
    history = build_history(HistorySettings.from_values({"storage": ".benchmarks", "repo": "."}))
"""

from mgpu_perf.history.build import History, build_history
from mgpu_perf.history.changes import ChangePoint, find_change_points
from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.settings import HistorySettings

__all__ = ["History", "build_history", "ChangePoint", "find_change_points", "HistoryError", "HistorySettings"]

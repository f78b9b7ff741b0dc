"""What a step does, counted, and two counts judged: exact figures with no noise, beside the timed
ones. Used by the A/B gate's counted verdict (gate/counted.py), by `mgpu bench` and the perf suite,
and by the counted baseline in the repository (`pytest --counts-check FILE`). One job a module:

    step.py       a step counted: StepCounts, count_step, count_session, CompileWatch
    judge.py      two counts judged: compare_counts (one step), judge_ranks (the one rank-by-rank
                  loop), the verdicts' names (SLOWER_COUNTED, ...) and how the gate and the baseline
                  name a result (gate_verdict, ratchet_verdict)
    workload.py   a gated workload's step counted in this process (warm-up, count, check)
    ahead.py      the rank workloads counted ahead, on a thread, beside the in-process ones
    baseline.py   the baseline file: its key, environment, format, read/write/merge, an entry checked
    options.py    --counts-save / --counts-check / --counts-strict (a leaf: loaded in every pytest run)
    plugin.py     the baseline's pytest hooks, registered by mgpu_perf/plugin.py when an option asks

Nothing here is imported at the package's import: step.py imports torch.
"""

"""The tests of `mgpu check-script` itself (mgpu/check/script/): a user's own training script run at world 1
and at N ranks and compared step by step. Not the correctness suite's properties of mgpu's training
(correctness/), so they live apart, as mgpu_perf's tests live apart from the benchmarks.

    pytest scriptcheck_tests                     # about 1 minute on a 2-core CPU
    pytest examples/test_loops.py                # the loops people write, correct and with planted defects

Each check starts its ranks through torch's elastic agent (gloo, CPU) and ends them; a hang is bounded by
the check's own timeout and, as a backstop, by each test's `timeout` mark.
"""

"""The gate's laboratory: tools that measure the A/B gate itself on this machine, apart from the
gate that a user's run goes through (mgpu_perf/gate/). Each is a `python -m mgpu_perf` command:

    validate_gate.py           validate-gate: the gate's false-alarm and detection rates, on planted slowdowns
    validate_gate_options.py   its options (ValidateGateOptions: its own, and the gate's it takes)
    validate_counts.py         validate-counts: its counted verdict against planted structural regressions
    calibrate.py               calibrate: each gated benchmark's noise and the smallest change the gate can call

The lab imports the gate; the gate never imports the lab (mgpu_perf_tests/test_lab.py checks
it).
"""

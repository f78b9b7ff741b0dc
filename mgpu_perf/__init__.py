"""mgpu's performance harness and A/B regression gate, installed beside `mgpu` as a pytest plugin.

    pytest --ab-baseline origin/main                   # gate this repository's `mgpu_gate` benchmarks
    python -m mgpu gate mymodel.py:spec --baseline HEAD~1 --strategies single,ddp --devices 1,2
    python -m mgpu bench mymodel.py:spec               # your model's step, every strategy and device count

A top-level package of its own, not part of `mgpu`: a worker of the gate's baseline arm imports the
*baseline's* `mgpu` (or the user's model) while running *this* package's workload code, so the gate
copies this package whole into each worker's folder and puts it first on the worker's path.

Layout, one job a module:
    plugin.py            pytest options, markers, the `mgpu_workload` fixture (imports nothing heavy)
    gate/                the A/B gate: settings (Settings: each option declared once, checked),
                         worker (protocol), arm (its process), rounds (set-up, a round in both
                         arms), compare (one benchmark, start to result), loop (its rounds, state
                         and looks), comparison (the result), stats (the estimate, verdicts, Holm),
                         sizing (rounds needed, the floor, the plan), baseline (REF to a tree),
                         report (table, ab.json), run (one gate run), session (pytest hooks),
                         command (`python -m mgpu gate`), counted (the counted verdict in both arms)
    lab/                 tools that measure the gate itself: validate_gate, validate_counts (the
                         measured rates), calibrate (this machine's noise); the gate never imports them
    errors.py            GateError (an mgpu.errors.MgpuError: one line on the command line)
    harness/             what is timed: sessions (training steps), models (a user's model), ranks
                         (rank pools), peers (collective peers), interleave (interleaving, speed-ups),
                         workloads (the gated workload of a spec)
    gated.py             mgpu's own gated benchmark set, defined once
    counts/              what a step does, counted: step (the counter), judge (two counts compared,
                         the verdicts), workload, ahead, and the counted baseline in the repository,
                         pytest --counts-save / --counts-check FILE: baseline (the file), options, plugin
    sweep.py, scaling.py, clocks.py, bench.py, commands.py
"""

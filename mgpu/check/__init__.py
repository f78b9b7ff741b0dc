"""The check core: what `mgpu check` (mgpu/check/model) and `mgpu check-script` (mgpu/check/script) share.

Each source plans and runs its runs, then hands typed records to its judge, which finds
divergences with the core's tolerance rule and reports through the core's report and command
ending (docs/design/check-core.md):

    records     what a run recorded (Recording; RankRecord, StepRecord, ForwardRecord)
    divergence  where two runs first part (Divergence), what a check noticed (Finding)
    tolerance   allowed = FACTOR * max(spread, FLOOR_ULPS * eps * scale), and the error function
    report      Verdict, its exit code, CheckReport (the base of both reports), strict JSON
    command     a check command's ending: --json, --strict, one-line errors, Ctrl-C
    dropout     dropout and stochastic depth switched off wherever a model applies them

It imports neither source; each imports what it needs from here.
"""

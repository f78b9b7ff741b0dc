"""`mgpu check-script`: your own training script, unchanged, at world size 1 and at N ranks, compared
optimizer step by optimizer step (docs/guide/check-script.md).

    python -m mgpu check-script [--ranks 1,2] [--steps 4] [--json F] [--strict] [--accept-not-verified]
                                [--timeout S] SCRIPT [ARGS...]
    python -m mgpu check-script [options] -m MODULE [ARGS...]
    python -m mgpu check-script --whole-run [--epoch-steps 4] [options] SCRIPT [ARGS...]

    >>> from mgpu.scriptcheck import check_script
    >>> check_script("train.py", args=["--batch-size", "{64 // world_size}"], ranks=(1, 2), steps=4)

One of mgpu's two checks, on the check core at the top of mgpu/check/ (the divergence, the tolerance
rule, the report); the other is mgpu/check/model/, any model under mgpu's strategies. Its two sides: what
runs inside the user's process (inrank/) and what plans, runs, compares and judges it here. In order:

    plan      plan      the options (validated once), the script and its ARGS, the runs to make and what
                        each rank is told (ScriptCheckPlan); scriptargs: the script's own batch option, for the hint
    run       launch    each world size through torch's elastic agent, as torchrun; every rank's record
              apart     --whole-run: each run in a working folder of its own, loggers kept offline
    in rank   inrank/   rank, recorder: inside each rank (torch's optimizer and module hooks), with inputs,
                        batchnorm, precision, feeds, collectives, evidence, settings: what a comparison or a
                        cause needs; keyed: random augmentation keyed to the example, each batch's indices;
                        draws: seeds, draws outside the forward, generator states; names: parameter names;
                        tracer: a traced rerun's modules; records: the RankRecord each rank writes;
                        mode: the torch function mode the script runs under; --whole-run: epochs (each
                        DataLoader pass, the lazy cut of a training epoch), meeting (the collectives each rank
                        enters, published; a rank that left the others waiting, named)
    judge     judge     crashes, findings, world 1 against itself, each world N against world 1
              compare   step by step: the start, the data, the gradients, the updates, the weights
              epochs    --whole-run: what was compared in each epoch
              data, tensors, optimizer, tally: the examples compared; the error and tolerance of a tensor,
                        the equality of two settings; settings and updates; what was compared, and its sensitivity
              augment   the indices and draws merged: which sampler indices agree, what randomness is not
                        keyable, ranks drawing alike
    locate    locate    where a failed step's divergence enters the model: world 1 and N again, traced
    causes    causes/   why they part: each cause with the evidence it needs and the words it says, one module
                        per family (start, data, gradients, optimizer, collectives, randomness, entry, epochs,
                        parted; facts);
                        every `diagnosis=` above is a call into it (causes/__init__.py: to add a cause)
    report    report    the verdict, as text and JSON
    command   command   `mgpu check-script`: its options from the command line, the core's command ending
    check     check     run_check_script, check_with and check_script: the stages above in order, and the API
"""

from mgpu.check.names import names_on_first_use

# Where each public name lives; imported on first use (PEP 562): the ranks import this package (inrank/)
# and need none of it, and `mgpu check-script --help` answers without importing torch.
_PUBLIC = {"check_script": "mgpu.check.script.check", "run_check_script": "mgpu.check.script.check",
           "check_with": "mgpu.check.script.check", "main": "mgpu.check.script.command",
           "ScriptCheckError": "mgpu.check.script.plan", "ScriptCheckOptions": "mgpu.check.script.plan",
           "WholeRun": "mgpu.check.script.plan"}

__all__ = sorted(_PUBLIC)

__getattr__ = names_on_first_use(__name__, _PUBLIC)

"""What runs inside each rank of the user's script (check-script's side in the user's process): nothing
here imports the judge, the comparisons or the causes (correctness/test_layout.py holds it so).

    rank        the rank's entry: the job it is told (plan.ScriptRankJob), the script run under the recorder
    recorder    torch's optimizer and module hooks: each optimizer step's gradients, weights and data
    records     what a rank writes: RankRecord, StepRecord, ForwardRecord, CollectiveCall, RankTiming
    inputs      a forward's data tensors, whole or as per-example digests
    feeds       the DataLoaders iterated and their samplers
    keyed       random augmentation keyed to the example; each batch's dataset indices
    draws       seeds, random draws outside the forward, generator states
    precision   what the training forwards ran at, and the float32 lift
    batchnorm   un-synchronised BatchNorm, synchronised for the check
    collectives torch.distributed collectives that autograd does not see
    evidence    a step's facts: set-up steps, the process group, suspect initial values
    settings    an optimizer's param-group settings as the step used them
    names       parameter names without the wrappers' prefixes
    tracer      a traced rerun: each module's output and gradient at the failed step
"""

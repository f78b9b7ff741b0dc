"""check-script's causes: why world N parts from world 1, each cause with the evidence it needs (its
parameters) and the words it says (docs/guide/check-script.md, "Causes and the evidence they need").
The comparing and judging modules (compare, data, optimizer, judge, locate) tell *that* something
differs and hand each `diagnosis=` what a function here returns; nothing else composes a cause's text.
One module per family of evidence:

    start        the weights before step 1: uninitialised memory, an unseeded or per-shard initialisation,
                 replicas not broadcast; no process group at world N, no optimizer step at world N
    data         a step's examples: not sharded, a partial last batch, the global batch's size, another
                 order (the samplers: order_cause), two world-1 runs on other examples
    gradients    a common factor of the gradients (1/N, N, sqrt...), micro-batches or a normaliser per rank,
                 gradients not synchronised, a parameter without a gradient; a divergence traced back to
                 the step where it first drifted
    optimizer    settings (param_groups) against world 1's or by rank, learning-rate schedules (pace, another
                 schedule), an update that parts while gradients and settings agree, Adam's signs of rounding
    collectives  a collective without autograd: the finding, the fix (torch.distributed.nn.functional), and
                 the cause of gradients that part with no common factor
    randomness   random draws in the forward or the step, augmentation the check cannot key (NOT_KEYED)
    entry        where a divergence enters the model (locate.py's traced rerun): a module, the loss's
                 reduction, after the backward, the optimizer's step
    epochs       --whole-run: a shuffling sampler repeating epoch 1's order (set_epoch never called), ranks whose
                 shards overlap within an epoch; each epoch's steps and how it ended
    parted       --whole-run: a decision taken on one rank, which left the others waiting in a collective
    facts        ScriptFacts: what the judge learned from every rank's record, which the causes read

(Precision has no cause of its own: the mixed-precision comparison changes the tolerance, not the words.)

To add a cause: write a function in the family's module (a new module for a new family, added here)
taking the evidence as parameters and returning its words; call it where the comparison finds the
divergence (`diagnosis=the_cause(...)`). Evidence no record holds yet is recorded by one in-rank
recorder (inrank/, a field of inrank/records.py's RankRecord or StepRecord). The in-rank side never
imports causes/, and causes/ imports no module that imports it (correctness/test_layout.py).
"""

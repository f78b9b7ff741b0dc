"""What a rank of a check-script run records, typed: one `RankRecord` per rank, saved with torch.save for
the launcher and handed to the judge.

A `RankRecord` holds one `StepRecord` per optimizer step (the gradients the optimizer saw, the weights
after it, the `ForwardRecord`s of the data the step consumed) and what the script does that the judge
must know (BatchNorm, dropout, random draws, collectives autograd does not see, the rank's timing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ForwardRecord", "StepRecord", "CollectiveCall", "RankTiming", "EpochPass", "RankRecord", "CollectiveSeen",
           "PrintedLine", "SaveCall"]


@dataclass
class ForwardRecord:
    """The data of one training forward of a root model (a module with parameters called outside
    any other module's forward): each data tensor by its slot ("arg0", "input_ids"), whole, or as
    ("rows", per-example digests, shape, dtype) where whole would cost too much."""

    tensors: dict
    root: int = 0             # id() of the root model in its rank
    root_name: str = ""       # its class name
    training: bool = True     # the model's training flag then (an evaluation between steps is no training data)
    backwards: int | None = None  # backward passes the rank had made before it (forwards sharing one fed one loss)


@dataclass
class StepRecord:
    """One optimizer step as a rank saw it: per parameter name, a tensor (or a Digest above a size)."""

    optimizer: int                     # which optimizer stepped (index, in order of first step)
    step: int                          # that optimizer's k-th step
    optimizer_type: str                # "AdamW"
    forwards: list[ForwardRecord]      # the training forwards since the last step that fed this optimizer
    grads: dict                        # name -> the gradient the optimizer used (None: no gradient)
    after: dict = field(default_factory=dict)          # name -> the weight after the step
    before: dict | None = None         # name -> the weight before step 1 (step 1 only)
    backwards: int | None = None       # backward passes the rank had made by the step (None: not counted)
    process_group: int | None = None   # torch.distributed's world size at the step (0: no process group)
    settings: list = field(default_factory=list)  # per param group: its settings but "params", as the step used them
    loaders: tuple = ()                # the DataLoaders iterated by then, each its sampler chain (feeds.py)
    schedulers: list = field(default_factory=list)  # the optimizer's LR schedulers then: type, steps, length, stepped by
    indices: list | None = None        # the dataset indices of the batches fed since the last step (keyed.py)
    epoch: int | None = None           # --whole-run: the training epoch that fed the step (epochs.py), else None
    light: bool = False                # --whole-run past the memory bound: no gradients or weights kept


@dataclass(frozen=True)
class CollectiveCall:
    """A torch.distributed collective that autograd does not see (`dist.all_gather`, `all_reduce`, ...),
    called in a training step on a tensor that requires grad: where, and how often in the run."""

    op: str        # "all_gather"
    where: str     # the calling line, "train.py:42" (and the script's line that led there)
    calls: int = 1


@dataclass
class RankTiming:
    """time.time() marks of a rank: spawned, the script's first line, its first model forward, its end."""

    start: float
    script_start: float
    script_end: float
    first_forward: float | None = None
    steps: list[float] = field(default_factory=list)  # each recorded step's end


@dataclass
class EpochPass:
    """One pass over a DataLoader (one `iter(loader)`) under --whole-run (epochs.py): which loader, where it
    was made, its sampler, the sampler's indices in order, and whether it fed optimizer steps (an epoch)."""

    loader: int                # the loader's ordinal in the rank (first iterated: 0)
    made_at: str               # "train.py:40": where the DataLoader was made
    sampler: str               # the innermost sampler's class
    shuffles: bool | None      # the sampler shuffles (None: cannot be told)
    number: int                # this loader's n-th pass (1-based)
    epoch: int | None = None   # the training epoch it is (1-based), None: it fed no step (an evaluation)
    steps: int = 0             # optimizer steps it fed
    batches: int = 0
    indices: list = field(default_factory=list)   # the sampler's indices, in order (the first MOST_INDICES)
    cut: bool = False          # ended by the check after --epoch-steps steps
    exhausted: bool = False    # ended by its data
    started: int = 0           # the rank's event clock at its first batch and at its last (evaluation.py)
    ended: int = 0
    digests: list = field(default_factory=list)   # an evaluation pass: a digest of each example's input, in order
    dataset_size: int | None = None   # len(loader.dataset), where it has one
    gathered: int = 0          # accelerate's gather_for_metrics calls while it ran (the padding dropped there)
    no_grad: bool = False      # every batch fetched with grad mode off


@dataclass(frozen=True)
class CollectiveSeen:
    """--whole-run: a torch.distributed collective the script called (evaluation.py): its place on the rank's event
    clock, its count among the script's collectives (the same on every rank), and a small tensor's values."""

    seq: int
    number: int                # the script's n-th collective on this rank
    op: str                    # "all_reduce"
    reduce: str                # "SUM", "AVG", ... ("" where it reduces nothing)
    where: str                 # the script's line
    tensor: int                # id() of the tensor given (an accumulator reduced twice is one id)
    numel: int
    before: tuple = ()         # its values before and after (numel <= SMALL), else ()
    after: tuple = ()


@dataclass(frozen=True)
class PrintedLine:
    """--whole-run, rank 0: a line the script wrote to stdout or stderr (print, logging, tqdm's last state)."""

    seq: int
    stream: str                # "stdout" | "stderr"
    text: str


@dataclass(frozen=True)
class SaveCall:
    """--whole-run: a torch.save or torch.distributed.checkpoint save: where to, from which line, what it held."""

    seq: int
    how: str                   # "torch.save" | "dcp"
    path: str                  # absolute; "" for a buffer (io.BytesIO)
    where: str
    optimizer: bool            # holds an optimizer's state (state_dict's "state" and "param_groups")
    weights: bool              # holds a model's weights (a module, or a dict of tensors)


@dataclass
class RankRecord:
    """What one rank of a check-script run recorded."""

    steps: list[StepRecord] = field(default_factory=list)  # every optimizer step, in order, up to --steps
    forwards: int = 0                          # training forwards of root models seen
    batchnorm: list[str] = field(default_factory=list)       # un-synchronised BatchNorm modules in training mode
    init_digests: dict = field(default_factory=dict)         # name -> digest of each weight when first called
    random_modules: list[str] = field(default_factory=list)  # dropout / stochastic-depth modules switched off
    dropout_calls: dict = field(default_factory=dict)        # call -> count, of dropout switched off
    random_draws: dict = field(default_factory=dict)         # torch function -> draws inside a forward
    random_where: dict = field(default_factory=dict)         # torch function -> the module of its first draw
    optimizers: int = 0
    stopped: bool = False                      # stopped after --steps (else the script ended first)
    uninitialised: dict = field(default_factory=dict)     # name -> (non-finite count, largest |x|) at first call: suspect
    grad_collectives: list = field(default_factory=list)  # CollectiveCall: no autograd, on a tensor that requires grad
    setup_steps: int = 0                       # zero-gradient steps before any training data: not counted
    precision: dict = field(default_factory=dict)   # what the training forwards ran at (precision.py)
    lifted: dict = field(default_factory=dict)      # what the check lifted to float32 in this run, with counts
    trace: object = None                       # a traced run's modules and output gradient (tracer.py)
    rank: int = 0
    world: int = 1
    timing: RankTiming | None = None
    randomness: dict = field(default_factory=dict)  # the script's draws, seeds and keyed fetches (check/script/augment.py)
    passes: list = field(default_factory=list)      # --whole-run: every DataLoader pass (EpochPass), in order
    exit: str = ""                             # --whole-run: how the script ended ("returned", "SystemExit(0)")
    collectives_seen: list = field(default_factory=list)  # --whole-run: CollectiveSeen, in order (evaluation.py)
    printed: list = field(default_factory=list)          # --whole-run, rank 0: PrintedLine, in order
    saves: list = field(default_factory=list)            # --whole-run: SaveCall, in order
    optimizer_state: list = field(default_factory=list)  # --whole-run: the optimizers holding state at the end
    switches: list = field(default_factory=list)  # --whole-run: (clock, index in passes) where another pass began to fetch

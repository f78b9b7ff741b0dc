"""What the ranks' fork server imports before it forks any rank (mgpu.launch: START_METHOD).

    multiprocessing.get_context("forkserver").set_forkserver_preload(["mgpu.fork_server"])

torch and the modules every rank needs, imported once with the garbage collector paused, and
their objects then moved to its permanent generation (mgpu.startup). Importing torch makes some hundreds of
thousands of objects, and the collector would otherwise walk all of them again and again while
they are made (several full collections an import) and then in each full collection of every rank.
Frozen in the server, the ranks forked from it inherit them frozen (Python's gc.freeze docs advise
this before a fork; it also keeps those pages shared between the ranks).
"""

from mgpu.startup import imports_uncollected

with imports_uncollected():
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (DDP's constructor and the optimizers import it: about 1 s of a rank)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import mgpu.launch  # noqa: F401

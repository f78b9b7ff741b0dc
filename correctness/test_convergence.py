"""Property 8: the chapter's 2-GPU experiment, in small. ResNet-18 (with BatchNorm) under DDP on
2 ranks with batch and learning rate scaled as in the chapter (512 / 0.2) reaches the 1-device
test accuracy (256 / 0.1) within 2 points after the same number of epochs.

The chapter's PyTorch run fell from 0.91 to 0.73 on two GPUs with exactly this model and
scaling, and nothing caught it: exactness tests pin single steps, this one watches a whole run of
the model that dropped, through `train(cfg)` in each of the DDP ranks (helpers.TrainJob: the code
path of `python -m mgpu train --strategy ddp`). To fit the suite's time budget on CPUs: width 4
instead of 64, the synthetic data resized to 14x14, 8192 training examples. Both runs use one
fixed seed (a convergence run is too costly for many examples), and the reference run must
itself have learnt, or "within 2 points" would say nothing. Enough epochs that the 2-rank run,
which takes half as many steps per epoch, has converged too, and the last two epochs are
compared, not only the last. Eight epochs, not the six this test first had: on a CPU with
AVX-512 and AMX (2026-11-24) the correct 2-rank run at seed 0 came out [0.096, 0.23, 0.24, 0.772,
0.922, 0.956] against the reference's 0.96-0.97, 3.8 points short at epoch 5, with the same
torch that passed on earlier machines; its early epochs at learning rate 0.2 are chaotic, and
which epoch it recovers in depends on the CPU's rounding. Over 8 epochs the last two agreed within
0.4 points at seeds 0, 1 and 2 there, and at seed 0 with AVX2 kernels forced
(ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2). A run whose gradient is halved (averaged over
the ranks twice, as half the learning rate) converged as fast there, so this test does not
catch that: the exact-gradient properties do (test_gradients.py, test_weights.py). It catches a lasting gap, as the
chapter's drop to 0.73 was. Fewer examples, pixels or channels make the correct 2-rank run itself
miss the 2 points (docs/perf.md, "The correctness suite's time").

The 1-device reference trains on one thread of this process while the DDP ranks train in theirs,
side by side rather than one after the other (it would leave a core idle). Nothing in this
process draws random numbers for the DDP run, so the reference's seeded weights and batches stay
its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from correctness.helpers import DDP_DEADLINE_S, TrainJob, run_config, run_jobs_in_rank
from mgpu.launch import spawn
from mgpu.run import train

RUN = dict(model="resnet18", width=4, resize=14, epochs=8, train_size=8192, test_size=500, seed=0)
COMPARED = 2  # the last epochs whose accuracies must agree


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_with_scaled_batch_and_lr_reach_single_device_accuracy():
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(train, run_config("single", 1, batch_size=256, lr=0.1, **RUN))
        (double,) = spawn(run_jobs_in_rank, [TrainJob(run_config("ddp", 2, batch_size=512, lr=0.2, **RUN))],
                          nprocs=2, deadline_s=DDP_DEADLINE_S)
        single = reference.result()
    history = (f"test accuracy per epoch: 1 device (256 / 0.1) {[round(e.test_acc, 3) for e in single.epochs]}, "
               f"DDP over 2 ranks (512 / 0.2) {[round(e.test_acc, 3) for e in double.epochs]}")
    assert single.test_acc >= 0.9, f"the 1-device reference run did not learn: {history}"
    for mine, ref in zip(double.epochs[-COMPARED:], single.epochs[-COMPARED:], strict=True):
        assert abs(mine.test_acc - ref.test_acc) <= 0.02, \
            f"2-rank accuracy {mine.test_acc:.3f} is {abs(mine.test_acc - ref.test_acc) * 100:.1f} points " \
            f"from 1-device {ref.test_acc:.3f} after epoch {ref.epoch} of {RUN['epochs']} (allowed: 2); {history}"

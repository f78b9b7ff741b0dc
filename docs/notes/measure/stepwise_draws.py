"""Many draws of test_weights' step-by-step property, outside pytest, to see whether a correct run
ever fails it (docs/notes/kernel-timings.md has the counts):

    python docs/notes/measure/stepwise_draws.py SEED COUNT
    ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 python docs/notes/measure/stepwise_draws.py 2 150

Each draw is what the hypothesis property draws: manual over 2 or 3 devices, 3 to 5 steps of
LeNet with momentum and weight decay, a batch of n to 32, a random seed. It prints every failure
and the count.
"""

import contextlib
import io
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from correctness.helpers import assert_stepwise_close, reference_trajectory, run_config, stepwise_configs  # noqa: E402
from mgpu.devices import torch_threads  # noqa: E402
from mgpu.run import train  # noqa: E402


def main(seed: int, count: int) -> int:
    rng, failures = random.Random(seed), 0
    with torch_threads(1):
        for _ in range(count):
            n, steps = rng.choice([2, 3]), rng.randint(3, 5)
            batch = rng.randint(n, 32)
            cfg = run_config("single", model="lenet", epochs=steps, batch_size=batch, train_size=batch + batch // 2,
                             test_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, seed=rng.randint(0, 2**16))
            with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
                reference = reference_trajectory(cfg, f"{folder}/reference")
                results = [train(c) for c in stepwise_configs(reference, "manual", n, folder)]
                try:
                    assert_stepwise_close(results, reference, f"manual over {n}, batch {batch}, seed {cfg.seed}")
                except AssertionError as e:
                    failures += 1
                    print("FAIL", str(e).splitlines()[0], file=sys.stderr)
    print(f"{count} draws (seed {seed}), {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))

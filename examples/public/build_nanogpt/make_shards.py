"""Synthetic stand-ins for fineweb.py's output (ours, not part of build-nanogpt): edu_fineweb10B/ with one
train and one val shard of uint16 GPT-2 token ids, as fineweb.py writes them (np.save), random tokens
below 50257, 2**17 tokens each (fineweb.py's shards hold 10**8).

    python make_shards.py
"""

import os

import numpy as np

rng = np.random.default_rng(0)
os.makedirs("edu_fineweb10B", exist_ok=True)
for split, index in (("val", 0), ("train", 1)):
    tokens = rng.integers(0, 50257, size=2**17, dtype=np.uint16)
    np.save(os.path.join("edu_fineweb10B", f"edufineweb_{split}_{index:06d}"), tokens)

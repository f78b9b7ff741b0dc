"""A tiny transformer language model with tied embeddings, checked for data-parallel parity.

    python -m mgpu check examples/tiny_lm.py:spec

`spec()` returns an `mgpu.spec.ModelSpec`: the model, how to draw a batch of token sequences, and
the loss (mgpu's default: cross-entropy *summed* over every token of every example, so that the
shards of a batch add up to the whole batch's loss; mgpu divides by the global batch size).

Expected: every check passes, `ties` included (the output projection's weight is the token
embedding's weight, on every replica, after every step), with one finding: random-layers, the
dropout in the encoder layers, which mgpu switches off for the comparisons.
"""

import torch
from torch import nn

from mgpu.spec import ModelSpec

VOCAB = 50    # token ids 0..49
CONTEXT = 16  # T, tokens per example


class TinyLM(nn.Module):
    def __init__(self, vocab=VOCAB, context=CONTEXT, d_model=32, heads=4, layers=2, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one tensor, (V, C)

    def forward(self, idx):  # idx: (B, T) token ids
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))  # (B, T, C)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=idx.device)  # (T, T), -inf above the diagonal
        x = self.blocks(x, mask=causal, is_causal=True)  # (B, T, C)
        return self.head(self.norm(x))  # (B, T, V) logits


def draw(n, g):
    """n sequences counting up mod VOCAB from a random start with a random stride (1..3):
    inputs (n, T) and targets (n, T), the next token at each position."""
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB  # (n, T + 1)
    return seq[:, :-1], seq[:, 1:]


def spec():
    return ModelSpec(build=TinyLM, draw=draw, name="tiny_lm")

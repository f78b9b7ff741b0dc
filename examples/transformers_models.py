"""transformers' GPT-2 and BERT, built from small configs (random weights, no download), checked for
data-parallel parity.

    python -m mgpu check examples/transformers_models.py:gpt2
    python -m mgpu check examples/transformers_models.py:bert
    python -m mgpu check examples/transformers_models.py:gpt2_labels     # the model's own loss (labels=)
    python -m mgpu check examples/transformers_models.py:bert_labels

Needs `pip install 'mgpu[models]'` (transformers). The models return `ModelOutput`s, not tensors:
mgpu scores their `logits` (docs/guide/check.md, "The contract"), so no wrapper is needed.

Expected: every check passes and none is skipped, with one finding, random-layers: the dropout
modules and the calls to `scaled_dot_product_attention(dropout_p=0.1)` that transformers' attention
makes itself (it passes its dropout module's probability instead of calling the module), all
switched off for the comparisons. GPT-2 also passes `ties` (its output projection is the token
embedding).

The `_labels` variants train as transformers' Trainer does: the target goes in as `labels=` and the
model computes its own loss (ModelSpec(labels="labels")). transformers' loss is a mean; mgpu needs a
sum over the examples of a shard (docs/guide/check.md, "The contract"). A sequence classifier's mean over
its examples becomes one by multiplying with their number (labels_loss="mean"). A causal LM with
padding averages over the tokens it counts, which differ from shard to shard: it is given
num_items_in_batch=1 and returns their sum (labels_loss="num_items_in_batch"), the remedy
transformers itself adopted for gradient accumulation in late 2024.
"""

import torch

from mgpu.spec import ModelSpec

VOCAB = 64    # token ids 0..63
CONTEXT = 16  # T, tokens per example
CLASSES = 4


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    # use_cache off: a training forward has no use for the attention cache it would return.
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                                      use_cache=False))


def _tokens(n, g):
    """n sequences counting up mod VOCAB from a random start with a random stride (1..3): inputs
    (n, T) and targets (n, T), the next token at each position."""
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB  # (n, T + 1)
    return seq[:, :-1], seq[:, 1:]


def gpt2():
    """GPT-2 with 2 layers of width 32: logits (B, T, V), cross-entropy summed over every token."""
    return ModelSpec(build=_gpt2, draw=_tokens, name="gpt2 (2 layers, width 32)")


def _bert():
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=64,
                                                    max_position_embeddings=CONTEXT, num_labels=CLASSES))


def _sentences(n, g):
    """n random sequences of token ids (n, T), labelled by which quarter of the vocabulary holds
    their first token: (n,)."""
    ids = torch.randint(0, VOCAB, (n, CONTEXT), generator=g)
    return ids, ids[:, 0] * CLASSES // VOCAB


def bert():
    """BERT with 2 layers of width 32, a sequence classifier over 4 classes: logits (B, 4)."""
    return ModelSpec(build=_bert, draw=_sentences, name="bert (2 layers, width 32)")


def _padded_tokens(n, g):
    """Sequences as in _tokens with the model's own labels: the inputs themselves (the model shifts
    them), each one's tail past a random length (8..16 tokens) set to -100, padding the loss leaves out."""
    ids = _tokens(n, g)[0]
    lengths = torch.randint(CONTEXT // 2, CONTEXT + 1, (n, 1), generator=g)
    return ids, ids.masked_fill(torch.arange(CONTEXT) >= lengths, -100)


def _next_token_correct(logits, labels):
    """Per sequence, the share of its counted positions whose argmax is the next token, summed."""
    hits = (logits.detach()[:, :-1].argmax(dim=-1) == labels[:, 1:]).float()
    counted = (labels[:, 1:] != -100).float()
    return ((hits * counted).sum(dim=1) / counted.sum(dim=1).clamp(min=1)).sum()


def gpt2_labels():
    """GPT-2 given labels=, padded: its loss summed over the counted tokens (num_items_in_batch=1)."""
    return ModelSpec(build=_gpt2, draw=_padded_tokens, labels="labels", labels_loss="num_items_in_batch",
                     correct=_next_token_correct, name="gpt2 with labels= (2 layers, width 32)")


def gpt2_labels_mean():
    """The same model scored as a mean over each shard's tokens, times its sequences: wrong where
    shards hold different numbers of tokens (the accumulation bug transformers fixed in late 2024)."""
    return ModelSpec(build=_gpt2, draw=_padded_tokens, labels="labels", labels_loss="mean",
                     correct=_next_token_correct, name="gpt2 with labels=, a mean per shard")


def bert_labels():
    """BERT given labels=: its mean cross-entropy over a shard's examples, times their number."""
    return ModelSpec(build=_bert, draw=_sentences, labels="labels", labels_loss="mean",
                     name="bert with labels= (2 layers, width 32)")

"""Small models with one data-parallel pitfall each, for the tests of `python -m mgpu check`
(correctness/test_check.py): `python -m mgpu check correctness/check_models.py:NAME ...`.

Every function returns a ModelSpec (or an nn.Module) on 1x8x8 images or token ids, tiny enough
that a check of one strategy takes a second.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional as F

from mgpu.spec import ModelSpec, image_spec

SHAPE = (1, 8, 8)


class MLP(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, hidden), nn.Linear(hidden, 4)

    def forward(self, x):  # (B, 1, 8, 8) -> (B, 4)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def mlp() -> ModelSpec:
    return image_spec(MLP, SHAPE, 4, name="mlp")


def plain_module() -> nn.Module:
    """A bare nn.Module: the check needs --input-shape 1,8,8."""
    return MLP()


class Branchy(MLP):
    """A head used only for examples whose first pixel is bright: some shards never use it."""

    def __init__(self):
        super().__init__()
        self.rare = nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.fc1(x.flatten(1)))
        out = self.fc2(h)
        if bool((x[:, 0, 0, 0] > 0.9).any()):  # data-dependent: taken by some shards only
            out = out + self.rare(h)
        return out


def unused_branch() -> ModelSpec:
    return image_spec(Branchy, SHAPE, 4, name="unused_branch")


class WithDropout(MLP):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x.flatten(1)))))


def dropout() -> ModelSpec:
    return image_spec(WithDropout, SHAPE, 4, name="dropout")


class Noisy(MLP):
    def forward(self, x):
        h = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(h + 0.1 * torch.randn_like(h))  # randomness that is no Dropout module


def noisy() -> ModelSpec:
    return image_spec(Noisy, SHAPE, 4, name="noisy")


class BatchCentred(MLP):
    """A home-made layer that mixes the examples: it subtracts the batch mean."""

    def forward(self, x):
        h = self.fc1(x.flatten(1))
        return self.fc2(F.relu(h - h.mean(dim=0, keepdim=True)))


def batch_centred() -> ModelSpec:
    return image_spec(BatchCentred, SHAPE, 4, name="batch_centred")


def batchnorm() -> ModelSpec:
    def build():
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 64, 4))
    return image_spec(build, SHAPE, 4, name="batchnorm")


class ReassignedBuffer(MLP):
    """A statistic of the batch kept by *reassigning* a buffer (each device computes it from its
    shard), and a non-persistent buffer drawn at construction (DDP ranks seeded apart draw others)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen_scale", torch.ones(()))
        self.register_buffer("projection", torch.randn(64, 64), persistent=False)

    def forward(self, x):
        if self.training:
            self.seen_scale = 0.9 * self.seen_scale + 0.1 * x.detach().abs().mean()
        return self.fc2(F.relu(self.fc1(x.flatten(1) @ self.projection * 0.1)))


def reassigned_buffer() -> ModelSpec:
    return image_spec(ReassignedBuffer, SHAPE, 4, name="reassigned_buffer")


def zero_gradients() -> ModelSpec:
    """Cross-entropy over a single class (pytorch/examples' DDP tutorial trains so): the loss is 0 whatever
    the weights, every gradient is zero, and every comparison agrees while proving nothing."""
    return image_spec(MLP, SHAPE, 4, name="zero_gradients",
                      loss=lambda out, y: F.cross_entropy(out[:, :1], torch.zeros_like(y), reduction="sum"))


def mean_loss() -> ModelSpec:
    """The loss averaged over the examples, not summed: a mean per device."""
    return image_spec(MLP, SHAPE, 4, name="mean_loss", loss=lambda out, y: F.cross_entropy(out, y))


class TiedLM(nn.Module):
    """Tied embeddings, and random features: a fixed projection drawn when the model is built (ranks
    seeded apart draw different ones; a start that copies only rank 0's parameters leaves them apart)."""

    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.register_buffer("features", torch.randn(dim, dim) / dim ** 0.5)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        return self.head(torch.tanh(self.mix(self.embed(tokens) @ self.features)))


def _tokens(n: int, g: torch.Generator):
    seq = torch.randint(0, 11, (n, 6), generator=g)
    return seq, (seq + 1) % 11


def tied_lm() -> ModelSpec:
    return ModelSpec(build=TiedLM, draw=_tokens, name="tied_lm")


class Hangs(MLP):
    def forward(self, x):
        time.sleep(3600)
        return super().forward(x)


def hangs() -> ModelSpec:
    return image_spec(Hangs, SHAPE, 4, name="hangs")


def no_parameters() -> nn.Module:
    return nn.Flatten()


def raises() -> nn.Module:
    raise ValueError("width must be even")


def returns_int():
    return 3


def wrong_classes() -> ModelSpec:
    return image_spec(MLP, SHAPE, 7, name="wrong_classes")  # targets up to 6, the model scores 4 classes


# -- what models people train do (transformers, timm, user code): issue 30 ----------------------------------

class AttentionWithFunctionalDropout(nn.Module):
    """Attention as transformers and timm write it: the dropout module's probability passed to
    scaled_dot_product_attention and to F.dropout, the modules themselves never called."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.2)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0,
                                           is_causal=True)  # (B, heads, T, C / heads)
        y = self.out(y.transpose(1, 2).reshape(B, T, C))
        return x + F.dropout(y, p=self.resid_dropout.p, training=self.training)


class FunctionalDropoutLM(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(AttentionWithFunctionalDropout(dim), AttentionWithFunctionalDropout(dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        return self.head(self.blocks(self.embed(tokens)))


def functional_dropout() -> ModelSpec:
    return ModelSpec(build=FunctionalDropoutLM, draw=_tokens, name="functional_dropout")


class OutputRecord(dict):
    """What transformers' models return (a ModelOutput is a dict): the logits among other tensors."""


class RecordLM(TiedLM):
    def forward(self, tokens):
        hidden = torch.tanh(self.mix(self.embed(tokens)))
        return OutputRecord(last_hidden_state=hidden, logits=self.head(hidden))


def record_output() -> ModelSpec:
    return ModelSpec(build=RecordLM, draw=_tokens, name="record_output")


class HiddenOnly(TiedLM):
    def forward(self, tokens):
        hidden = torch.tanh(self.mix(self.embed(tokens)))
        return OutputRecord(hidden=hidden, scores=self.head(hidden))


def named_output() -> ModelSpec:
    """No `logits`: the spec names the field the loss scores."""
    return ModelSpec(build=HiddenOnly, draw=_tokens, name="named_output", output="scores")


def unnamed_output() -> ModelSpec:
    return ModelSpec(build=HiddenOnly, draw=_tokens, name="unnamed_output")


class LazyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.LazyLinear(16), nn.LazyLinear(4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def lazy() -> ModelSpec:
    return image_spec(LazyMLP, SHAPE, 4, name="lazy")


def lazy_unbuildable() -> nn.Module:
    """A lazy layer whose first forward fails: no materialising forward is possible."""
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.LazyLinear(4)

        def forward(self, x):
            return self.fc(x.view(3, -1, 5))  # fails for any batch of 1x8x8 images

    return Broken()


class BufferReadInForward(MLP):
    """A statistic of the batch written to a buffer and used in the same forward: the examples mix
    through the buffer, and no submodule of the model mixes on its own."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        if self.training:
            self.scale = x.detach().abs().mean() + 0.5
        return self.fc2(F.relu(self.fc1(x.flatten(1) / self.scale)))


def buffer_read_in_forward() -> ModelSpec:
    return image_spec(BufferReadInForward, SHAPE, 4, name="buffer_read_in_forward")


class ZeroHeadDropout(WithDropout):
    """Dropout under a head initialised to zeros (as torchvision's ViT starts): the output is the same
    whatever the masks, the gradients are not."""

    def __init__(self):
        super().__init__()
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)


def zero_head_dropout() -> ModelSpec:
    return image_spec(ZeroHeadDropout, SHAPE, 4, name="zero_head_dropout")


def compiled_ddp_bypassing_the_reducer() -> ModelSpec:
    """A planted defect in how a strategy compiles, for `check --compile`: DDP's inner module is
    compiled instead of the DDP wrapper, so the training forward and backward never reach DDP's
    reducer and no gradient is averaged over the ranks. The ranks are fresh processes: the plant is
    made wherever this spec is loaded (a test restores the launching process's class).
    The defect is in what is compiled, which dynamo's capture decides (the inner module's graph has
    no reducer hook), not in the kernels inductor would build from it: the plant compiles with
    torch's "aot_eager" backend, the same capture and AOTAutograd backward without building C++ (on
    a cold cache, every rank compiles every kernel with g++ itself)."""
    from mgpu.strategies.ddp import DistributedDataParallel

    DistributedDataParallel.compiled = (lambda self, net: torch.compile(net.module, backend="aot_eager")
                                        if self.compile_model else net)
    return mlp()


class OwnLossLM(TiedLM):
    """transformers' convention: given `labels`, the model computes its loss itself, a mean over the
    tokens it counts (labels of -100 are padding), or with num_items_in_batch, their sum over that."""

    def forward(self, tokens, labels=None, num_items_in_batch=None):
        logits = super().forward(tokens)  # (B, T, V)
        if labels is None:
            return {"logits": logits}
        summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                 reduction="sum")
        counted = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
        return {"loss": summed / counted, "logits": logits}


def _padded_tokens(n: int, g: torch.Generator):
    """_tokens with each sequence's tail past a random length (2..6) padded out of the loss (-100)."""
    seq, target = _tokens(n, g)
    lengths = torch.randint(2, 7, (n, 1), generator=g)
    return seq, target.masked_fill(torch.arange(6) >= lengths, -100)


def _counted_correct(logits, labels):
    hits = (logits.detach().argmax(dim=-1) == labels).float()
    counted = (labels != -100).float()
    return ((hits * counted).sum(dim=1) / counted.sum(dim=1).clamp(min=1)).sum()


def own_loss_lm() -> ModelSpec:
    """The model's own loss summed over its tokens (num_items_in_batch=1), padding left out: right."""
    return ModelSpec(build=OwnLossLM, draw=_padded_tokens, labels="labels", labels_loss="num_items_in_batch",
                     correct=_counted_correct, name="own_loss_lm")


def own_loss_lm_as_a_mean() -> ModelSpec:
    """The same loss taken as a mean over each shard's examples: wrong where shards count different
    numbers of tokens."""
    return ModelSpec(build=OwnLossLM, draw=_padded_tokens, labels="labels", labels_loss="mean",
                     correct=_counted_correct, name="own_loss_lm_as_a_mean")


class OwnLossMLP(MLP):
    def forward(self, x, labels=None):
        logits = super().forward(x)
        return {"logits": logits} if labels is None else {"loss": F.cross_entropy(logits, labels), "logits": logits}


def own_loss_classifier() -> ModelSpec:
    """An image classifier that returns its own mean cross-entropy when given labels: a mean over
    examples, made a sum by labels_loss="mean"."""
    return ModelSpec(build=OwnLossMLP, draw=image_spec(MLP, SHAPE, 4).draw, labels="labels", name="own_loss_classifier")


class CrashesSharded(MLP):
    """Works everywhere but under FSDP, whose fully_shard gives the module a class of its own
    ("FSDPCrashesSharded"): a crash of one strategy among the ranks' several."""

    def forward(self, x):
        if type(self).__name__.startswith("FSDP"):
            raise RuntimeError("this model cannot be sharded")
        return super().forward(x)


def crashes_sharded() -> ModelSpec:
    return image_spec(CrashesSharded, SHAPE, 4, name="crashes_sharded")

"""Data parallelism from scratch, as in the from-scratch notebook.

One model replica per device. Each step: split the global batch into contiguous shards, run
forward and backward of the *summed* loss on each replica, allreduce every gradient (sum over
devices), divide by the global batch size, and apply the same SGD update on every replica. The
summed loss makes uneven shards give exactly the full-batch mean gradient; averaging per-shard
means would weight the examples of smaller shards more.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mgpu.comm import allreduce, split_batch
from mgpu.strategies.base import OptimizerFactory, Strategy, micro_batches


class Manual(Strategy):
    name = "manual"

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        self.replicas = [self.place(copy.deepcopy(model), d) for d in self.devices]
        self.nets = [self.compiled(r) for r in self.replicas]  # what each replica's forward runs through
        self.opts = [make_optimizer(list(r.parameters())) for r in self.replicas]

    def forward_backward(self, X, y: torch.Tensor, global_batch_size: int, micro_steps: int = 1) -> torch.Tensor:
        Xs, ys = split_batch(X, y, self.devices)
        pieces = [list(micro_batches(X_shard, y_shard, micro_steps)) for X_shard, y_shard in zip(Xs, ys)]
        main = self.devices[0]
        stats = torch.zeros(2, device=main)
        for k in range(micro_steps):
            for net, device, shard_pieces in zip(self.nets, self.devices, pieces):
                if k >= len(shard_pieces):
                    continue  # a shard smaller than micro_steps has fewer pieces
                X_piece, y_piece = shard_pieces[k]
                with self.autocast(device):
                    output = self.objective.forward(net, self.inputs(X_piece, device), y_piece)
                    loss, piece_stats = self.objective.loss_and_stats(output, y_piece, 1.0)
                loss.backward()  # queued per device: the host never waits here, so on GPUs the replicas overlap
                stats += piece_stats.to(main, non_blocking=True)  # device to device: no host read
        self.sync_gradients(global_batch_size)
        return stats

    def optimizer_step(self) -> None:
        for opt in self.opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        self._broadcast_buffers()

    def sync_gradients(self, global_batch_size: int) -> None:
        """Allreduce every parameter's gradient over the replicas, then turn the sum of summed
        losses into the gradient of the global mean loss (as DDP's backward does, before the step)."""
        params = [list(r.parameters()) for r in self.replicas]
        with torch.no_grad():
            for same_param in zip(*params):
                if all(p.grad is None for p in same_param):
                    continue  # used by no replica in this step: no gradient anywhere, as on one device
                for p in same_param:
                    if p.grad is None:  # unused on this replica's shard only: it contributes zero
                        p.grad = torch.zeros_like(p)
                grads = [p.grad for p in same_param]
                allreduce(grads)
                for g in grads:
                    g.div_(global_batch_size)  # summed loss -> mean over the global batch

    def _broadcast_buffers(self) -> None:
        # BatchNorm running statistics see only their own shard; copy replica 0's to the others,
        # as DDP does (broadcast_buffers=True), so evaluation on any device agrees.
        with torch.no_grad():
            main = list(self.replicas[0].buffers())
            for replica in self.replicas[1:]:
                for b, b0 in zip(replica.buffers(), main):
                    b.copy_(b0)

    def modules(self) -> list[nn.Module]:
        return self.replicas

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self.opts

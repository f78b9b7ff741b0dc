"""Collective peers: this process as rank 0 of a process group whose other ranks mirror its
all_reduce calls, so that a benchmark times a collective directly (and checks its result)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from mgpu_perf.harness.ranks import RankPool, RankPoolError, _Factory, rank_context

__all__ = ["CollectivePeers", "allreduce_pattern"]


# -- collectives -------------------------------------------------------------------------------

def allreduce_pattern(numel: int, rank: int, device, dtype=torch.float32) -> torch.Tensor:
    """What rank (or device) `rank` contributes to a checked allreduce: small integers, exact in
    float32 when summed, different on every rank and along the tensor."""
    return ((torch.arange(numel, dtype=torch.int64) * (rank + 3)) % 251 + rank + 1).to(device=device, dtype=dtype)


class _Peer:
    """A helper rank: joins the caller's process group and mirrors its all_reduce calls."""

    def __init__(self, backend: str, stop_at):
        torch.set_num_threads(1)  # gloo does the work on its own threads; leave the cores to the ranks
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=120))
        self.rank, self.world, self.stop_at = rank, world, stop_at

    def follow(self, numel: int) -> tuple[int, int]:
        """Join all_reduce calls (fresh contribution before each) until the call numbered `stop_at`;
        return (calls, wrong elements of the last result)."""
        mine = allreduce_pattern(numel, self.rank, self.device)
        expected = sum(allreduce_pattern(numel, r, self.device) for r in range(self.world))
        t = torch.empty_like(mine)
        calls = 0
        while True:
            t.copy_(mine)
            dist.all_reduce(t)
            calls += 1
            if self.stop_at.value == calls:
                return calls, int((t != expected).sum())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class CollectivePeers:
    """This process as rank 0 of a `world_size` process group; a RankPool holds the other ranks,
    which mirror every `all_reduce` this process makes, so the caller times it directly.

        peers = CollectivePeers(2, "gloo")
        t = peers.begin(numel)             # the helpers start following
        peers.reset(t); dist.all_reduce(t) # as many times as you like (reset: untimed)
        wrong = peers.end(t, calls)        # wrong elements, this rank's last result and theirs
        peers.close()
    """

    def __init__(self, world_size: int, backend: str, timeout_s: float = 120.0):
        import sys

        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this process")
        self.world_size, self.backend = world_size, backend
        self.device = torch.device("cuda:0") if backend == "nccl" else torch.device("cpu")
        self._stop_at = rank_context().RawValue("q", 0)
        self.pool = RankPool(_Factory(_Peer, backend, self._stop_at), world_size, first_rank=1)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._excepthook = sys.excepthook  # init_process_group wraps it ("[rank0]: ..." on every line), for good
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{self.pool.port}", rank=0,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        self.pool.wait_ready()
        self._mine = self._expected = None

    def begin(self, numel: int) -> torch.Tensor:
        self._stop_at.value = 0
        self.pool.send("follow", numel)
        self._mine = allreduce_pattern(numel, 0, self.device)
        self._expected = sum(allreduce_pattern(numel, r, self.device) for r in range(self.world_size))
        return torch.empty_like(self._mine)

    def reset(self, t: torch.Tensor) -> None:
        t.copy_(self._mine)

    def wrong(self, t: torch.Tensor) -> int:
        return int((t != self._expected).sum())

    def end(self, t: torch.Tensor, calls: int) -> int:
        """Make one last checked call (number calls + 1) that ends the helpers' loop; return
        the wrong elements over all ranks' results of that call."""
        self._stop_at.value = calls + 1  # set before the call the helpers are about to finish
        self.reset(t)
        dist.all_reduce(t)
        wrong = self.wrong(t)
        for rank, (their_calls, their_wrong) in zip(self.pool.ranks, self.pool.collect("follow")):
            if their_calls != calls + 1:
                raise RankPoolError(f"rank {rank} made {their_calls} all_reduce calls, rank 0 made {calls + 1}")
            wrong += their_wrong
        return wrong

    def close(self) -> None:
        import sys

        self.pool.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.excepthook = self._excepthook



"""The rendezvous `mgpu.launch.spawn` gives torch's elastic agent: one node, this machine.

    register()          # then LaunchConfig(rdzv_backend=BACKEND, rdzv_endpoint="127.0.0.1:0", ...)

What torch's c10d backend with is_host gives a single node: a TCPStore on the endpoint (port 0: one
the kernel picks) for the agent, and the ranks' MASTER_PORT, a second store bound to a free port and
shared with the ranks (TORCHELASTIC_USE_AGENT_STORE=True), MASTER_ADDR the host's name; both bound
before any rank starts. Without the c10d backend's multi-node protocol, which a lone node only pays
for: a random 0-0.3 s sleep before joining (it spreads many nodes' first attempts), a heartbeat thread,
a store round trip at each of the agent's looks at the ranks, and a call of `inspect.stack()` for each
of its nine or so event records, which walks every frame of the caller's stack and reads its source
(about 0.3 s of CPU a launch under pytest's deep stacks, where `inspect.getmodule` scans sys.modules
for a frame; docs/notes/suite-times.md, 2026-11-28, third session). It is registered with torch's
handler registry (`rendezvous_handler_registry.register`, torch's way to add a backend), so the agent
and all it does (starting, watching and stopping the ranks, their environment) are torch's own.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (RendezvousHandler, RendezvousInfo, RendezvousParameters,
                                                  RendezvousStoreInfo, rendezvous_handler_registry)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

__all__ = ["BACKEND", "register"]

BACKEND = "mgpu-one-node"
# The agent's store's read timeout: the c10d backend's default (its read_timeout).
READ_TIMEOUT_S = 60


class OneNodeRendezvous(RendezvousHandler):
    """Rank 0 of a world of one node; the stores live as long as the handler (the agent's run)."""

    def __init__(self, params: RendezvousParameters):
        self._params = params
        self._host, self._port = parse_rendezvous_endpoint(params.endpoint, default_port=0)
        self._stores: list[TCPStore] = []   # the agent's, then the ranks' (their MASTER_PORT)
        self._addr = ""
        self._closed = False

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        if not self._stores:
            self._stores.append(TCPStore(self._host, self._port, is_master=True, multi_tenant=True,
                                         timeout=timedelta(seconds=READ_TIMEOUT_S)))
            self._addr = self._params.local_addr or socket.getfqdn()  # as the c10d backend's node descriptor
            self._stores.append(TCPStore(self._addr, 0, is_master=True, multi_tenant=True))
        store = PrefixStore(f"torch.rendezvous.{self._params.run_id}.0", self._stores[0])
        return RendezvousInfo(store, 0, 1, RendezvousStoreInfo(self._addr, self._stores[1].port))

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._params.run_id

    def shutdown(self) -> bool:
        """Drop both stores: their ports close with the last reference."""
        self._closed = True
        self._stores.clear()
        return True


def register() -> None:
    """Make BACKEND known to torch's rendezvous registry (again: a no-op)."""
    rendezvous_handler_registry.register(BACKEND, OneNodeRendezvous)

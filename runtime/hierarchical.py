"""Node-wise (hierarchical) all-to-all: gather within a node, one message per node pair
across nodes, scatter within the node.

Same contract as `FlatAllToAll`: rank r sends `splits[r, d]` elements to every rank d
and receives them in source order.  Ranks are grouped into nodes of `gpus_per_node`
consecutive ranks; rank (a, j) is local rank j of node a.  Traffic between nodes a != b
is relayed by one rank per node on rail k(a, b) = (a + b) mod G, so each node pair
exchanges exactly one message each way and a node's inter-node traffic is spread over
its G ranks (and their NICs) instead of funnelled through one leader:

    phase 1 (node subgroup):  (a, j) -> (a, k): data for (a, k) itself, plus its data for
                              every node b != a with k(a, b) = k (the relay gathers)
    phase 2 (rail subgroup):  (a, k) -> (b, k): everything node a sends to node b
    phase 3 (node subgroup):  (b, k) -> (b, m): the relayed data destined for (b, m)

Intra-node data moves once (phase 1); inter-node data crosses the network once, in
N·(N-1) messages instead of the flat all-to-all's N·(N-1)·G² (N nodes).  Inter-node bytes
are the same as flat; what changes is message count and size.  Built from
`torch.distributed.new_group` subgroups with group-local synchronisation, so it works
inside any data-parallel group of a larger world; constructing it is a collective call
on every rank of `group` (and only those), which first all-gathers `gpus_per_node` so
that ranks built with different layouts raise instead of blocking in `new_group`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..balancers.validation import is_int
from .agreement import call_header, disagreement
from .alltoall import FlatAllToAll, Flows, check_buffer
from .comm import finish, group_rank, group_size


def _regroup(buffer: torch.Tensor, have: list, want: list, sizes: dict) -> torch.Tensor:
    """Reorder the (src, dst) segments of `buffer`, laid out as `have`, into `want`."""
    offsets, position = {}, 0
    for key in have:
        offsets[key] = position
        position += sizes.get(key, 0)
    pieces = [buffer[offsets[key]: offsets[key] + sizes.get(key, 0)] for key in want if sizes.get(key, 0)]
    return torch.cat(pieces) if pieces else buffer[:0]


def _agree_on_layout(gpus_per_node: int, group) -> None:
    """All-gather every rank's `gpus_per_node` before any subgroup is created: ranks that
    disagree would wait forever inside `new_group`; here every rank raises, naming them.  The
    gather is a `call_header`: where other ranks are in another orchmllm call (a dispatcher's
    plan on the flat transport), every rank names both calls."""
    if group_size(group) == 1:
        return
    rows = call_header("layout", [gpus_per_node], group, "HierarchicalAllToAll's layout all-gather").tolist()
    problem = disagreement([row[0] for row in rows], "HierarchicalAllToAll's `gpus_per_node`",
                           group_rank(group), show=lambda value: "invalid" if value < 0 else str(value))
    if problem:
        raise ValueError(f"{problem}; every rank of the group must build the transport with the same layout")


class HierarchicalAllToAll:
    """Node-wise all-to-all over `group`, nodes of `gpus_per_node` consecutive ranks."""

    def __init__(self, gpus_per_node: int, group=None):
        valid = is_int(gpus_per_node) and gpus_per_node >= 1
        _agree_on_layout(int(gpus_per_node) if valid else -1, group)
        if not valid:
            raise ValueError(f"`gpus_per_node` must be a positive int; got {gpus_per_node!r}")
        size = group_size(group)
        if size % gpus_per_node:
            raise ValueError(f"group of {size} ranks is not a whole number of nodes of "
                             f"gpus_per_node={gpus_per_node} ({size} % {gpus_per_node} = {size % gpus_per_node})")
        self.group = group
        self.gpus_per_node = gpus_per_node
        self.num_nodes = size // gpus_per_node
        members = (dist.get_process_group_ranks(group) if dist.is_initialized() and group is not None
                   else list(range(size)))
        me = group_rank(group)
        self.node, self.local = divmod(me, gpus_per_node)
        self.node_group = self._subgroups(members, [[a * gpus_per_node + j for j in range(gpus_per_node)]
                                                    for a in range(self.num_nodes)])
        self.rail_group = self._subgroups(members, [[a * gpus_per_node + k for a in range(self.num_nodes)]
                                                    for k in range(gpus_per_node)])

    def _subgroups(self, members: list[int], layouts: list[list[int]]):
        """Create every subgroup on every rank (a collective) and keep this rank's."""
        mine = None
        me = self.node * self.gpus_per_node + self.local
        for positions in layouts:
            if len(positions) == 1:
                subgroup = None
            else:
                subgroup = dist.new_group([members[p] for p in positions], use_local_synchronization=True)
            if me in positions:
                mine = (subgroup, positions)
        return mine

    @property
    def size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def rank(self) -> int:
        return self.node * self.gpus_per_node + self.local

    def relay_rail(self, node_a: int, node_b: int) -> int:
        """Local rank that relays the traffic between nodes a and b (both directions)."""
        return (node_a + node_b) % self.gpus_per_node

    def _exchange(self, subgroup, positions: list[int], buffer: torch.Tensor,
                  send_keys: dict, recv_keys: dict, sizes: dict):
        """All-to-all inside one subgroup; keys list the (src, dst) segments per peer."""
        send_splits = [sum(sizes.get(key, 0) for key in send_keys[p]) for p in positions]
        recv_splits = [sum(sizes.get(key, 0) for key in recv_keys[p]) for p in positions]
        if subgroup is None:
            output = buffer
        else:
            output = buffer.new_empty(sum(recv_splits))
            finish(dist.all_to_all_single(output, buffer, recv_splits, send_splits, group=subgroup, async_op=True),
                   self.group)
        return output, [key for p in positions for key in recv_keys[p]]

    def __call__(self, buffer: torch.Tensor, flows: Flows) -> torch.Tensor:
        """Send `buffer`'s segments to their ranks; return what arrives, in source order."""
        size, me, g = self.size, self.rank, self.gpus_per_node
        check_buffer(buffer, flows, me, size)
        if size == 1:
            return buffer
        a = self.node

        def rank_of(node: int, local: int) -> int:
            return node * g + local

        def relayed_nodes(node: int, rail: int) -> list[int]:
            return [b for b in range(self.num_nodes) if b != node and self.relay_rail(node, b) == rail]

        # Only segments that touch this node or the nodes it relays for are ever looked up.
        near = [rank_of(b, j) for b in [a] + relayed_nodes(a, self.local) for j in range(g)]
        splits = flows.pairs(near, near)  # {(src, dst): elements}, absent when none
        splits.update(((me, d), int(n)) for d, n in enumerate(flows.row(me)) if n)
        splits.update(((s, me), int(n)) for s, n in enumerate(flows.column(me)) if n)

        # Phase 1: inside node a, direct data and data to relay.
        node_group, node_positions = self.node_group
        have = [(me, d) for d in range(size)]

        def phase1_keys(src: int, k: int) -> list:
            return [(src, rank_of(a, k))] + [(src, rank_of(b, m)) for b in relayed_nodes(a, k) for m in range(g)]

        send1 = {rank_of(a, k): phase1_keys(me, k) for k in range(g)}
        recv1 = {rank_of(a, j): phase1_keys(rank_of(a, j), self.local) for j in range(g)}
        order1 = [key for p in node_positions for key in send1[p]]
        stage1, keys1 = self._exchange(node_group, node_positions, _regroup(buffer, have, order1, splits),
                                       send1, recv1, splits)

        # Phase 2: along this rank's rail, one message per node pair.
        rail_group, rail_positions = self.rail_group
        k = self.local

        def pair_keys(src_node: int, dst_node: int) -> list:
            return [(rank_of(src_node, j), rank_of(dst_node, m)) for m in range(g) for j in range(g)]

        send2 = {rank_of(b, k): (pair_keys(a, b) if b in relayed_nodes(a, k) else []) for b in range(self.num_nodes)}
        recv2 = {rank_of(b, k): (pair_keys(b, a) if b in relayed_nodes(a, k) else []) for b in range(self.num_nodes)}
        order2 = [key for p in rail_positions for key in send2[p]]
        stage2, keys2 = self._exchange(rail_group, rail_positions, _regroup(stage1, keys1, order2, splits),
                                       send2, recv2, splits)

        # Phase 3: inside node a, relayed data to its final rank.
        sources = relayed_nodes(a, k)
        send3 = {rank_of(a, m): [(rank_of(b, j), rank_of(a, m)) for b in sources for j in range(g)]
                 for m in range(g)}
        recv3 = {rank_of(a, i): [(rank_of(b, j), me) for b in relayed_nodes(a, i) for j in range(g)]
                 for i in range(g)}
        order3 = [key for p in node_positions for key in send3[p]]
        stage3, keys3 = self._exchange(node_group, node_positions, _regroup(stage2, keys2, order3, splits),
                                       send3, recv3, splits)

        direct = [(rank_of(a, j), me) for j in range(g)]
        arrived = torch.cat([_regroup(stage1, keys1, direct, splits), stage3])
        return _regroup(arrived, direct + keys3, [(s, me) for s in range(size)], splits)


def make_transport(kind: str = "flat", group=None, gpus_per_node: int | None = None):
    """`"flat"` → FlatAllToAll, `"hierarchical"` → HierarchicalAllToAll(gpus_per_node)."""
    if kind == "flat":
        return FlatAllToAll(group)
    if kind == "hierarchical":
        if gpus_per_node is None:
            raise ValueError("`gpus_per_node` is required for the hierarchical transport")
        return HierarchicalAllToAll(gpus_per_node, group)
    raise ValueError(f"unknown transport {kind!r}; choose 'flat' or 'hierarchical'")

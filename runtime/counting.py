"""Count a rank's collectives and the bytes its all-to-alls send: a check that a step makes the
collectives it promises (e.g. the same ones whether or not anything splits) and sends exactly the
plan's bytes.

    counter = CollectiveCounter()          # wraps torch.distributed's calls in this process
    ...step...
    counter.calls["all_to_all_single"], counter.sent
    counter.close()                        # puts the original calls back
"""

from __future__ import annotations

import torch.distributed as dist


class CollectiveCounter:
    """Counts this rank's collectives by kind (`calls`) and the payload bytes its all-to-alls send to
    other ranks (`sent`, from the send splits of `all_to_all_single`)."""

    KINDS = ("all_gather", "all_gather_object", "all_reduce", "all_to_all_single", "batch_isend_irecv", "broadcast")

    def __init__(self):
        self.calls, self.sent = dict.fromkeys(self.KINDS, 0), 0
        self._originals = {kind: getattr(dist, kind) for kind in self.KINDS}
        for kind, call in self._originals.items():
            setattr(dist, kind, self._counting(kind, call))

    def _counting(self, kind, call):
        def counted(*args, **kwargs):
            self.calls[kind] += 1
            if kind == "all_to_all_single":
                self.sent += _sent_bytes(*args, **kwargs)
            return call(*args, **kwargs)
        return counted

    def close(self) -> None:
        """Put torch.distributed's own calls back."""
        for kind, call in self._originals.items():
            setattr(dist, kind, call)



def _sent_bytes(output, buffer, output_split_sizes=None, input_split_sizes=None, group=None, **_) -> int:
    """Bytes an `all_to_all_single` call sends to the other ranks of its group (ranks numbered within it, as a
    node-wise transport's subgroups number them; equal splits where none are given)."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    rows = list(input_split_sizes) if input_split_sizes else [len(buffer) // size] * size
    row_bytes = buffer.numel() // max(len(buffer), 1) * buffer.element_size()
    return (sum(rows) - rows[me]) * row_bytes

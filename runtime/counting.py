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

    KINDS = ("all_gather", "all_reduce", "all_to_all_single", "batch_isend_irecv")

    def __init__(self):
        self.calls, self.sent = dict.fromkeys(self.KINDS, 0), 0
        self._originals = {kind: getattr(dist, kind) for kind in self.KINDS}
        for kind, call in self._originals.items():
            setattr(dist, kind, self._counting(kind, call))

    def _counting(self, kind, call):
        def counted(*args, **kwargs):
            self.calls[kind] += 1
            if kind == "all_to_all_single":
                _, buffer, _, sends = args[:4]
                self.sent += (sum(sends) - sends[dist.get_rank()]) * buffer.element_size()
            return call(*args, **kwargs)
        return counted

    def close(self) -> None:
        """Put torch.distributed's own calls back."""
        for kind, call in self._originals.items():
            setattr(dist, kind, call)

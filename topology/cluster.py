"""The cluster a plan runs on: nodes of GPUs, intra- and inter-node links.

Rank r lives on node r // gpus_per_node (the torchrun / SLURM block layout).  Bandwidths
are per GPU and per direction: every GPU has its own NVLink port (intra-node) and its
own NIC (inter-node, rail-optimised fabrics), so a node can push gpus_per_node times the
per-GPU inter-node bandwidth out at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..balancers.validation import as_int, as_real

# name -> (gpus_per_node, intra-node B/s per GPU, inter-node B/s per GPU, latency s)
PRESETS: dict[str, tuple[int, float, float, float]] = {
    # DGX/HGX H100: NVLink 4 at 450 GB/s per direction, one 400 Gb/s NDR NIC per GPU.
    "h100": (8, 450e9, 50e9, 10e-6),
    # DGX/HGX A100: NVLink 3 at 300 GB/s per direction, one 200 Gb/s HDR NIC per GPU.
    "a100": (8, 300e9, 25e9, 10e-6),
    # GB200 NVL72: 72 GPUs in one NVLink 5 domain at 900 GB/s, 400 Gb/s NIC per GPU.
    "gb200-nvl72": (72, 900e9, 50e9, 10e-6),
    # PCIe servers without NVLink (e.g. 8× L40S): PCIe 4 x16 ~25 GB/s, 100 Gb/s Ethernet.
    "pcie": (8, 25e9, 12.5e9, 20e-6),
}


@dataclass(frozen=True)
class Topology:
    """`num_nodes` nodes of `gpus_per_node` GPUs; rank r is on node r // gpus_per_node.

    Defaults are the `h100` preset: NVLink 450 GB/s and a 400 Gb/s (50 GB/s) NIC per GPU,
    10 µs per message.
    """

    num_nodes: int
    gpus_per_node: int
    intra_node_bw_bytes_per_s: float = PRESETS["h100"][1]
    inter_node_bw_bytes_per_s: float = PRESETS["h100"][2]
    latency_s: float = PRESETS["h100"][3]

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_nodes", as_int(self.num_nodes, "num_nodes", minimum=1))
        object.__setattr__(self, "gpus_per_node", as_int(self.gpus_per_node, "gpus_per_node", minimum=1))
        for name in ("intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s"):
            object.__setattr__(self, name, as_real(getattr(self, name), name, allow_zero=False))
        object.__setattr__(self, "latency_s", as_real(self.latency_s, "latency_s"))

    @property
    def world_size(self) -> int:
        """Number of ranks: num_nodes · gpus_per_node."""
        return self.num_nodes * self.gpus_per_node

    def node_of(self, ranks) -> np.ndarray:
        """Node index of every rank in `ranks` (int64 array of the same shape)."""
        array = np.asarray(ranks)
        if array.size and (array.dtype == object or array.dtype.kind not in "iu"):
            raise TypeError(f"`ranks` must hold integer ranks; got dtype {array.dtype}")
        array = array.astype(np.int64)
        if array.size and (array.min() < 0 or array.max() >= self.world_size):
            bad = int(array.min()) if array.min() < 0 else int(array.max())
            raise ValueError(f"`ranks` must be in [0, {self.world_size}) for {self.num_nodes} nodes × "
                             f"{self.gpus_per_node} gpus; got {bad}")
        return array // self.gpus_per_node

    def check_world_size(self, world_size: int, name: str = "world size") -> None:
        """Raise ValueError, showing the arithmetic, unless world_size equals num_nodes · gpus_per_node."""
        if world_size != self.world_size:
            raise ValueError(f"{self.num_nodes} nodes × {self.gpus_per_node} gpus = {self.world_size} "
                             f"!= {name} {world_size}")

    @classmethod
    def preset(cls, name: str, num_nodes: int) -> "Topology":
        """A named cluster type (see `PRESETS`) with `num_nodes` nodes."""
        if name not in PRESETS:
            raise ValueError(f"unknown topology preset {name!r}; choose one of {sorted(PRESETS)}")
        gpus, intra, inter, latency = PRESETS[name]
        return cls(num_nodes, gpus, intra_node_bw_bytes_per_s=intra, inter_node_bw_bytes_per_s=inter,
                   latency_s=latency)

    @classmethod
    def for_world_size(cls, world_size: int, gpus_per_node: int | None = None,
                       preset: str = "h100") -> "Topology":
        """The topology of `world_size` ranks in full nodes (gpus_per_node defaults to the preset's)."""
        world_size = as_int(world_size, "world_size", minimum=1)
        if preset not in PRESETS:
            raise ValueError(f"unknown topology preset {preset!r}; choose one of {sorted(PRESETS)}")
        gpus, intra, inter, latency = PRESETS[preset]
        gpus = gpus if gpus_per_node is None else as_int(gpus_per_node, "gpus_per_node", minimum=1)
        if world_size % gpus:
            raise ValueError(f"world size {world_size} is not a whole number of nodes of {gpus} gpus: "
                             f"{world_size} = {world_size // gpus} × {gpus} + {world_size % gpus}")
        return cls(world_size // gpus, gpus, intra_node_bw_bytes_per_s=intra,
                   inter_node_bw_bytes_per_s=inter, latency_s=latency)

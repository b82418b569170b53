"""molecule: message passing over random molecular graphs (MPNN and E(n)-equivariant EGNN).

Each batch is ``batch`` random molecules of ``size`` heavy atoms: a random
spanning tree of bonds plus a ring closure, atom types from the common
organic elements, bond types single/double/triple/aromatic, and (for EGNN)
3D coordinates. Graphs are flattened into one node list with ``graph_index``
saying which molecule a node belongs to, as graph libraries do. Aggregation
is ``index_add_``, deterministic on CPU. The target is a property the graph
determines (a weighted atom count plus a bond term), so training learns.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..built import BuiltModel, finish_model, input_generator, output_loss, sgd_factory
from ..config import ModelConfig
from ..registry import ModelEntry, register_model

ATOM_TYPES, BOND_TYPES = 9, 4  # C N O F P S Cl Br I; single double triple aromatic
ATOM_WEIGHT = torch.tensor([12.0, 14.0, 16.0, 19.0, 31.0, 32.0, 35.5, 80.0, 127.0]) / 100


def random_molecules(gen: torch.Generator, molecules: int, atoms: int) -> dict[str, torch.Tensor]:
    """A batch of random molecular graphs; edges are listed in both directions."""
    types, src, dst, bonds, graph = [], [], [], [], []
    for m in range(molecules):
        base = m * atoms
        types.append(torch.multinomial(torch.tensor([6.0, 2, 2, 0.5, 0.3, 0.5, 0.4, 0.2, 0.1]), atoms, True, generator=gen))
        parents = [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, atoms)]
        pairs = [(p, i) for i, p in zip(range(1, atoms), parents)]
        if atoms >= 4:
            pairs.append((0, atoms - 1))
        for a, b in pairs:
            kind = int(torch.multinomial(torch.tensor([6.0, 2, 0.5, 1.5]), 1, generator=gen))
            src += [base + a, base + b]
            dst += [base + b, base + a]
            bonds += [kind, kind]
        graph.append(torch.full((atoms,), m))
    return {"atom_types": torch.cat(types), "edge_index": torch.tensor([src, dst]), "bond_types": torch.tensor(bonds),
            "graph_index": torch.cat(graph)}


def target_property(inputs: dict[str, torch.Tensor], molecules: int) -> torch.Tensor:
    node = ATOM_WEIGHT[inputs["atom_types"]]
    out = torch.zeros(molecules).index_add_(0, inputs["graph_index"], node)
    bond = (inputs["bond_types"] == 1).float() * 0.1
    return out + torch.zeros(molecules).index_add_(0, inputs["graph_index"][inputs["edge_index"][0]], bond)


class MPNN(nn.Module):
    """Edge-conditioned messages (Gilmer et al. 2017) with GRU node updates and a sum readout."""

    def __init__(self, *, hidden: int, layers: int) -> None:
        super().__init__()
        self.atom = nn.Embedding(ATOM_TYPES, hidden)
        self.bond = nn.Embedding(BOND_TYPES, hidden)
        self.message = nn.ModuleList(nn.Sequential(nn.Linear(3 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
                                     for _ in range(layers))
        self.update = nn.ModuleList(nn.GRUCell(hidden, hidden) for _ in range(layers))
        self.readout = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, atom_types: torch.Tensor, edge_index: torch.Tensor, bond_types: torch.Tensor,
                graph_index: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.atom(atom_types)
        e = self.bond(bond_types)
        src, dst = edge_index
        for message, update in zip(self.message, self.update):
            m = message(torch.cat([h[src], h[dst], e], -1))
            agg = torch.zeros_like(h).index_add_(0, dst, m)
            h = update(agg, h)
        pooled = h.new_zeros(target.shape[0], h.shape[-1]).index_add_(0, graph_index, h)  # on h's device
        pred = self.readout(pooled).squeeze(-1)
        return {"loss": (pred.float() - target.float()).pow(2).mean(), "prediction": pred, "node_states": h}


class EGNN(nn.Module):
    """E(n)-equivariant message passing (Satorras et al. 2021): features and coordinates update together."""

    def __init__(self, *, hidden: int, layers: int) -> None:
        super().__init__()
        self.atom = nn.Embedding(ATOM_TYPES, hidden)
        self.edge = nn.ModuleList(nn.Sequential(nn.Linear(2 * hidden + 1, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
                                  for _ in range(layers))
        self.coord = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))
                                   for _ in range(layers))
        self.node = nn.ModuleList(nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
                                  for _ in range(layers))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, atom_types: torch.Tensor, edge_index: torch.Tensor, bond_types: torch.Tensor,
                graph_index: torch.Tensor, positions: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        h, x = self.atom(atom_types), positions
        src, dst = edge_index
        for edge, coord, node in zip(self.edge, self.coord, self.node):
            diff = x[src] - x[dst]
            dist2 = diff.pow(2).sum(-1, keepdim=True)
            m = edge(torch.cat([h[src], h[dst], dist2], -1))
            x = x + torch.zeros_like(x).index_add_(0, dst, diff * coord(m)) / 4
            h = h + node(torch.cat([h, torch.zeros_like(h).index_add_(0, dst, m)], -1))
        pooled = h.new_zeros(target.shape[0], h.shape[-1]).index_add_(0, graph_index, h)  # on h's device
        pred = self.readout(pooled).squeeze(-1)
        return {"loss": (pred.float() - target.float()).pow(2).mean(), "prediction": pred, "positions": x}


def _builder(cls: type, with_positions: bool) -> Callable[[ModelConfig, ModelEntry], BuiltModel]:
    def build(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
        model = finish_model(cls(hidden=config.hidden or 32, layers=config.layers or 2), config)
        dtype = next(model.parameters()).dtype

        def batch(step: int) -> dict[str, Any]:
            gen = input_generator(config, step)
            inputs: dict[str, Any] = random_molecules(gen, config.batch, config.size)
            if with_positions:
                inputs["positions"] = (torch.randn(config.batch * config.size, 3, generator=gen) * 1.5).to(dtype)
            inputs["target"] = target_property(inputs, config.batch).to(dtype)
            return inputs

        return BuiltModel(model=model, inputs=batch(0), loss_fn=output_loss, optimizer_factory=sgd_factory,
                          modality="graph", notes=f"{cls.__name__} on random molecular graphs", config=config,
                          batch_fn=batch)

    return build


register_model("molecule/mpnn", modality="graph", tasks=("graph_regression",), sizes=(12, 24), batches=(2, 4),
               knob_values={"layers": (1, 4), "hidden": (64,)})(_builder(MPNN, False))
register_model("molecule/egnn", modality="graph", tasks=("graph_regression",), sizes=(12, 24), batches=(2, 4),
               knob_values={"layers": (1, 4), "hidden": (64,)})(_builder(EGNN, True))

"""The self-signalling char-LM recipe with the most common loader in PyTorch:
``DataLoader(dataset, shuffle=True)``, no generator, and a collate_fn of its own."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from optimus_preflight.config.instantiate import instantiate_node
from tests.signal_recipe import SelfSignalRecipe


def stack_pairs(batch):
    inputs, targets = zip(*batch)
    return torch.stack(inputs), torch.stack(targets)


class PlainLoaderRecipe(SelfSignalRecipe):
    def build_dataloaders(self):
        data = self.cfg.data
        train = DataLoader(instantiate_node(data.train, "data.train"), batch_size=data.batch_size, shuffle=True,
                           collate_fn=stack_pairs)
        val = DataLoader(instantiate_node(data.val, "data.val"), batch_size=data.batch_size)
        return train, val

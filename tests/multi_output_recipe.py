"""A user's tabular recipe (tests run it through the CLI): house price and occupancy rate from numeric
features and a city id. Two switches plant bugs a general check must find in a recipe it was not
written for: targets left in their own units, and a padding_idx on a column coded from 0."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight import TrainRecipe


@dataclass
class TabModel:
    hidden: int = 32
    # padding_idx for the city table (None: no padding row)
    city_padding_idx: int | None = None


@dataclass
class TabData:
    batch_size: int = 64
    rows: int = 2000
    # standardise each target column with the training split's statistics
    standardise_targets: bool = True


class Net(nn.Module):
    def __init__(self, hidden, padding_idx):
        super().__init__()
        self.city = nn.Embedding(8, 4, padding_idx=padding_idx)
        self.body = nn.Sequential(nn.Linear(6 + 4, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x, city):
        return self.body(torch.cat([x, self.city(city)], 1))


class Tabular(TrainRecipe):
    model_config = TabModel
    data_config = TabData
    config_defaults = {"trainer": {"max_epochs": 2}, "optimizer": {"lr": 3e-3}}

    def build_model(self):
        return Net(self.cfg.model.hidden, self.cfg.model.city_padding_idx)

    def _tables(self):
        g = torch.Generator().manual_seed(0)
        n = self.cfg.data.rows
        x = torch.randn(n, 6, generator=g)
        city = torch.randint(0, 8, (n,), generator=g)
        price = 3e2 * (x[:, 0] + 0.5 * x[:, 1] + 0.3 * city.float())
        rate = 0.02 * torch.tanh(x[:, 2] * x[:, 3])
        y = torch.stack([price, rate], 1)
        if self.cfg.data.standardise_targets:
            y = (y - y[: int(0.8 * n)].mean(0)) / y[: int(0.8 * n)].std(0)
        return x, city, y

    def build_dataloaders(self):
        x, city, y = self._tables()
        cut = int(0.8 * len(x))
        g = torch.Generator().manual_seed(self.cfg.trainer.seed)
        train = DataLoader(TensorDataset(x[:cut], city[:cut], y[:cut]), batch_size=self.cfg.data.batch_size,
                           shuffle=True, generator=g)
        return train, DataLoader(TensorDataset(x[cut:], city[cut:], y[cut:]), batch_size=200)

    def compute_loss(self, model, batch):
        x, city, y = batch
        return F.mse_loss(model(x, city), y)


if __name__ == "__main__":
    Tabular.main()

"""A tabular MLP recipe for the unit tests of a user's own recipe (its own module: the
unread-override check reads the recipe's source, which must not be the test's)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from optimus_preflight import TrainRecipe


@dataclass
class TabularConfig:
    hidden: int = 32
    layers: int = 2


@dataclass
class TabularData:
    batch_size: int = 64
    features: int = 8


class TabularMLP(TrainRecipe):
    """A tabular MLP: declares its config, sets defaults, and reads cfg.model.hidden only."""

    model_config = TabularConfig
    data_config = TabularData
    trainer_defaults = {"max_steps": 20}
    config_defaults = {"scheduler": ("warmup_cosine", {"warmup_fraction": 0.1}), "checkpoint.keep_last": 1}

    def build_model(self):
        return nn.Sequential(nn.Linear(self.cfg.data.features, self.cfg.model.hidden), nn.ReLU(), nn.Linear(self.cfg.model.hidden, 1))


class Broken(TrainRecipe):
    model_config = {"hidden": 3}


class UnknownGroup(TrainRecipe):
    config_defaults = {"trainr": {"max_steps": 3}}

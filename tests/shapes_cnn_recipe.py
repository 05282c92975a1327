"""A user's own recipe, written from the README: a small CNN that tells squares from
noise on synthetic images, with its own model/data config, defaults, metric and test
loader. Run it as `python tests/shapes_cnn_recipe.py KEY=VALUE ...`.

SHAPES_SIGNAL_AT=N (tests): the recipe sends itself SIGINT in its Nth training
compute_loss call, as a user pressing Ctrl+C would."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight import TrainRecipe


@dataclass
class ShapesCNNConfig:
    # Channels of the convolution.
    width: int = 16
    # Dropout before the classifier.
    dropout: float = 0.0


@dataclass
class ShapesData:
    # Images per batch.
    batch_size: int = 32
    # Images in the whole synthetic set (80% train, 10% val, 10% test).
    samples: int = 640
    image_size: int = 12
    seed: int = 0
    # Declared, but the loaders below never pass it on (the bug the unread-override check catches).
    num_workers: int = 0


def synthetic_shapes(samples: int, image_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (samples,), generator=generator)
    images = torch.randn(samples, 1, image_size, image_size, generator=generator) * 0.3
    quarter = image_size // 4
    images[labels == 1, :, quarter : 3 * quarter, quarter : 3 * quarter] += 1.0
    return images, labels


class ShapesCNN(TrainRecipe):
    model_config = ShapesCNNConfig
    data_config = ShapesData
    config_defaults = {"trainer": {"max_epochs": 3}, "optimizer": {"lr": 0.01}}

    def build_model(self) -> nn.Module:
        cfg = self.cfg.model
        return nn.Sequential(
            nn.Conv2d(1, cfg.width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Dropout(cfg.dropout), nn.Linear(cfg.width, 2),
        )

    def _split(self, part: str) -> TensorDataset:
        data = self.cfg.data
        images, labels = synthetic_shapes(data.samples, data.image_size, data.seed)
        train_end, val_end = int(0.8 * data.samples), int(0.9 * data.samples)
        bounds = {"train": (0, train_end), "val": (train_end, val_end), "test": (val_end, data.samples)}[part]
        return TensorDataset(images[bounds[0] : bounds[1]], labels[bounds[0] : bounds[1]])

    def build_dataloaders(self):
        generator = torch.Generator().manual_seed(self.cfg.trainer.seed)
        train = DataLoader(self._split("train"), batch_size=self.cfg.data.batch_size, shuffle=True, generator=generator)
        return train, DataLoader(self._split("val"), batch_size=50)

    def build_test_dataloader(self):
        return DataLoader(self._split("test"), batch_size=50)

    def compute_loss(self, model, batch):
        self._maybe_signal()
        images, labels = batch
        logits = model(images)
        self.log("acc", (logits.argmax(-1) == labels).float().mean(), prog_bar=True)
        return F.cross_entropy(logits, labels)

    def _maybe_signal(self) -> None:
        at = int(os.environ.get("SHAPES_SIGNAL_AT", "0"))
        if at and self.metrics.mode == "train":
            self._train_calls = getattr(self, "_train_calls", 0) + 1
            if self._train_calls == at:
                os.kill(os.getpid(), signal.SIGINT)

    def validation_step(self, model, batch):
        images, labels = batch
        logits = model(images)
        return {"loss": F.cross_entropy(logits, labels), "acc": (logits.argmax(-1) == labels).float().mean()}


if __name__ == "__main__":
    ShapesCNN.main()

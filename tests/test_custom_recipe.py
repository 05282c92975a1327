"""A recipe that overrides every builder runs with the default config."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight import TrainRecipe, compose


class BlobsRecipe(TrainRecipe):
    """Three Gaussian blobs, a linear classifier, plain SGD: nothing from the model/data groups."""

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.5)

    def build_scheduler(self, optimizer):
        return None

    def build_dataloaders(self):
        generator = torch.Generator().manual_seed(0)
        centres = torch.tensor([[0.0, 3.0], [3.0, -2.0], [-3.0, -2.0]])
        labels = torch.randint(0, 3, (512,), generator=generator)
        points = centres[labels] + torch.randn(512, 2, generator=generator)
        train = DataLoader(TensorDataset(points[:448], labels[:448]), batch_size=32, shuffle=True, generator=generator)
        val = DataLoader(TensorDataset(points[448:], labels[448:]), batch_size=64)
        return train, val


def test_a_recipe_overriding_every_builder_runs_on_the_default_config(tmp_path):
    cfg = compose(["trainer.max_steps=60", "logging.progress=none", "trainer.eval_every_n_steps=30"])
    summary = BlobsRecipe(cfg, run_dir=tmp_path).run()
    assert summary["status"] == "completed" and summary["steps"] == 60
    assert summary["final_val_loss"] < 0.3  # separable blobs: the default loss and loop learn them
    report = (tmp_path / "preflight.json").read_text()
    assert '"status": "passed"' in report or '"status": "warnings"' in report

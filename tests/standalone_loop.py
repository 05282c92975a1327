"""A user's own loop on the four mixins, for the signal tests: python -m tests.standalone_loop RUN_DIR STEPS

HANG_AT_SAMPLE=k: the dataset blocks forever on sample k (once: a marker file says it
happened). PAUSE_AT_STEP=n: after step n the loop's own code waits until a file ``go`` appears in
the run dir (a stop lands in user code between steps; it takes effect when that code
returns to the loop). FETCH_TIMEOUT_S=s: the data watchdog's timeout (default 600).
Each event is announced on stdout before it happens.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.config.schema import TrainerConfig
from optimus_preflight.mixins import TrainingContextMixin, TrainingInterruptionMixin, TrainingIterationMixin


class Points(Dataset):
    def __init__(self, hang_at: int | None, marker: Path):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(96, 6, generator=generator)
        self.targets = torch.randint(0, 3, (96,), generator=generator)
        self.hang_at, self.marker = hang_at, marker

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        if index == self.hang_at and not self.marker.exists():
            self.marker.write_text("hung")
            print("hanging", flush=True)
            time.sleep(3600)
        return self.inputs[index], self.targets[index]


def cross_entropy(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


class Loop(TrainingContextMixin, TrainingIterationMixin, TrainingInterruptionMixin):
    def __init__(self, run_dir: str):
        settings = TrainerConfig(accumulation_steps=3, clip_grad_norm=1.0, seed=0, precision="fp32")
        TrainingContextMixin.__init__(self, settings)
        TrainingIterationMixin.__init__(self, settings, log_freq=0)
        TrainingInterruptionMixin.__init__(self, save_freq=5, output_path=run_dir,
                                           fetch_timeout_s=float(os.environ.get("FETCH_TIMEOUT_S", "600")))

    def fit(self, steps: int) -> str:
        context = self.setup_training_context("cpu")
        hang_at = os.environ.get("HANG_AT_SAMPLE")
        pause_at = int(os.environ.get("PAUSE_AT_STEP", "0"))
        Path(self.output_path).mkdir(parents=True, exist_ok=True)
        marker = Path(self.output_path) / "hung.marker"
        dataset = Points(int(hang_at) if hang_at else None, marker)
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 3))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
        batches = self.training_batches(loader)
        for step in self.training_steps(steps, model=model, optimizer=optimizer, batches=batches,
                                        scheduler=scheduler, training_context=context):
            self.run_training_iteration(model, optimizer, cross_entropy, batches, context, scheduler)
            print(f"step {step}", flush=True)
            if step == pause_at and not (Path(self.output_path) / "paused.marker").exists():
                (Path(self.output_path) / "paused.marker").write_text("paused")
                print("pausing", flush=True)
                seen = False
                while not (Path(self.output_path) / "go").exists():
                    if self.stop_requested() and not seen:
                        print("stop seen", flush=True)
                        seen = True
                    time.sleep(0.01)
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        print(f"weights {digest}", flush=True)
        return digest


if __name__ == "__main__":
    Loop(sys.argv[1]).fit(int(sys.argv[2]))

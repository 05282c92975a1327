"""The formula fallback of the memory estimate (MEM3), through ``run_preflight``: a packed
LSTM's ``pack_padded_sequence`` cannot be traced on fake tensors (its lengths are data), so
the host-memory check falls back to the formula. Far below the limit that is a note, not a
warning on a healthy loop; near the limit the formula (a lower bound) still warns."""

from __future__ import annotations

from collections import namedtuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks import memory_checks as memory_checks_module
from optimus_preflight.preflight.framework import Severity

VOCAB, CLASSES, LONGEST = 30, 4, 12
VirtualMemory = namedtuple("VirtualMemory", "available total")


class Sequences(Dataset):
    """Token sequences of varying length, padded to LONGEST; the class is the first token's."""

    def __init__(self, count: int = 128):
        generator = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(3, LONGEST + 1, (count,), generator=generator)
        self.tokens = torch.randint(1, VOCAB, (count, LONGEST), generator=generator)
        for row, length in enumerate(self.lengths.tolist()):
            self.tokens[row, length:] = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int):
        return {"tokens": self.tokens[index], "lengths": self.lengths[index], "label": self.tokens[index, 0] % CLASSES}


class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16, padding_idx=0)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False)
        output, _ = self.lstm(packed)
        padded, _ = pad_packed_sequence(output, batch_first=True)
        last = padded[torch.arange(len(lengths)), lengths - 1]
        return self.head(last)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["tokens"], batch["lengths"]), batch["label"])


def setup():
    torch.manual_seed(0)
    model = PackedLSTM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, DataLoader(Sequences(), batch_size=16, shuffle=True)


def host_check(report):
    return next(check for check in report.checks if check.name == "memory.host_ram")


def test_an_untraceable_packed_lstm_far_below_the_limit_gets_a_note_not_a_warning():
    model, optimizer, loader = setup()
    report = run_preflight(model, optimizer, loader, loss_fn=loss_fn)
    host = host_check(report)
    assert host.data["estimate"]["method"] == "analytic"  # the trace failed: the formula stood in
    mem3 = [issue for issue in host.issues if issue.code == "MEM3"]
    assert [issue.severity for issue in mem3] == [Severity.INFO]
    assert "far below" in mem3[0].message
    assert not [issue for check, issue in report.issues() if issue.code.startswith("MEM") and issue.severity != Severity.INFO]


def test_the_formula_fallback_still_warns_within_10_percent_of_the_limit(monkeypatch):
    model, optimizer, loader = setup()
    quiet = host_check(run_preflight(model, optimizer, loader, loss_fn=loss_fn))
    need, held = quiet.data["need_bytes"], quiet.data["held_bytes"]
    reserve = 0.5 * (1 << 30)  # run_preflight's default preflight.memory.reserve_gib
    available = int(need / 0.95 + reserve) - held  # the formula's need is 95% of the limit
    monkeypatch.setattr(memory_checks_module.psutil, "virtual_memory", lambda: VirtualMemory(available, 2 * available))
    host = host_check(run_preflight(model, optimizer, loader, loss_fn=loss_fn))
    found = {(issue.code, issue.severity) for issue in host.issues}
    assert ("MEM3", Severity.WARNING) in found and ("MEM5", Severity.WARNING) in found
    assert host.data["need_bytes"] == need

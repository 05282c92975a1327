"""data.padding_side: frames padded at the start (left padding) beside lengths that count the
real frames from the start, as pack_padded_sequence and CTC's input_lengths read them. Right
padding, token rows padded on the right, and lengths of a subsampled output stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.padding_side import PaddingSideCheck, left_padded

FRAMES, FEATURES = 24, 6


class Utterances(Dataset):
    def __init__(self, side: str, tokens: bool = False):
        g = torch.Generator().manual_seed(0)
        self.side, self.tokens = side, tokens
        self.lengths = torch.randint(8, FRAMES + 1, (64,), generator=g).tolist()
        self.frames = [torch.randint(1, 30, (n,), generator=g) if tokens else torch.randn(n, FEATURES, generator=g)
                       for n in self.lengths]
        self.labels = torch.randint(0, 3, (64,), generator=g).tolist()

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, i):
        return self.frames[i], self.labels[i]

    def collate(self, rows):
        padded = []
        for frames, _ in rows:
            missing = FRAMES - len(frames)
            pad = (missing, 0) if self.side == "left" else (0, missing)
            padded.append(F.pad(frames, pad if self.tokens else (0, 0, *pad)))
        lengths = torch.tensor([len(frames) for frames, _ in rows])
        if self.side == "subsampled":
            lengths = (lengths + 1) // 2
        return torch.stack(padded), lengths, torch.tensor([label for _, label in rows])


class Reader(nn.Module):
    def __init__(self, tokens: bool):
        super().__init__()
        self.embed = nn.Embedding(30, FEATURES) if tokens else nn.Identity()
        self.rnn, self.head = nn.GRU(FEATURES, 16, batch_first=True), nn.Linear(16, 3)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(x), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        return self.head(self.rnn(packed)[1][-1])


@pytest.mark.parametrize("side, tokens", [("left", False), ("left", True), ("right", False), ("right", True),
                                          ("subsampled", False)])
def test_left_padding_beside_lengths_from_the_start_is_named(side, tokens):
    data = Utterances(side, tokens)
    model = Reader(tokens)

    def loss(m, batch):
        x, lengths, y = batch
        return F.cross_entropy(m(x, lengths.clamp(max=x.shape[1])), y)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=16, shuffle=True, collate_fn=data.collate), loss_fn=loss,
                           checks=[FirstBatchCheck(), PaddingSideCheck()])
    issues = report.check("data.padding_side").issues
    assert [i.code for i in issues] == (["LENGTHS_OVER_LEFT_PADDING"] if side == "left" else [])
    if issues:
        assert "batch[0]" in issues[0].message and "batch[1]" in issues[0].message
        assert "pad_sequence" in issues[0].fix


def test_sequences_of_full_length_say_nothing():
    assert left_padded(torch.randn(8, 10, 3), torch.full((8,), 10)) is None

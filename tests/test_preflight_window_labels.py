"""data.window_labels: WINDOW_LABEL_INDEX, sliding windows labelled labels[i] (sample i) instead
of the label at the window's position; windows labelled at their centre stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.window_labels import WindowLabelsCheck, window_stride


class SlidingWindows(Dataset):
    def __init__(self, signal, labels, by_position: bool, window: int = 32, stride: int = 16):
        self.signal, self.labels, self.window, self.stride = signal, labels, window, stride
        self.by_position = by_position

    def __len__(self):
        return (len(self.signal) - self.window) // self.stride + 1

    def __getitem__(self, i):
        start = i * self.stride
        label = self.labels[start + self.window // 2] if self.by_position else self.labels[i]
        return self.signal[start:start + self.window].T, label


def recording(n: int = 4000):
    g = torch.Generator().manual_seed(0)
    labels = torch.repeat_interleave(torch.randint(0, 4, (n // 200,), generator=g), 200)
    signal = torch.randn(n, 3, generator=g) + labels[:, None].float()
    return signal, labels


@pytest.mark.parametrize("by_position", [False, True])
def test_windows_labelled_by_their_index(by_position):
    signal, labels = recording()
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(SlidingWindows(signal, labels, by_position), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), WindowLabelsCheck()])
    found = [i for i in report.check("data.window_labels").issues if i.code == "WINDOW_LABEL_INDEX"]
    if by_position:
        assert not found
    else:
        assert len(found) == 1 and "self.labels[i]" in found[0].message
        assert "self.labels[i * 16 + 32 // 2]" in found[0].fix


def test_the_stride_is_read_along_either_axis():
    series = torch.arange(100.0)[:, None].repeat(1, 2)
    assert window_stride([series[i * 4:i * 4 + 10] for i in range(4)]) == (0, 4)
    assert window_stride([series[i * 4:i * 4 + 10].T for i in range(4)]) == (1, 4)
    assert window_stride([torch.randn(10, 2) for _ in range(4)]) is None
    assert window_stride([torch.arange(float(n)) for n in (25, 9, 56, 12)]) is None  # sequences of their own lengths


def test_an_iterable_dataset_and_variable_length_sequences_are_left_alone():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            g = torch.Generator().manual_seed(0)
            for _ in range(64):
                yield torch.randn(8, generator=g), int(torch.randint(0, 2, (1,), generator=g))

        def __len__(self):
            return 64

    class Sessions(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(1)
            self.lengths = torch.randint(3, 12, (64,), generator=g)
            self.labels = torch.randint(0, 2, (64,), generator=g)

        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.arange(float(self.lengths[i])), int(self.labels[i])

    def pad(rows):
        xs = torch.nn.utils.rnn.pad_sequence([x for x, _ in rows], batch_first=True)
        return xs[:, :3], torch.tensor([y for _, y in rows])

    for dataset, collate in ((Stream(), None), (Sessions(), pad)):
        model = nn.Linear(8 if collate is None else 3, 2)
        report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                               DataLoader(dataset, batch_size=16, collate_fn=collate), loss_fn=nn.CrossEntropyLoss(),
                               checks=[FirstBatchCheck(), WindowLabelsCheck()])
        assert report.check("data.window_labels").status.value != "crashed"

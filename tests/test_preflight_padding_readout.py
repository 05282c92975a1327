"""READOUT_AFTER_PADDING: an LSTM/GRU run over right-padded batches as a plain tensor and read
at the last position (out[:, -1], h_n), on token ids and on zero-padded feature sequences; a
packed batch, a read-out at lengths - 1, left padding, a mean over positions, unpadded
sequences and a transformer reading its last position stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.padding_readout import PaddingReadoutCheck, readout_of, trailing_padding
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet, codes

NAME = "step.padding_readout"
LENGTH = 24


def padded_tokens(samples: int = 128, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids 1..19 of lengths 3..LENGTH-1 padded with 0, labels from the first three tokens
    (what a read-out after the padding forgets first)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.zeros(samples, LENGTH, dtype=torch.long)
    labels = torch.zeros(samples, dtype=torch.long)
    for row in range(samples):
        length = int(torch.randint(3, LENGTH - 4, (1,), generator=generator))
        tokens = torch.randint(1, 20, (length,), generator=generator)
        if left:
            ids[row, LENGTH - length:] = tokens
        else:
            ids[row, :length] = tokens
        labels[row] = int((tokens[:3] > 10).sum() >= 2)
    return ids, labels


class TokenRNN(nn.Module):
    def __init__(self, readout: str, cell: type[nn.RNNBase] = nn.LSTM, bidirectional: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.readout = readout
        self.embed = nn.Embedding(20, 16, padding_idx=0)
        self.rnn = cell(16, 24, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(48 if bidirectional else 24, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        lengths = (ids != 0).sum(dim=1)
        if self.readout == "packed":
            _, state = self.rnn(pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False))
            h = state[0] if isinstance(state, tuple) else state
            return self.head(h[-1])
        out, state = self.rnn(x)
        if self.readout == "last":
            return self.head(out[:, -1])
        if self.readout == "h_n":
            h = state[0] if isinstance(state, tuple) else state
            return self.head(h[-1])
        if self.readout == "gather":
            return self.head(out[torch.arange(len(ids)), lengths - 1])
        return self.head(out.mean(dim=1))


class LastPositionTransformer(nn.Module):
    """Attention reaches every token directly: its last position has not forgotten them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 16, padding_idx=0)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(16, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids))[:, -1])


def readout_result(model: nn.Module, dataset: TensorDataset):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                           DataLoader(dataset, batch_size=16, shuffle=True), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), PaddingReadoutCheck()])
    return next(result for result in report.checks if result.name == NAME)


@pytest.mark.parametrize("readout, cell, bidirectional", [("last", nn.LSTM, False), ("h_n", nn.GRU, False),
                                                          ("last", nn.LSTM, True)],
                         ids=["lstm_out_last", "gru_h_n", "bilstm_out_last"])
def test_an_rnn_read_after_right_padding_fires(readout, cell, bidirectional):
    result = readout_result(TokenRNN(readout, cell, bidirectional), TensorDataset(*padded_tokens()))
    assert codes(result) == {"READOUT_AFTER_PADDING"}
    issue = result.issues[0]
    assert "pack_padded_sequence" in issue.fix and "lengths - 1" in issue.fix
    assert ("h_n[-2]" in issue.fix) == bidirectional
    assert result.data["dominated_rows"] == result.data["padded_rows"] >= 2
    assert result.data["median_ratio"] > 100 and result.data["pad_share"] > 0.9


@pytest.mark.parametrize("readout", ["packed", "gather", "mean"])
def test_reading_at_the_real_end_or_pooling_is_quiet(readout):
    result = readout_result(TokenRNN(readout), TensorDataset(*padded_tokens()))
    assert_quiet(result)


def test_left_padding_and_unpadded_sequences_are_quiet():
    assert_quiet(readout_result(TokenRNN("last"), TensorDataset(*padded_tokens(left=True))))
    ids = torch.randint(1, 20, (128, LENGTH), generator=torch.Generator().manual_seed(1))
    unpadded = readout_result(TokenRNN("last"), TensorDataset(ids, (ids[:, 0] > 10).long()))
    assert_quiet(unpadded)
    assert "no padded sequence" in unpadded.data["summary"]


def test_a_transformer_reading_its_last_position_is_not_probed():
    result = readout_result(LastPositionTransformer(), TensorDataset(*padded_tokens()))
    assert_quiet(result)
    assert result.data["summary"] == "no recurrent layer"


class SensorGRU(nn.Module):
    """A seq-first GRU over zero-padded float windows, read from h_n: the same mistake on features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.GRU(3, 16)  # (T, B, F)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h = self.rnn(x.transpose(0, 1))
        return self.head(h[-1])


def test_zero_padded_feature_windows_into_a_seq_first_gru_fire():
    generator = torch.Generator().manual_seed(0)
    windows = torch.zeros(128, LENGTH, 3)
    for row in range(128):
        length = int(torch.randint(4, LENGTH - 4, (1,), generator=generator))
        windows[row, :length] = torch.randn(length, 3, generator=generator)
    labels = (windows[:, 0, 0] > 0).long()
    result = readout_result(SensorGRU(), TensorDataset(windows, labels))
    assert codes(result) == {"READOUT_AFTER_PADDING"}
    assert "nn.GRU 'rnn'" in result.issues[0].message


def test_trailing_padding_needs_one_pad_vector_shared_by_rows():
    x = torch.randn(4, 8, 2)
    assert trailing_padding(x) is None
    padded = x.clone()
    padded[0, 5:] = 0.0
    padded[1, 3:] = 0.0
    mask = trailing_padding(padded)
    assert mask is not None and mask[0].tolist() == [False] * 5 + [True] * 3 and int(mask[1].sum()) == 5
    assert not bool(mask[2:].any())
    # Rows that each end by repeating their own vector are not padding.
    repeated = x.clone()
    repeated[0, 5:] = repeated[0, 5]
    repeated[1, 5:] = repeated[1, 5]
    assert trailing_padding(repeated) is None


def test_readout_of_counts_rows_whose_last_position_dominates():
    padding = torch.zeros(3, 10, dtype=torch.bool)
    padding[:, 5:] = True
    after = torch.cat([torch.full((3, 5), 0.01), torch.full((3, 5), 1.0)], dim=1)
    readout = readout_of(after, padding)
    assert readout is not None and readout.dominated_rows == 3 and readout.median_ratio == pytest.approx(100.0)
    even = torch.ones(3, 10)
    assert readout_of(even, padding).dominated_rows == 0
    short = torch.zeros(3, 10, dtype=torch.bool)
    short[:, 8:] = True  # two pad steps cannot show where the read-out is
    assert readout_of(after, short) is None


class PaddedEncoderDecoder(nn.Module):
    """A GRU encoder over right-padded sources hands h_n to a decoder emitting a sequence: the
    tutorial seq2seq, not a per-sample read-out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 16, padding_idx=0)
        self.encoder, self.decoder = nn.GRU(16, 16, batch_first=True), nn.GRU(16, 16, batch_first=True)
        self.out = nn.Linear(16, 20)

    def forward(self, source: torch.Tensor) -> torch.Tensor:
        _, state = self.encoder(self.embed(source))
        decoded, _ = self.decoder(self.embed(source.flip(1)), state)
        return self.out(decoded)


def test_an_encoder_over_padding_feeding_a_sequence_decoder_is_quiet():
    ids, _ = padded_tokens()
    model = PaddedEncoderDecoder()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                           DataLoader(TensorDataset(ids, ids), batch_size=16, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]).reshape(-1, 20), b[1].reshape(-1)),
                           checks=[FirstBatchCheck(), FirstStepCheck(), PaddingReadoutCheck()])
    assert_quiet(report.check(NAME))

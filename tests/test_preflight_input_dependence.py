"""step.input_dependence: a model that gives every sample the same output (a forward that
ignores its input, a layer of dead units), with the module where the samples' differences
are lost; a healthy model and a zero-initialised head stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.input_dependence import InputDependenceCheck, unordered_elements
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class Tabular(nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.hidden, self.act, self.head = nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)
        self.register_buffer("template", torch.zeros(1, 8))
        if mode == "dead_units":
            nn.init.constant_(self.hidden.bias, -100.0)
        if mode == "zero_head":
            nn.init.zeros_(self.head.weight)

    def forward(self, x):
        if self.mode == "reads_template":
            x = self.template.expand_as(x)  # a stale attribute in place of the batch
        return self.head(self.act(self.hidden(x)))


def verdict(mode: str) -> tuple[list, dict]:
    x, y = torch.randn(512, 8), torch.randint(0, 3, (512,))
    model = Tabular(mode)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    result = report.check("step.input_dependence")
    return [i for i in result.issues if i.code == "MODEL_IGNORES_INPUT"], result.data


@pytest.mark.parametrize("mode, where", [("reads_template", "No module's output differed"),
                                         ("dead_units", "ReLU 'act'")])
def test_every_sample_getting_the_same_output_is_an_error(mode, where):
    issues, _ = verdict(mode)
    assert issues and where in issues[0].message


@pytest.mark.parametrize("mode", ["healthy", "zero_head"])
def test_samples_with_their_own_outputs_or_a_zero_initialised_head_are_quiet(mode):
    issues, data = verdict(mode)
    assert not issues
    if mode == "zero_head":
        assert "zero-initialised 'head'" in data["summary"]


class GruClassifier(nn.Module):
    def __init__(self, read_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.read_first = read_first
        self.embed, self.gru, self.head = nn.Embedding(60, 16, padding_idx=0), nn.GRU(16, 16, batch_first=True), \
            nn.Linear(16, 3)

    def forward(self, ids):
        out, _ = self.gru(self.embed(ids))
        return self.head(out[:, 0] if self.read_first else out[:, -1])


@pytest.mark.parametrize("read_first", [True, False], ids=["reads_first_step", "reads_last_step"])
def test_a_read_out_of_the_first_time_step_ignores_the_second_half(read_first):
    g = torch.Generator().manual_seed(0)
    ids, y = torch.randint(1, 60, (256, 24), generator=g), torch.randint(0, 3, (256,), generator=g)
    model = GruClassifier(read_first)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    issues = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]
    assert bool(issues) == read_first
    if read_first:
        assert "second half" in issues[0].message and "12-23" in issues[0].message and "h_n" in issues[0].fix


class SpectrogramGru(nn.Module):
    """A GRU over 64 frames read at its last state: untrained, it forgets the first frames by
    the end (their effect is below float32's resolution), which training changes."""

    def __init__(self, read_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.gru, self.head, self.read_first = nn.GRU(33, 32, batch_first=True), nn.Linear(32, 2), read_first

    def forward(self, frames):
        out, h_n = self.gru(frames)
        return self.head(out[:, 0] if self.read_first else h_n[-1])


def frames_ignored(model: nn.Module) -> list:
    g = torch.Generator().manual_seed(1)
    frames, y = 3 * torch.randn(256, 64, 33, generator=g), torch.randint(0, 2, (256,), generator=g)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(frames, y), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    return [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]


@pytest.mark.parametrize("read_first", [True, False], ids=["first_frame", "last_state_of_a_long_sequence"])
def test_only_a_read_out_with_no_path_to_half_the_frames_fires(read_first):
    assert bool(frames_ignored(SpectrogramGru(read_first))) == read_first


class _RefusesEvalBackwardUnderCudnn(torch.autograd.Function):
    """What cuDNN's RNN kernels do on a GPU: 'cudnn RNN backward can only be called in training mode'."""

    @staticmethod
    def forward(ctx, x, training):
        ctx.training = training
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if torch.backends.cudnn.enabled and not ctx.training:
            raise RuntimeError("cudnn RNN backward can only be called in training mode")
        return grad, None


class CudnnLikeGru(SpectrogramGru):
    def forward(self, frames):
        out, h_n = self.gru(frames)
        out = _RefusesEvalBackwardUnderCudnn.apply(out, self.training)
        return self.head(out[:, 0] if self.read_first else out[:, -1])


@pytest.mark.parametrize("read_first", [True, False], ids=["first_frame", "last_state_of_a_long_sequence"])
def test_an_rnn_that_refuses_an_eval_mode_backward_under_cudnn_is_measured_without_it(read_first):
    # On CUDA the gradient probe's backward (eval mode) raised inside cuDNN's GRU, and a failed
    # probe read as 'no path': a healthy CRNN on a GPU was told it ignores half its frames.
    assert bool(frames_ignored(CudnnLikeGru(read_first))) == read_first


class MessageClassifier(nn.Module):
    def __init__(self, max_norm):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(60, 16, max_norm=max_norm)
        self.head = nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def embedding_verdict(max_norm) -> list:
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randint(0, 60, (128, 12), generator=g),
                                      torch.randint(0, 3, (128,), generator=g)), batch_size=16)
    model = MessageClassifier(max_norm)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    return [issue for check in report.checks for issue in check.issues]  # LOSS_FN_SIDE_EFFECT too: max_norm
    # renormalises the looked-up rows in the forward, which is not an optimizer step inside the loss


def test_an_embedding_renormalised_to_norm_zero_names_max_norm():
    issues = embedding_verdict(0.0)
    assert len(issues) == 1 and "max_norm=0.0" in issues[0].message and "max_norm=None" in issues[0].fix
    assert not embedding_verdict(None) and not embedding_verdict(1.0)


class CausalTcn(nn.Module):
    """Channels-first (B, 3, T) windows; a causal conv padded (k - 1) * d on both ends must be trimmed."""

    def __init__(self, chomp: bool):
        super().__init__()
        torch.manual_seed(0)
        self.convs = nn.ModuleList([nn.Conv1d(3 if i == 0 else 16, 16, 3, padding=2 * 2 ** i, dilation=2 ** i)
                                    for i in range(6)])  # receptive field 127 >= the 64 steps
        self.head, self.chomp = nn.Linear(16, 2), chomp

    def forward(self, x):
        for conv in self.convs:
            h = conv(x)
            x = torch.relu(h[..., :-conv.padding[0]] if self.chomp else h)
        return self.head(x[:, :, -1])


class TextCnn(nn.Module):
    def __init__(self, pool_over_channels: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.conv, self.head = nn.Embedding(60, 16), nn.Conv1d(16, 32, 3), nn.Linear(32, 2)
        self.pool_over_channels = pool_over_channels

    def forward(self, ids):
        h = torch.relu(self.conv(self.embed(ids).transpose(1, 2)))  # (B, 32, T - 2)
        window = h.size(1) if self.pool_over_channels else h.size(2)
        return self.head(nn.functional.max_pool1d(h, window).squeeze(-1))


def _ignored(model, inputs, labels):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(inputs, labels), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    return [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]


@pytest.mark.parametrize("chomp", [False, True], ids=["padded_both_ends", "chomped"])
def test_a_causal_conv_without_its_chomp_reads_past_the_input(chomp):
    g = torch.Generator().manual_seed(2)
    found = _ignored(CausalTcn(chomp), torch.randn(128, 3, 64, generator=g), torch.randint(0, 2, (128,), generator=g))
    assert bool(found) == (not chomp)
    if found:
        assert "dim 2" in found[0].message and "Chomp1d" in found[0].fix


class WindowForecaster(nn.Module):
    """(B, T) float windows of one series, unsqueezed for a GRU, the next value from one time step."""

    def __init__(self, read_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.gru, self.head, self.read_first = nn.GRU(1, 16, batch_first=True), nn.Linear(16, 1), read_first

    def forward(self, window):
        out, _ = self.gru(window.unsqueeze(-1))
        return self.head(out[:, 0] if self.read_first else out[:, -1])


@pytest.mark.parametrize("read_first", [True, False])
def test_a_forecaster_on_float_windows_that_reads_the_first_step(read_first):
    g = torch.Generator().manual_seed(4)
    series = torch.sin(torch.arange(2000.0) / 7) + 0.1 * torch.randn(2000, generator=g)
    windows = series.unfold(0, 25, 3)
    model = WindowForecaster(read_first)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(windows[:, :24], windows[:, 24:]), batch_size=16, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    found = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]
    assert bool(found) == read_first
    if found:
        assert "out[:, 0]" in found[0].message


@pytest.mark.parametrize("pool_over_channels", [True, False], ids=["window_from_channels", "window_over_time"])
def test_a_max_pool_window_from_the_channel_count_stops_short(pool_over_channels):
    g = torch.Generator().manual_seed(3)
    found = _ignored(TextCnn(pool_over_channels), torch.randint(1, 60, (128, 60), generator=g),
                     torch.randint(0, 2, (128,), generator=g))
    assert bool(found) == pool_over_channels
    if found:
        assert "last quarter" in found[0].message


class StripesCnn(nn.Module):
    def __init__(self, zero_every_gamma: bool):
        super().__init__()
        torch.manual_seed(4)
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 2)
        if zero_every_gamma:  # the ResNet zero_init_residual trick, in a network without residual connections
            for module in self.modules():
                if isinstance(module, nn.BatchNorm2d):
                    nn.init.zeros_(module.weight)

    def forward(self, x):
        return self.head(self.features(x))


@pytest.mark.parametrize("zero_every_gamma", [True, False])
def test_every_batchnorm_gamma_zeroed_is_named(zero_every_gamma):
    g = torch.Generator().manual_seed(5)
    model = StripesCnn(zero_every_gamma)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1),
                           DataLoader(TensorDataset(torch.randn(128, 1, 8, 8, generator=g),
                                                    torch.randint(0, 2, (128,), generator=g)), batch_size=16),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    issues = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_INPUT"]
    assert bool(issues) == zero_every_gamma
    if issues:
        assert "gamma" in issues[0].message and "zero_init_residual" in issues[0].message


class PostNormEncoder(nn.Module):
    def __init__(self, pool_dim: int):
        super().__init__()
        torch.manual_seed(6)
        self.embed = nn.Embedding(30, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.pool_dim = pool_dim
        self.head = nn.LazyLinear(3)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(dim=self.pool_dim))


@pytest.mark.parametrize("pool_dim", [-1, 1], ids=["mean_over_d_model", "mean_over_tokens"])
def test_a_mean_over_the_model_dimension_after_layernorm_is_named(pool_dim):
    g = torch.Generator().manual_seed(7)
    model = PostNormEncoder(pool_dim)
    model(torch.zeros(1, 12, dtype=torch.long))  # the LazyLinear takes its size from a first call
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(torch.randint(0, 30, (128, 12), generator=g),
                                                    torch.randint(0, 3, (128,), generator=g)), batch_size=16),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    issues = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_INPUT"]
    assert bool(issues) == (pool_dim == -1)
    if issues:
        assert "h.mean(dim=-1)" in issues[0].message and "h.mean(dim=1)" in issues[0].fix


class TinyEncoder(nn.Module):
    """Token classifier over a batch_first Transformer; its positional table added one of three ways."""

    def __init__(self, positions: str):
        super().__init__()
        torch.manual_seed(0)
        self.positions = positions
        self.embed = nn.Embedding(40, 32)
        self.register_buffer("pe", torch.randn(64, 1, 32))  # the tutorial's (max_len, 1, d_model) table
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.positions == "by_batch":
            x = x + self.pe[: x.size(0)]  # pe sliced by the batch size on batch_first input
        elif self.positions == "by_sequence":
            x = x + self.pe[: x.size(1)].transpose(0, 1)
        return self.head(self.encoder(x).mean(1))


@pytest.mark.parametrize("positions, fires", [("by_batch", True), ("by_sequence", False)])
def test_a_transformer_whose_positions_never_reach_the_tokens(positions, fires):
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, 40, (512, 12), generator=g)
    labels = (tokens[:, 0] > tokens[:, -1]).long()  # an order task: first vs last token
    model = TinyEncoder(positions)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(tokens, labels), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    issues = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]
    assert bool(issues) == fires
    if issues:
        assert "reversing every sequence moved no sample's output" in issues[0].message
        assert "positional table (pe)" in issues[0].message and "pe[: x.size(1)].transpose(0, 1)" in issues[0].fix


class LearnedPositionEncoder(nn.Module):
    """Token classifier whose learned position table starts at zeros (trained, or frozen by a
    requires_grad=False kept from the fixed table it replaced)."""

    def __init__(self, learn_positions: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(40, 32)
        self.pos = nn.Parameter(torch.zeros(1, 12, 32), requires_grad=learn_positions)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.pos[:, : tokens.size(1)]).mean(1))


@pytest.mark.parametrize("learn_positions", [True, False], ids=["trained_from_zero", "frozen_at_zero"])
def test_a_position_table_at_zeros_is_order_blind_only_while_frozen(learn_positions):
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, 40, (512, 12), generator=g)
    model = LearnedPositionEncoder(learn_positions)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3)
    report = run_preflight(model, optimizer,
                           DataLoader(TensorDataset(tokens, (tokens[:, 0] > tokens[:, -1]).long()), batch_size=16),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    issues = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]
    assert bool(issues) == (not learn_positions)
    if issues:
        assert "positional table (pos)" in issues[0].message


class AttentionPooling(nn.Module):
    """Per-element MLP, then one learned seed query attending over the elements (Set Transformer's
    PMA): order-blind by construction."""

    def __init__(self, features: int):
        super().__init__()
        torch.manual_seed(0)
        self.phi = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 32))
        self.seed = nn.Parameter(torch.randn(1, 1, 32) * 0.1)
        self.pool = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        h = self.phi(x)
        pooled, _ = self.pool(self.seed.expand(len(x), -1, -1), h, h)
        return self.head(pooled[:, 0])


def smooth_signals(count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    t = torch.linspace(0, 1, length)
    phase = torch.rand(count, 1, 2, generator=generator) * 6.28
    frequency = 1 + 3 * torch.rand(count, 1, 2, generator=generator)
    return torch.sin(6.28 * frequency * t[None, :, None] + phase)


@pytest.mark.parametrize("elements, fires", [("point_sets", False), ("signals", True)])
def test_an_order_blind_attention_model_is_the_design_for_sets_only(elements, fires):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(384, 16, 2, generator=g) if elements == "point_sets" else smooth_signals(384, 16, g)
    labels = torch.randint(0, 3, (384,), generator=g)
    model = AttentionPooling(2)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, labels), batch_size=16), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    issues = [i for i in report.check("step.input_dependence").issues if i.code == "MODEL_IGNORES_POSITIONS"]
    assert bool(issues) == fires
    if issues:
        assert "holds no positional encoding at all" in issues[0].message


def test_unordered_elements_tells_a_set_from_a_signal():
    g = torch.Generator().manual_seed(0)
    assert unordered_elements(torch.randn(8, 20, 3, generator=g), 1)
    assert not unordered_elements(smooth_signals(8, 20, g), 1)
    assert not unordered_elements(torch.randint(0, 9, (8, 20), generator=g), 1)  # token ids: a sequence


class LeftPaddedForecaster(nn.Module):
    """(B, T, 2) windows read by a causal conv stack padded on the left only, receptive field 21
    of 48 steps, whose last 8 positions make a 6-step forecast."""

    def __init__(self, padded_both_ends: bool = False):
        super().__init__()
        torch.manual_seed(0)
        both = 4 if padded_both_ends else 0
        self.c1, self.c2 = nn.Conv1d(2, 16, 5, padding=both), nn.Conv1d(16, 16, 5, dilation=2, padding=2 * both)
        self.out, self.left = nn.Linear(16 * 8, 6), 0 if padded_both_ends else 4

    def forward(self, x):
        h = x.transpose(1, 2)
        h = torch.relu(self.c1(nn.functional.pad(h, (self.left, 0))))
        h = torch.relu(self.c2(nn.functional.pad(h, (2 * self.left, 0))))
        return self.out(h[:, :, -8:].flatten(1))


@pytest.mark.parametrize(("loss", "padded_both_ends", "fires"), [
    (nn.HuberLoss(), False, False), (nn.MSELoss(), True, True), ("classify", False, True)],
    ids=["causal_forecaster", "padded_both_ends", "sequence_classifier"])
def test_a_receptive_field_shorter_than_the_window_is_a_forecasters_choice_only(loss, padded_both_ends, fires):
    g = torch.Generator().manual_seed(4)
    windows = torch.randn(128, 48, 2, generator=g)
    model = LeftPaddedForecaster(padded_both_ends)
    if loss == "classify":
        targets, loss = torch.randint(0, 6, (128,), generator=g), nn.CrossEntropyLoss()
    else:
        targets = torch.randn(128, 6, generator=g)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(windows, targets), batch_size=16, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    result = report.check("step.input_dependence")
    ignored = [i for i in result.issues if i.code == "MODEL_IGNORES_POSITIONS"]
    assert ignored and ("first half" in ignored[0].message or "recent part" in ignored[0].message)
    assert (result.status.value == "warning") == fires, [i.message[:80] for i in result.issues]


class FrozenBandFrontEnd(nn.Module):
    """A loaded, frozen filter bank over the first 16 of 32 bands (zero weights elsewhere) and a
    trained head: the model ignores bands 16-31 by the front end's design, not a read-out bug."""

    def __init__(self, frozen: bool):
        super().__init__()
        torch.manual_seed(0)
        self.frontend, self.head = nn.Linear(32, 4), nn.Linear(4, 3)
        with torch.no_grad():
            self.frontend.weight[:, 16:] = 0.0
        self.frontend.requires_grad_(not frozen)

    def forward(self, mels):  # (B, bands, frames)
        return self.head(torch.relu(self.frontend(mels.transpose(1, 2))).mean(1))


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen_front_end", "trainable_front_end"])
def test_a_span_dropped_inside_a_frozen_front_end_is_its_design(frozen):
    g = torch.Generator().manual_seed(4)
    mels, y = torch.randn(256, 32, 16, generator=g), torch.randint(0, 3, (256,), generator=g)
    model = FrozenBandFrontEnd(frozen)
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3),
                           DataLoader(TensorDataset(mels, y), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    check = report.check("step.input_dependence")
    if frozen:
        assert check.issues == [] and check.data.get("ignored_in_frozen_layer") == "second half"


class CausalTCN(nn.Module):
    """Three causal convolutions (k=3, dilations 1, 2, 4: a field of 15) over a 32-step window,
    padded on both ends and trimmed at the end (right) or the start (wrong)."""

    def __init__(self, trim_end: bool):
        super().__init__()
        self.trim_end = trim_end
        self.convs = nn.ModuleList(nn.Conv1d(1 if i == 0 else 8, 8, 3, dilation=2 ** i, padding=2 * 2 ** i)
                                   for i in range(3))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        z = x.unsqueeze(1)
        for conv in self.convs:
            pad = conv.padding[0]
            z = torch.relu(conv(z)[..., :-pad] if self.trim_end else conv(z)[..., pad:])
        return self.head(z[..., -1])


@pytest.mark.parametrize("trim_end", [True, False])
def test_a_causal_convolution_trimmed_at_the_start_reads_padding_past_the_window(trim_end):
    g = torch.Generator().manual_seed(0)
    series = torch.randn(256, 36, generator=g).cumsum(1)
    torch.manual_seed(0)
    model = CausalTCN(trim_end)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(series[:, :32], series[:, 32:]), batch_size=16, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FirstStepCheck(), InputDependenceCheck()])
    result = report.check("step.input_dependence")
    assert result.data["receptive_field"] == 15
    warnings = [i for i in result.issues if i.severity.value == "warning"]
    if trim_end:  # a field of 15 over 32 steps: the recent half, by design (a note)
        assert warnings == [] and result.data["reach"] == 15
        return
    (issue,) = warnings
    assert issue.code == "MODEL_IGNORES_POSITIONS" and "last 1 position(s)" in issue.message
    assert "[..., :-pad]" in issue.fix

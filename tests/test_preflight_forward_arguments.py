"""step.forward_arguments: a tensor argument of the model's forward that never reaches its
output (FORWARD_INPUT_IGNORED): a denoiser blind to its timestep, a conditional model blind
to its class, a second input whose branch is discarded. A conditioning path initialised to
zero (adaLN-Zero), a decoder that reads its targets only for teacher forcing, and a Hugging
Face encoder given a padded attention_mask stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.forward_arguments import ForwardArgumentsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet

NAME = "step.forward_arguments"
STEPS = 50


def _run(model, loader, loss_fn=None):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), ForwardArgumentsCheck()])
    return report.check(NAME)


class Denoiser(nn.Module):
    def __init__(self, reads_timestep: bool, zero_gate: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.reads_timestep = reads_timestep
        self.time = nn.Embedding(STEPS, 32)
        self.gate = nn.Linear(32, 32)
        self.inp, self.out = nn.Linear(16, 32), nn.Sequential(nn.SiLU(), nn.Linear(32, 16))
        if zero_gate:  # adaLN-Zero: the conditioning starts at exactly zero and is learned
            nn.init.zeros_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)

    def forward(self, noisy, t):
        h = self.inp(noisy)
        if self.reads_timestep:
            h = h + self.gate(self.time(t))
        return self.out(h)


def _diffusion_loss(model, batch):
    (clean,) = batch
    t = torch.randint(0, STEPS, (clean.shape[0],), device=clean.device)
    keep = torch.linspace(0.99, 0.1, STEPS, device=clean.device)[t][:, None]
    noise = torch.randn_like(clean)
    return F.mse_loss(model(keep.sqrt() * clean + (1 - keep).sqrt() * noise, t), noise)


def _clean_samples():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(256, 16, generator=g)), batch_size=32, shuffle=True)


def test_a_denoiser_that_never_reads_its_timestep_is_named():
    result = _run(Denoiser(reads_timestep=False), _clean_samples(), _diffusion_loss)
    issues = [i for i in result.issues if i.code == "FORWARD_INPUT_IGNORED"]
    assert len(issues) == 1 and issues[0].severity.value == "warning"
    assert "argument 't'" in issues[0].message and "changing 'noisy' does" in issues[0].message
    assert "self.embed(t)" in issues[0].fix


class TwoInputs(nn.Module):
    def __init__(self, second_used: bool):
        super().__init__()
        torch.manual_seed(0)
        self.second_used = second_used
        self.image, self.meta, self.head = nn.Linear(12, 16), nn.Linear(4, 16), nn.Linear(32, 2)

    def forward(self, image, meta):
        a, b = torch.relu(self.image(image)), torch.relu(self.meta(meta))
        return self.head(torch.cat([a, b if self.second_used else a], dim=1))


def _two_inputs():
    g = torch.Generator().manual_seed(1)
    image, meta = torch.randn(256, 12, generator=g), torch.randn(256, 4, generator=g)
    labels = ((image[:, 0] + 2 * meta[:, 1]) > 0).long()
    return DataLoader(TensorDataset(image, meta, labels), batch_size=32, shuffle=True)


def _two_input_loss(model, batch):
    image, meta, labels = batch
    return F.cross_entropy(model(image, meta), labels)


def test_a_second_input_whose_branch_is_discarded_is_named_with_the_layer_it_reaches():
    result = _run(TwoInputs(second_used=False), _two_inputs(), _two_input_loss)
    issues = [i for i in result.issues if i.code == "FORWARD_INPUT_IGNORED"]
    assert len(issues) == 1 and "argument 'meta'" in issues[0].message
    assert "it reaches 'meta'" in issues[0].message and "computed and dropped" in issues[0].message


@pytest.mark.parametrize("model", ["both_inputs", "timestep", "zero_gated_timestep"])
def test_arguments_the_model_reads_stay_quiet(model):
    if model == "both_inputs":
        result = _run(TwoInputs(second_used=True), _two_inputs(), _two_input_loss)
    else:
        result = _run(Denoiser(reads_timestep=True, zero_gate=model == "zero_gated_timestep"), _clean_samples(),
                      _diffusion_loss)
    assert_quiet(result)
    assert result.issues == []


class TeacherForced(nn.Module):
    """Reads the targets in training (teacher forcing) and decodes greedily in eval."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.decoder, self.head = nn.Embedding(21, 16), nn.GRU(16, 16, batch_first=True), nn.Linear(16, 21)

    def forward(self, source, teacher):
        start = torch.full_like(source[:, :1], 20)
        if self.training:
            out, _ = self.decoder(self.embed(torch.cat([start, teacher[:, :-1]], 1)))
            return self.head(out)
        token, state, steps = start, None, []
        for _ in range(teacher.shape[1]):
            out, state = self.decoder(self.embed(token) + self.embed(source[:, :1]), state)
            steps.append(self.head(out))
            token = steps[-1].argmax(-1)
        return torch.cat(steps, 1)


def test_targets_read_only_for_teacher_forcing_stay_quiet():
    g = torch.Generator().manual_seed(2)
    source = torch.randint(0, 20, (128, 8), generator=g)
    loader = DataLoader(TensorDataset(source, source.flip(1)), batch_size=32, shuffle=True)

    def loss_fn(model, batch):
        src, tgt = batch
        return F.cross_entropy(model(src, tgt).reshape(-1, 21), tgt.reshape(-1))

    assert_quiet(_run(TeacherForced(), loader, loss_fn))


def test_a_hugging_face_encoder_with_a_padded_attention_mask_stays_quiet():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(3)
    rows = []
    for length in torch.randint(4, 17, (96,), generator=g).tolist():
        ids, mask = torch.zeros(16, dtype=torch.long), torch.zeros(16, dtype=torch.long)
        ids[:length], mask[:length] = torch.randint(5, 100, (length,), generator=g), 1
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(int(ids[1] > 50))})
    result = _run(model, DataLoader(rows, batch_size=32, shuffle=True))
    assert_quiet(result)
    assert "attention_mask" in result.data["used"]


class Seq2Seq(nn.Module):
    """One embedding shared by source and target; the decoder's cross-attention is given its
    own states (the bug) or the encoder's memory."""

    def __init__(self, reads_memory: bool):
        super().__init__()
        torch.manual_seed(0)
        self.reads_memory = reads_memory
        self.embed = nn.Embedding(21, 16)
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 21)

    def forward(self, source, decoder_inputs):
        memory = self.encoder(self.embed(source))
        states = self.embed(decoder_inputs)
        causal = nn.Transformer.generate_square_subsequent_mask(decoder_inputs.shape[1], device=source.device)
        return self.head(self.decoder(states, memory if self.reads_memory else states, tgt_mask=causal))


@pytest.mark.parametrize("reads_memory", [False, True])
def test_a_decoder_whose_cross_attention_never_reads_the_encoder(reads_memory):
    g = torch.Generator().manual_seed(4)
    source = torch.randint(0, 20, (128, 8), generator=g)
    loader = DataLoader(TensorDataset(source, source.flip(1)), batch_size=32, shuffle=True)

    def loss_fn(model, batch):
        src, tgt = batch
        decoder_inputs = torch.cat([torch.full_like(tgt[:, :1], 20), tgt[:, :-1]], 1)
        return F.cross_entropy(model(src, decoder_inputs).reshape(-1, 21), tgt.reshape(-1))

    result = _run(Seq2Seq(reads_memory), loader, loss_fn)
    if reads_memory:
        assert_quiet(result)
        return
    issues = [i for i in result.issues if i.code == "FORWARD_INPUT_IGNORED"]
    assert len(issues) == 1 and "argument 'source'" in issues[0].message
    assert "it reaches 'embed', 'encoder'" in issues[0].message  # the shared embedding's call on the source too


class GraphRegressor(nn.Module):
    """One round of message passing along each graph's chain of nodes, then a read-out to one
    value per graph of the collated batch."""

    def __init__(self, per_graph: bool):
        super().__init__()
        torch.manual_seed(0)
        self.per_graph = per_graph
        self.encode, self.head = nn.Sequential(nn.Linear(6, 16), nn.ReLU()), nn.Linear(16, 1)

    def forward(self, x, edge_index, batch):
        h = self.encode(x)
        h = h + torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]])
        graphs = int(batch.max()) + 1
        if self.per_graph:
            pooled = torch.zeros(graphs, h.shape[1]).index_add_(0, batch, h) / torch.bincount(batch)[:, None]
        else:
            pooled = h.mean(0, keepdim=True).expand(graphs, -1)  # the whole batch at once
        return self.head(pooled).squeeze(-1)


def _graphs():
    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(3, 9, (64,), generator=g)
    return [(torch.randn(int(n), 6, generator=g), torch.randn((), generator=g)) for n in sizes]


def _collate(graphs):
    xs, ys = zip(*graphs, strict=True)
    batch = torch.cat([torch.full((len(x),), i) for i, x in enumerate(xs)])
    starts = torch.cumsum(torch.tensor([0] + [len(x) for x in xs[:-1]]), 0)
    chains = [torch.stack([torch.arange(len(x) - 1), torch.arange(1, len(x))]) + start for x, start in zip(xs, starts, strict=True)]
    return torch.cat(xs), torch.cat(chains, 1), batch, torch.stack(ys)


@pytest.mark.parametrize("per_graph", [False, True])
def test_a_read_out_that_ignores_the_graph_assignment_is_named(per_graph):
    loader = DataLoader(_graphs(), batch_size=8, shuffle=True, collate_fn=_collate)
    issues = _run(GraphRegressor(per_graph), loader, lambda model, b: F.mse_loss(model(*b[:3]), b[3])).issues
    assert bool(issues) == (not per_graph)
    if issues:
        assert "'batch', the node-to-graph assignment of a batch of 8 graphs" in issues[0].message
        assert "global_mean_pool(h, batch)" in issues[0].fix


class SeriesLevels(nn.Module):
    """A global forecaster plus one learned level per series, the table starting at zero."""

    def __init__(self, frozen: bool):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(8, 1)
        self.level = nn.Embedding.from_pretrained(torch.zeros(10, 1), freeze=frozen)

    def forward(self, x, series_id):
        return self.net(x) + self.level(series_id)


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable_zero_table", "frozen_zero_table"])
def test_an_id_table_of_equal_rows_is_used_while_trainable(frozen):
    g = torch.Generator().manual_seed(2)
    x, ids = torch.randn(256, 8, generator=g), torch.randint(0, 10, (256,), generator=g)
    y = x[:, :1] + ids[:, None].float()
    loader = DataLoader(TensorDataset(x, ids, y), batch_size=32, shuffle=True)
    model = SeriesLevels(frozen)
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3),
                           loader, loss_fn=lambda m, b: F.mse_loss(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), ForwardArgumentsCheck()])
    codes = [i.code for i in report.check(NAME).issues]
    # Zero rows that train part from the first step; frozen, the ids never reach the output.
    assert codes == (["FORWARD_INPUT_IGNORED"] if frozen else [])


class TinyCausalLM(nn.Module):
    """A hand-written decoder-only LM whose forward accepts ``attention_mask`` and drops it:
    causal attention alone keeps right padding away from the real positions."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.embed, self.pos = nn.Embedding(40, 32), nn.Embedding(16, 32)
        self.block = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 40)

    def forward(self, input_ids, attention_mask=None):
        steps = input_ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(steps) if self.causal else None
        h = self.embed(input_ids) + self.pos(torch.arange(steps))
        return self.head(self.block(h, src_mask=mask, is_causal=self.causal))


def _lm_rows():
    g = torch.Generator().manual_seed(0)
    rows = []
    for length in torch.randint(5, 17, (96,), generator=g).tolist():
        ids, mask = torch.zeros(16, dtype=torch.long), torch.zeros(16, dtype=torch.long)
        ids[:length], mask[:length] = torch.randint(3, 40, (length,), generator=g), 1
        rows.append({"input_ids": ids, "attention_mask": mask})
    return DataLoader(rows, batch_size=32, shuffle=True)


def _lm_loss(model, batch):
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, 40), labels[:, 1:].reshape(-1))


@pytest.mark.parametrize("causal", [True, False], ids=["causal_right_padding", "bidirectional"])
def test_an_ignored_attention_mask_is_named_only_where_padding_reaches_real_positions(causal):
    torch.manual_seed(0)
    result = _run(TinyCausalLM(causal), _lm_rows(), _lm_loss)
    found = [i for i in result.issues if i.code == "FORWARD_INPUT_IGNORED"]
    if causal:
        assert not found, found  # right padding after every real token: nothing for the mask to hide
    else:
        assert found and "'attention_mask', a padding mask" in found[0].message
        assert "src_key_padding_mask=attention_mask == 0" in found[0].fix


class FreeRunningSeq2Seq(nn.Module):
    """A GRU encoder-decoder teacher-forced in eval; in training it feeds back its own argmax
    with probability 1 - ratio (scheduled sampling)."""

    def __init__(self, ratio: float):
        super().__init__()
        self.ratio = ratio
        self.embed = nn.Embedding(30, 16)
        self.encoder, self.decoder = nn.GRU(16, 32, batch_first=True), nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, 30)

    def forward(self, src, decoder_input):
        _, state = self.encoder(self.embed(src))
        if self.ratio >= 1.0 or not self.training:
            out, _ = self.decoder(self.embed(decoder_input), state)
            return self.out(out)
        steps, token = [], decoder_input[:, :1]
        for t in range(decoder_input.shape[1]):
            out, state = self.decoder(self.embed(token), state)
            steps.append(self.out(out))
            gold = torch.rand(()) < self.ratio
            token = decoder_input[:, t + 1:t + 2] if gold and t + 1 < decoder_input.shape[1] else steps[-1].argmax(-1)
        return torch.cat(steps, 1)


@pytest.mark.parametrize("ratio", [0.0, 1.0], ids=["free_running_in_training", "teacher_forced"])
def test_a_decoder_teacher_forced_in_eval_only_is_named(ratio):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 30, (96, 7), generator=g)
    target = src.flip(1)
    decoder_input = torch.cat([torch.ones(96, 1, dtype=torch.long), target[:, :-1]], 1)  # BOS, then gold tokens
    torch.manual_seed(0)

    def loss(model, batch):
        x, d, y = batch
        return F.cross_entropy(model(x, d).reshape(-1, 30), y.reshape(-1))

    result = _run(FreeRunningSeq2Seq(ratio), DataLoader(TensorDataset(src, decoder_input, target), batch_size=32), loss)
    found = [i for i in result.issues if i.code == "INPUT_IGNORED_IN_TRAINING"]
    assert bool(found) == (ratio == 0.0), result.data
    if found:
        assert "'decoder_input'" in found[0].message and "teacher_forcing_ratio=1.0" in found[0].fix

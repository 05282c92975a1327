"""ATTENTION_MASK_INVERTED: a Hugging Face style attention_mask that is 1 on the padding, and
a torch key_padding_mask that is True on the tokens; the right conventions stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.attention_mask import AttentionMaskCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

PAD = 0


def sentences() -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(1, 50, (int(torch.randint(4, 16, (1,), generator=g)),), generator=g),
             int(torch.randint(0, 2, (1,), generator=g))) for _ in range(256)]


class Encoder(nn.Module):
    def __init__(self, torch_mask_inverted: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.inverted = torch_mask_inverted
        self.embed = nn.Embedding(50, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask=None):
        ignore = (input_ids != PAD) if self.inverted else (input_ids == PAD)
        h = self.encoder(self.embed(input_ids), src_key_padding_mask=ignore)
        return self.head(torch.nan_to_num(h).mean(1))


def hf_collate(inverted: bool):
    def collate(rows):
        ids = pad_sequence([r[0] for r in rows], batch_first=True, padding_value=PAD)
        mask = (ids == PAD) if inverted else (ids != PAD)
        return {"input_ids": ids, "attention_mask": mask.long(), "labels": torch.tensor([r[1] for r in rows])}
    return collate


def loss(model, batch):
    return nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])


def inverted(model: nn.Module, collate) -> list:
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(sentences(), batch_size=32, shuffle=True, collate_fn=collate), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), AttentionMaskCheck()])
    return [i for i in report.check("step.attention_mask").issues if i.code == "ATTENTION_MASK_INVERTED"]


@pytest.mark.parametrize("torch_inverted, hf_inverted, says", [(False, True, "'attention_mask'"),
                                                              (True, False, "src_key_padding_mask")],
                         ids=["hf_mask_on_padding", "key_padding_mask_on_tokens"])
def test_masks_that_select_the_padding_fire(torch_inverted, hf_inverted, says):
    found = inverted(Encoder(torch_inverted), hf_collate(hf_inverted))
    assert found and says in found[0].message


def test_the_right_conventions_are_quiet():
    assert not inverted(Encoder(False), hf_collate(False))


@pytest.mark.gpu
@pytest.mark.parametrize("torch_inverted", [False, True])
def test_on_cuda_the_mask_on_the_device_is_compared_with_the_batch_on_the_host(torch_inverted):
    # The key padding mask is built on the model's device from the moved batch; the padding it
    # is compared with comes from the loader's batch on the CPU (an H200 run crashed the check).
    model = Encoder(torch_inverted).cuda()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(sentences(), batch_size=32, shuffle=True, collate_fn=hf_collate(False)),
                           loss_fn=loss, checks=[FirstBatchCheck(), FirstStepCheck(), AttentionMaskCheck()])
    result = report.check("step.attention_mask")
    assert result.status.value != "crashed", result.detail
    assert any(i.code == "ATTENTION_MASK_INVERTED" for i in result.issues) == torch_inverted


def hf_batches(with_mask: bool, side: str = "right") -> DataLoader:
    def collate(rows):
        ids = [r[0] for r in rows]
        if side == "left":
            ids = pad_sequence([i.flip(0) for i in ids], batch_first=True, padding_value=PAD).flip(1)
        else:
            ids = pad_sequence(ids, batch_first=True, padding_value=PAD)
        batch = {"input_ids": ids, "labels": torch.tensor([r[1] for r in rows])}
        if with_mask:
            batch["attention_mask"] = (ids != PAD).long()
        return batch
    return DataLoader(sentences(), batch_size=32, shuffle=True, collate_fn=collate)


def missing(model: nn.Module, loader: DataLoader) -> list:
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader,
                           checks=[FirstBatchCheck(), FirstStepCheck(), AttentionMaskCheck()])
    return [i for i in report.check("step.attention_mask").issues if i.code == "ATTENTION_MASK_MISSING"]


@pytest.fixture
def transformers():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers


def test_a_padded_batch_without_an_attention_mask_into_a_hf_encoder_fires(transformers):
    def bert():
        torch.manual_seed(0)
        return transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            num_labels=2, pad_token_id=PAD))

    found = missing(bert(), hf_batches(with_mask=False))
    assert len(found) == 1 and "padding id 0" in found[0].message and "attention_mask" in found[0].fix
    assert not missing(bert(), hf_batches(with_mask=True))


def test_a_causal_lm_with_right_padding_and_no_mask_is_quiet(transformers):
    torch.manual_seed(0)
    gpt2 = transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2, num_labels=2, pad_token_id=PAD))
    assert not missing(gpt2, hf_batches(with_mask=False))
    assert missing(gpt2, hf_batches(with_mask=False, side="left"))  # left padding precedes the tokens


class ClipEncoder(nn.Module):
    """Zero-padded (B, T, F) frames behind a [CLS] token: the padding is the all-zero frames."""

    def __init__(self, hf_mask_as_key_padding: bool):
        super().__init__()
        torch.manual_seed(0)
        self.inverted = hf_mask_as_key_padding
        self.inp, self.cls = nn.Linear(8, 16), nn.Parameter(torch.zeros(1, 1, 16))
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 2)

    def forward(self, frames, attention_mask):  # 1 = a real frame, as Hugging Face
        h = torch.cat([self.cls.expand(len(frames), -1, -1), self.inp(frames)], 1)
        mask = torch.cat([torch.ones_like(attention_mask[:, :1]), attention_mask], 1)
        ignore = mask.bool() if self.inverted else mask == 0
        return self.head(self.encoder(h, src_key_padding_mask=ignore)[:, 0])


@pytest.mark.parametrize("inverted", [True, False])
def test_a_hf_mask_passed_as_key_padding_mask_over_zero_padded_frames(inverted):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 20, (256,), generator=g)
    mask = (torch.arange(20)[None] < lengths[:, None]).long()
    frames = torch.randn(256, 20, 8, generator=g) * mask[..., None]
    labels = torch.randint(0, 2, (256,), generator=g)
    model = ClipEncoder(inverted)

    def clip_loss(model, batch):
        x, m, y = batch
        return nn.functional.cross_entropy(model(x, m), y)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(frames, mask, labels), batch_size=32, shuffle=True),
                           loss_fn=clip_loss, checks=[FirstBatchCheck(), FirstStepCheck(), AttentionMaskCheck()])
    found = [i for i in report.check("step.attention_mask").issues if i.code == "ATTENTION_MASK_INVERTED"]
    assert bool(found) == inverted
    if inverted:
        assert "src_key_padding_mask" in found[0].message


class BackboneWithHead(nn.Module):
    """A Hugging Face encoder inside a user's module, its mask built in forward."""

    def __init__(self, transformers, invert: bool):
        super().__init__()
        self.invert = invert
        self.bert = transformers.BertModel(transformers.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            pad_token_id=PAD))
        self.head = nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask):
        mask = 1 - attention_mask if self.invert else attention_mask
        return self.head(self.bert(input_ids=input_ids, attention_mask=mask).last_hidden_state[:, 0])


@pytest.mark.parametrize("invert", [True, False], ids=["mask_inverted_in_forward", "mask_passed_on"])
def test_a_mask_inverted_on_its_way_into_a_wrapped_hf_model(transformers, invert):
    torch.manual_seed(0)
    model = BackboneWithHead(transformers, invert)

    def loss_fn(model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"])
        return nn.functional.cross_entropy(logits, batch["labels"])

    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), hf_batches(with_mask=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), AttentionMaskCheck()])
    found = [i for i in report.check("step.attention_mask").issues if i.code == "ATTENTION_MASK_INVERTED"]
    assert bool(found) == invert
    if found:
        assert "BertModel" in found[0].message and "1 exactly on the padding" in found[0].message


def test_an_unused_hf_pooler_under_a_cls_head_gets_no_gradient_warning(transformers):
    # BertModel computes pooler_output on every call; a head on last_hidden_state[:, 0] leaves it
    # unused, which is the usual fine-tuning code and costs nothing outside DDP.
    from optimus_preflight.preflight.checks.step_checks import GradientsCheck

    torch.manual_seed(0)
    model = BackboneWithHead(transformers, invert=False)

    def loss_fn(model, batch):
        return nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), hf_batches(with_mask=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    result = report.check("step.gradients")
    assert not result.issues and result.data["unused_pooler"] == ["bert.pooler.dense.weight", "bert.pooler.dense.bias"]
    model.head.weight.requires_grad_(True)
    model.bert.embeddings.word_embeddings.register_forward_hook(lambda m, i, o: o.detach())
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), hf_batches(with_mask=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    missing = [i for i in report.check("step.gradients").issues if i.code == "GRAD_NONE"]
    assert missing and "word_embeddings" in missing[0].message  # a real cut is still reported

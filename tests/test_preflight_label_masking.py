"""LABELS_MASK_REAL_TOKEN: labels masked by input_ids == pad_token_id when the pad id is the
EOS (every real end token loses its target), also beside a masked prompt; masking by the
attention mask, and a masked prompt, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.label_masking import LabelMaskingCheck

EOS = 2


def rows(how: str) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(128):
        n = int(torch.randint(4, 14, (1,), generator=g))
        ids = torch.full((16,), EOS)
        ids[:n] = torch.randint(3, 50, (n,), generator=g)  # then the EOS, then padding with the EOS id
        mask = (torch.arange(16) <= n).long()
        if how == "by_pad_id":
            labels = ids.masked_fill(ids == EOS, -100)
        elif how == "by_attention":
            labels = ids.masked_fill(mask == 0, -100)
        elif how == "prompt_masked_by_pad_id":  # SFT: the prompt masked, then the padding by the pad id
            labels = ids.masked_fill(ids == EOS, -100)
            labels[:3] = -100
        else:  # a masked prompt of 3 tokens, padding by attention
            labels = ids.masked_fill(mask == 0, -100)
            labels[:3] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(50, 8), nn.Linear(8, 50)

    def forward(self, input_ids, attention_mask=None):
        return self.out(self.embed(input_ids))


def lm_loss(model, batch):
    logits = model(batch["input_ids"])
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), batch["labels"][:, 1:].reshape(-1))


@pytest.mark.parametrize("how, fires", [("by_pad_id", True), ("by_attention", False), ("prompt_masked", False),
                                       ("prompt_masked_by_pad_id", True)])
def test_labels_masked_by_a_pad_id_that_is_the_eos(how, fires):
    model = Lm()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(rows(how), batch_size=32, shuffle=True), loss_fn=lm_loss,
                           checks=[FirstBatchCheck(), LabelMaskingCheck()])
    assert bool(report.check("data.label_masking").issues) == fires


def sft_pairs(inverted: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, labels) rows of an instruction set: a prompt of 4-7 tokens, an answer of 3-6."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(96):
        prompt, answer = int(torch.randint(4, 8, (1,), generator=g)), int(torch.randint(3, 7, (1,), generator=g))
        ids = torch.randint(3, 50, (prompt + answer,), generator=g)
        labels = ids.clone()
        if inverted:
            labels[prompt:] = -100  # meant: labels[:prompt] = -100
        else:
            labels[:prompt] = -100
        out.append((ids, labels))
    return out


def pad_pairs(rows):
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], labels[i, :len(y)] = x, y
    return ids, labels


def pair_loss(model, batch):
    ids, labels = batch
    logits = model(ids)
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), labels[:, 1:].reshape(-1))


@pytest.mark.parametrize("inverted", [True, False], ids=["prompt_kept_answer_masked", "prompt_masked"])
def test_labels_that_keep_the_prompt_and_mask_the_answer(inverted):
    model = Lm()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(sft_pairs(inverted), batch_size=32, shuffle=True, collate_fn=pad_pairs),
                           loss_fn=pair_loss, checks=[FirstBatchCheck(), LabelMaskingCheck()])
    found = [i for i in report.check("data.label_masking").issues if i.code == "LABELS_ONLY_ON_PROMPT"]
    assert bool(found) == inverted
    if inverted:
        assert "labels[:len(prompt)] = -100 was meant" in found[0].message


def mixed_padding(labels_left: bool):
    """input_ids right-padded (pad_sequence), labels (-100 on the prompt) padded on the left."""
    def collate(rows):
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100)
        for i, (x, y) in enumerate(rows):
            ids[i, :len(x)] = x
            if labels_left:
                labels[i, width - len(y):] = y
            else:
                labels[i, :len(y)] = y
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}
    return collate


def dict_loss(model, batch):
    logits = model(batch["input_ids"])
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), batch["labels"][:, 1:].reshape(-1))


@pytest.mark.parametrize("labels_left", [True, False], ids=["labels_left_padded", "both_right_padded"])
def test_labels_padded_on_the_other_side_than_the_inputs(labels_left):
    model = Lm()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(sft_pairs(False), batch_size=32, shuffle=True, collate_fn=mixed_padding(labels_left)),
                           loss_fn=dict_loss, checks=[FirstBatchCheck(), LabelMaskingCheck()])
    found = [i for i in report.check("data.label_masking").issues if i.code == "LABELS_PADDED_APART"]
    assert bool(found) == labels_left
    if found:
        assert "padding_side='left'" in found[0].message and "same side as the inputs" in found[0].fix


def reversal_pairs(off_by_one: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, labels) rows of 'reverse this word' instructions: the answer holds the prompt's
    letters; ``off_by_one`` zips the prompts with the answers list shifted by one (a skipped header)."""
    g = torch.Generator().manual_seed(3)
    words = [torch.randint(10, 50, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g) for _ in range(97)]
    answers = [w.flip(0) for w in words]
    if off_by_one:
        answers = answers[1:] + answers[:1]
    rows = []
    for word, answer in zip(words, answers, strict=True):
        ids = torch.cat([torch.tensor([3, 4]), word, torch.tensor([5]), answer])  # "reverse:" word "=>" answer
        labels = ids.clone()
        labels[: 3 + len(word)] = -100
        rows.append((ids, labels))
    return rows


@pytest.mark.parametrize("off_by_one", [True, False], ids=["answers_one_row_off", "paired"])
def test_answers_zipped_one_row_off_their_prompts(off_by_one):
    model = Lm()
    rows = reversal_pairs(off_by_one)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(rows, batch_size=32, shuffle=True, collate_fn=pad_pairs),
                           val_loader=DataLoader(rows[:40], batch_size=40, collate_fn=pad_pairs),
                           loss_fn=pair_loss, checks=[FirstBatchCheck(), LabelMaskingCheck()])
    found = [i for i in report.check("data.label_masking").issues if i.code == "ANSWERS_ONE_ROW_OFF"]
    assert bool(found) == off_by_one
    if found:
        assert "next row's prompt" in found[0].message and "one record" in found[0].fix


def test_a_masked_lm_over_overlapping_windows_has_no_answers_to_pair():
    # Windows of one text sliding by two tokens: the next row holds most of this row's tokens,
    # and the labels are the masked tokens scattered over the row, not an answer after a prompt.
    g = torch.Generator().manual_seed(4)
    text = torch.randint(10, 50, (400,), generator=g)
    rows = []
    for start in range(0, 380, 2):
        ids = text[start:start + 16].clone()
        labels = torch.full_like(ids, -100)
        masked = torch.rand(16, generator=g) < 0.3
        labels[masked], ids[masked] = ids[masked], 6  # [MASK]
        rows.append((ids, labels))
    model = Lm()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(rows, batch_size=32, shuffle=True, collate_fn=pad_pairs),
                           loss_fn=pair_loss, checks=[FirstBatchCheck(), LabelMaskingCheck()])
    assert not report.check("data.label_masking").issues


def truncating(max_length: int):
    """Right-padded rows cut to max_length, as tokenizer(..., truncation=True) does from the right."""
    def collate(rows):
        ids, labels = pad_pairs(rows)
        return ids[:, :max_length], labels[:, :max_length]
    return collate


def system_prompted(samples: int = 96) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row: an 8-token system prompt, a 4-7 token instruction (both masked), a 3-6 token answer."""
    system = torch.arange(10, 18)
    rows = []
    for ids, labels in sft_pairs(False)[:samples]:
        rows.append((torch.cat([system, ids]), torch.cat([torch.full((8,), -100), labels])))
    return rows


@pytest.mark.parametrize("max_length", [14, 32], ids=["cut_before_the_answers", "fits"])
def test_sequences_truncated_before_their_answers(max_length):
    model = Lm()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(system_prompted(), batch_size=32, shuffle=True, collate_fn=truncating(max_length)),
                           loss_fn=pair_loss, checks=[FirstBatchCheck(), LabelMaskingCheck()])
    found = [i for i in report.check("data.label_masking").issues if i.code == "ANSWERS_TRUNCATED"]
    assert bool(found) == (max_length == 14), report.check("data.label_masking").data
    if found:
        assert "truncated to max_length" in found[0].message and "truncation_side='left'" in found[0].fix

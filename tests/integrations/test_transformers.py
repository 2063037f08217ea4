"""hookscope's Hugging Face callback on a tiny BERT built from a config: its own names, one read per step."""

from __future__ import annotations

import pytest
import torch
from loops import hf_arguments
from transformers import BertConfig, BertForSequenceClassification, Trainer

from hookscope.integrations.transformers import HookscopeCallback

pytestmark = pytest.mark.usefixtures("deterministic")


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def examples(n: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(0, 100, (16,), generator=gen), "labels": torch.tensor(i % 2)}
        for i in range(n)
    ]


def test_accumulated_steps_are_read_once_each_under_the_models_own_names(tmp_path) -> None:
    bert = tiny_bert()
    callback = HookscopeCallback(quiet=True, check_every=2)
    args = hf_arguments(str(tmp_path), 4, 8, 5e-4, gradient_accumulation_steps=2)
    trainer = Trainer(model=bert, args=args, train_dataset=examples(64), callbacks=[callback])
    trainer.train()
    watch = callback.watch
    assert watch.step == trainer.state.global_step == 4
    # every layer that ran has one record per optimizer step (the SDPA attention never calls its dropout)
    assert {len(records) for records in watch.gradients.values() if records} == {4}
    assert "bert.encoder.layer.0.attention.self.query" in watch.activations
    assert {f.module for f in callback.findings} <= set(watch.activations) | {""}  # HF's names, unchanged
    assert sum(len(m._forward_hooks) for m in bert.modules()) == 0


def test_a_freshly_initialised_bert_gets_no_warning(tmp_path) -> None:
    """Its attention is nearly uniform, so the query and key projections get ~1e-5 of the largest
    layer's gradient while the layers around them learn: no vanishing gradient, which reaches the
    first layers (issue 16: healthy models stay quiet)."""
    bert = tiny_bert()
    callback = HookscopeCallback(quiet=True, check_every=2)
    args = hf_arguments(str(tmp_path), 8, 8, 5e-4)
    Trainer(model=bert, args=args, train_dataset=examples(64), callbacks=[callback]).train()
    query = callback.watch.param_history["bert.encoder.layer.0.attention.self.query.weight"][-1].grad_norm
    largest = max(r[-1].grad_norm for r in callback.watch.param_history.values())
    assert query < 1e-3 * largest  # the small gradient is there
    assert callback.findings == []


def test_batches_padded_to_their_own_length_train_and_evaluate(tmp_path):
    """A collator's dynamic padding (what `DataCollatorWithPadding` does): each batch as long as its longest
    example, so a recorded step's micro-batches and an evaluation's batches differ in dim 1. Their second
    one raised "RunningStats got a tensor with ... channels (dim 1) after tensors with ... channels" out of
    `trainer.train()`; the statistics now keep each window's first layout."""
    gen = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": torch.randint(1, 100, (4 + i % 9,), generator=gen), "labels": torch.tensor(i % 2)}
        for i in range(48)
    ]

    def pad_to_longest(batch):
        longest = max(len(example["input_ids"]) for example in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        mask = torch.zeros(len(batch), longest, dtype=torch.long)
        for row, example in enumerate(batch):
            ids[row, : len(example["input_ids"])] = example["input_ids"]
            mask[row, : len(example["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([e["labels"] for e in batch])}

    callback = HookscopeCallback(quiet=True, check_every=2, every=1)
    args = hf_arguments(
        str(tmp_path), 6, 4, 5e-4, gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=3
    )
    trainer = Trainer(
        model=tiny_bert(),
        args=args,
        train_dataset=data[:32],
        eval_dataset=data[32:],
        data_collator=pad_to_longest,
        callbacks=[callback],
    )
    trainer.train()
    assert trainer.state.global_step == 6
    assert len(callback.watch.activations["bert.encoder.layer.0.output.dense"]) == 6

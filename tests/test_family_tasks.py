"""Every task on every family: a checkpoint saved for a problem type loads with it, and its logits
and loss on labels of that task equal transformers'."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import flaxheads
from families import FAMILIES, TASKS, case
from family_parity import assert_close, flax_inputs, torch_forward

CASES = [case(row, task, id=f"{row.name}-{name}", fast=row.name == "bert")
         for row in FAMILIES.values() for name, task in TASKS.items()]


@pytest.mark.matrix("row", "task")
@pytest.mark.parametrize(("row", "task"), CASES)
def test_logits_and_loss_of_the_task_match_transformers(hf_checkpoint, row, task):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=task.num_labels,
                               problem_type=task.problem_type)
    batch = row.batch(row.sample_padding)
    model = flaxheads.from_pretrained(checkpoint.path, **dict(row.load_options))

    logits = model(**flax_inputs(batch))
    loss = model.loss(logits, jnp.asarray(task.labels))

    expected = torch_forward(checkpoint.model, {**batch, "labels": task.labels})
    assert model.config.problem_type == task.problem_type and model.config.num_labels == task.num_labels
    assert_close(logits, expected.logits, f"{row.name} {task.problem_type} logits")
    assert_close(loss, expected.loss, f"{row.name} {task.problem_type} loss")

"""What a training run shows while it runs (the loop's wiring of the progress bar; the bar's
parts are tested in test_run_log.py)."""

from __future__ import annotations

import csv
import re

import pytest
import transformers

import flaxheads

pytestmark = pytest.mark.slow  # a training run


def test_a_run_off_a_terminal_prints_a_line_after_the_first_step_and_one_per_logging_step(
        tiny_bert, snippets_csv, capsys):
    with open(snippets_csv["train"], encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    data = ([r["sentence"] for r in rows[:24]], [r["label"] for r in rows[:24]])
    args = flaxheads.TrainConfig(output_dir=None, dataset=None, text_column="sentence", max_seq_length=16,
                                 per_device_train_batch_size=4, max_steps=4, logging_steps=2, do_eval=False, seed=3)
    trainer = flaxheads.Trainer(flaxheads.from_pretrained(tiny_bert, num_labels=2), args, train_dataset=data,
                                tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_bert))
    trainer.train()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train  step")]
    assert [line.split("  ")[1] for line in lines] == ["step 1/4", "step 2/4", "step 4/4"]
    # the first step (after compiling: minutes on a CPU, not silent), labelled as the running mean it shows
    assert re.search(r"  loss \(mean of last 20 steps\) \d+\.\d{4}  lr ", lines[0])
    # at logging steps the logging window's mean loss (as metrics.jsonl has it), the learning rate, and
    # examples/s (one shape: step 2 on is warm)
    assert all(re.search(r"  loss \d+\.\d{4}  lr \d\.\d\de-\d\d  ", line) for line in lines[1:])
    assert "ex/s" in lines[-1]

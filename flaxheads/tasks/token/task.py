"""Token classification ("token-classification", transformers' alias "ner"): a tag per word (NER,
POS), word files read with their tags onto subwords as run_ner.py puts them, long sentences in
windows, entity-level metrics at the word level (seqeval's), transformers'
`*ForTokenClassification`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from flaxheads import data
from flaxheads.conversion.table import TOKEN_CLASSIFICATION
from flaxheads.tasks.base import Task, given_settings
from flaxheads.tasks.token import entity_metrics, tags
from flaxheads.tasks.token import scoring as token_scoring
from flaxheads.tasks.token import word_task
from flaxheads.tasks.token.command import predict_rows
from flaxheads.tasks.token.inference import evaluate_words
from flaxheads.tasks.token.model import TokenClassifier, TokenClassifierConfig, saved_tags
from flaxheads.tasks.token.objective import OBJECTIVE, TokenObjective
from flaxheads.tasks.token.pipeline import token_classification_pipeline
from flaxheads.tokenizer import check_room_for_text
from flaxheads.training.config import TrainConfig

class TokenClassification(Task):
    name = TOKEN_CLASSIFICATION
    aliases = ("ner",)
    model_class = TokenClassifier
    noun = "token classifier"
    problem = word_task.PROBLEM
    settings = ("label_all_tokens", "stride", "tag_scheme", "label_names")
    setting_choices = {"tag_scheme": tags.SCHEMES, "eval_mode": entity_metrics.MODES}
    files = "word files (CoNLL, CoNLL-U, or JSON / JSON Lines / CSV with a tokens and a tags column)"
    settings_are = "label token classification data"

    # -- data ----------------------------------------------------------------------------------

    def reads(self, source: Mapping[str, Any]) -> bool:
        """Words and tags: the train file looks like a word file (`word_task.looks_like_word_file`),
        or is a .tsv (a table, or CoNLL columns) beside a validation or test file that does; without
        a train file, a trained model's tags (`label_names`) say so."""
        train_file, text_column = source.get("train_file"), source.get("text_column") or "text"
        if not train_file:
            return source.get("label_names") is not None
        if word_task.looks_like_word_file(train_file, text_column):
            return True
        others = (source.get("validation_file"), source.get("test_file"))
        return _is_tsv(train_file) and any(path and not _is_tsv(path) and word_task.looks_like_word_file(
            path, text_column) for path in others)

    def given(self, source: Mapping[str, Any]) -> list[str]:
        shown = given_settings(source, ("label_all_tokens", "stride", "tag_scheme"))
        return shown + (["label_names (a token classifier's tags)"] if source.get("label_names") is not None else [])

    def load_data(self, source: Mapping[str, Any]) -> data.TaskData:
        train_file, validation_file, test_file = (source.get(f"{split}_file") for split in ("train", "validation",
                                                                                           "test"))
        label_names = source.get("label_names")
        if not train_file and (label_names is None or not (validation_file or test_file)):
            raise ValueError("task='token-classification' reads word files: give a train_file (CoNLL, CoNLL-U, or "
                             "JSON / JSON Lines / CSV with a tokens and a tags column), or, to score a trained "
                             "model, a validation_file or test_file and the model's tags as label_names")
        words = word_task.load_word_files(train_file=train_file, validation_file=validation_file, test_file=test_file,
                                     label_names=label_names, scheme=source.get("tag_scheme"))
        return word_task.token_task_data(words, label_all_tokens=bool(source.get("label_all_tokens")),
                                    stride=source.get("stride"))

    def scoring_source(self, folder, source: dict[str, Any]) -> dict[str, Any]:
        """A trained token classifier's tags (config.json's id2label), to read validation and test
        files alone against them."""
        return {**source, "label_names": saved_tags(folder)}

    def data_for(self, given: data.InMemoryTask, split: str, dataset, column_args: dict[str, Any]
                 ) -> data.InMemoryTask:
        return word_task.words_beside(given.task, split, dataset)

    # -- the model -----------------------------------------------------------------------------

    def load_settings(self, data_task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
        if cfg.head is not None:
            raise ValueError(f"head={cfg.head!r} picks a sequence classifier's head, and the data is token "
                             "classification, whose head is the family's own (a Linear on every token): leave "
                             "head out")
        return super().load_settings(data_task, cfg)

    def fit_config(self, config: TokenClassifierConfig, data_task: data.TaskData, args: TrainConfig
                   ) -> TokenClassifierConfig:
        names = tuple(data_task.id2label[i] for i in range(data_task.num_labels))
        if config.num_labels != data_task.num_labels:
            raise ValueError(
                f"the model has {config.num_labels} labels but the data has {data_task.num_labels} tags "
                f"({', '.join(names)}). Load the model with TokenClassifier.from_pretrained(..., id2label="
                f"{list(names)}) (and ignore_mismatched_sizes=True when its checkpoint has a trained head of another "
                "size)")
        default = tuple(data.task.default_id2label(data_task.num_labels).values())
        if config.labels not in (None, default, names):
            raise ValueError(f"the model's tags are {list(config.labels)} but the data's are {list(names)} (the "
                             "sorted train tags): load the model with from_pretrained(..., id2label=[...the data's "
                             "tags...]) to relabel its head")
        return dataclasses.replace(config, labels=names)

    # -- training ------------------------------------------------------------------------------

    def check_settings(self, args: TrainConfig, data_task: data.TaskData, *, tokenizer, max_seq_length: int) -> None:
        super().check_settings(args, data_task, tokenizer=tokenizer, max_seq_length=max_seq_length)
        token_scoring.check_eval_mode(args.eval_mode, data_task.source)
        check_room_for_text(tokenizer, max_seq_length)

    def objective(self, data_task: data.TaskData, loss_options: Mapping[str, Any]) -> TokenObjective:
        return OBJECTIVE

    def default_metric(self, data_task: data.TaskData) -> str:
        return "f1"

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task: data.TaskData, config, args: TrainConfig,
               source: Any = None, **options):
        return token_scoring.TokenSplitScorer(graphdef, splits, batch_format, layout, **options,
                                              class_names=config.label_names, objective=OBJECTIVE,
                                              words=source or data_task.source, eval_mode=args.eval_mode)

    def predicted(self, logits, config, data_task: data.TaskData) -> list:
        return token_scoring.predicted_tags(logits, config.label_names)

    def format_predictions(self, predicted: list, data_task: data.TaskData) -> str:
        return token_scoring.format_word_predictions(predicted)

    def identity(self, data_task: data.TaskData, args: TrainConfig) -> dict[str, dict[str, Any]]:
        """How word tags became subword labels, and the entity metrics the best model is chosen by."""
        words = data_task.source
        return {"trained": {"token_labels": {"label_all_tokens": words.label_all_tokens, "stride": words.stride,
                                             "scheme": words.task.scheme}},
                "settings": {"eval_mode": args.eval_mode}}

    # -- a trained model -----------------------------------------------------------------------

    def evaluate(self, folder, data_task: data.TaskData, split: str, *, options: Mapping[str, Any]) -> dict:
        if options.get("packing"):
            raise ValueError("packing=True (--packing) does not apply to token classification: each sentence (or "
                             "window of one) is a row of its own. Evaluate without packing")
        return evaluate_words(folder, data_task, split, max_seq_length=options["max_seq_length"],
                              batch_size=options["batch_size"], tokenizer_name=options.get("tokenizer_name"),
                              eval_mode=options["eval_mode"])

    def predict_command(self, folder, inputs: Mapping[str, Any]) -> list[dict]:
        return predict_rows(folder, inputs)

    def pipeline(self, model, tokenizer, **options):
        return token_classification_pipeline(model, tokenizer, **options)


def _is_tsv(path) -> bool:
    return os.fspath(path).lower().endswith(".tsv")


TASK = TokenClassification()

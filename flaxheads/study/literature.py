"""What published work measured about heads, quoted in the study report next to this study's own
findings. Every figure below was read from the papers' text (2026-11-26), not recalled; the
report says what each comparison held fixed, so that nobody reads more into it than was measured.
"""

from __future__ import annotations

SUN_2019 = (
    "Sun, Qiu, Xu and Huang (2019), *How to Fine-Tune BERT for Text Classification?* (CCL 2019), Table 3: "
    "BERT-base fine-tuned on IMDb with the [CLS] vector of one layer, or of several layers combined, as the "
    "classifier's input. Test error 5.42% from the last layer alone; the last four layers' [CLS] vectors gave "
    "5.43% concatenated, 5.44% averaged and 5.42% max-pooled; all twelve concatenated 5.44%; single earlier "
    "layers did worse (11.07% from the first). So on a BERT pretrained with next-sentence prediction, a "
    "`concat_last4`-style head matched the last layer's [CLS]; one data set, one run per row. They did not "
    "compare pooling over tokens (mean or max over positions): their mean and max pool the [CLS] vectors of "
    "several layers."
)

REIMERS_2019 = (
    "Reimers and Gurevych (2019), *Sentence-BERT* (EMNLP 2019), Table 6: BERT-base fine-tuned as a siamese "
    "encoder, scored by Spearman correlation x 100 on the STS benchmark's development split, averaged over 10 "
    "seeds. Trained on NLI with a classification objective the pooling mattered little (mean 80.78, [CLS] "
    "79.80, max 79.07); trained on STSb with a regression objective max pooling fell behind (mean 87.44, [CLS] "
    "86.62, max 69.92). Without fine-tuning (Table 1), averaged BERT token vectors (54.81, mean over seven STS "
    "tasks) and the [CLS] vector (29.19) made worse similarity embeddings than averaged GloVe vectors "
    "(61.32); yet a logistic regression trained on the frozen vectors (SentEval, Table 5) did better from "
    "averaged BERT (84.94) and [CLS] (84.66) than from GloVe (81.52). These are sentence-embedding tasks, "
    "not a classifier fine-tuned end to end on its own labels as in this study."
)

WHAT_WOULD_CHANGE = (
    "What this means for the study above: its checkpoint was trained for mean pooling, so `mean`-type heads "
    "start from the features it was trained to produce, while `pooler` starts from an untrained dense layer "
    "(`pooler_reinit` is the same head re-initialised). On a checkpoint whose pooler and [CLS] were trained "
    "(BERT with next-sentence prediction, or an encoder trained for [CLS] pooling) the first-token heads start "
    "from trained features; on such a BERT, Sun et al. found the last layer's [CLS] level with the last four "
    "layers' (IMDb). Whether `mean` or `mean_max` still leads there is not measured here: it would take this "
    "grid on such a checkpoint (`flaxheads study run --checkpoints ...`)."
)


def section() -> str:
    """The report's section on published results, as markdown."""
    return "\n".join(f"- {paragraph}" for paragraph in (SUN_2019, REIMERS_2019)) + "\n\n" + WHAT_WOULD_CHANGE


__all__ = ["REIMERS_2019", "SUN_2019", "WHAT_WOULD_CHANGE", "section"]

"""Question answering's Hugging Face Flax face: the stand-in for `FlaxAutoModelForQuestionAnswering`
(`flaxheads.functional.FunctionalModel` over `QuestionAnswering`), so a training script written for
it (examples/flax/question-answering/run_qa.py) runs on flaxheads with its model lines changed.

    model = FunctionalQuestionAnswering.from_pretrained("path/to/bert", config=config, seed=42)
    start_logits, end_logits = model(**batch, params=model.params, dropout_rng=key, train=True)  # (batch, seq) each
    model.save_pretrained("out", params=trained_params)     # a directory transformers loads
"""

from __future__ import annotations

from flaxheads.functional import FunctionalModel
from flaxheads.tasks.qa.model import QuestionAnswering, QuestionAnsweringOutput


class FunctionalQuestionAnswering(FunctionalModel):
    """A `QuestionAnswering` model split into structure and `.params`, called as a pure function
    (`FunctionalModel`): `model(input_ids, attention_mask=None, token_type_ids=None,
    position_ids=None, *, params=, dropout_rng=, train=)` -> `QuestionAnsweringOutput`, (batch,
    seq) int inputs -> (batch, seq) float32 `start_logits` and `end_logits`: `output[0]` and
    `output[1]`, as in Hugging Face's `FlaxQuestionAnsweringModelOutput` (run_qa.py's loss reads
    `logits[0]`, `logits[1]`). Padding positions are scored too, as transformers scores them.

    Every family's span head ("linear", "modernbert") is taken, XLNet's `XLNetForQuestionAnsweringSimple`
    included. XLNet's "squad" head (`XLNetForQuestionAnswering`) is refused: it gives five beam
    outputs, not two logits, and needs the gold start as an input to train, which no
    `FlaxAutoModelForQuestionAnswering` script passes (Hugging Face Flax had no XLNet QA)."""

    model_class = QuestionAnswering
    output_class = QuestionAnsweringOutput

    def __init__(self, model: QuestionAnswering):
        if model.config.head == "squad":
            raise ValueError(
                "head='squad' (XLNetForQuestionAnswering's beam head) has no Hugging Face Flax face: it gives beams, "
                "not start and end logits, and its loss needs the gold start inside the forward pass, which a "
                "FlaxAutoModelForQuestionAnswering script does not pass. Load its span head with "
                "FunctionalQuestionAnswering.from_pretrained(path, head='linear') (XLNetForQuestionAnsweringSimple), "
                "or use flaxheads.QuestionAnswering and its loss in your own loop")
        super().__init__(model)


__all__ = ["FunctionalQuestionAnswering", "QuestionAnsweringOutput"]

"""Writes tests/fixtures/hf_flax/: tiny checkpoints saved by transformers 4.57's Flax classes.

Runs in the second environment (transformers 4.57 has the Flax models; transformers 5 and the
main environment do not), so the tests read what real Hugging Face Flax users saved, with no
transformers 4.x installed:

    bash scripts/make_hf_flax_env.sh /work/hf-flax-env
    /work/hf-flax-env/bin/python scripts/make_hf_flax_fixtures.py

Each fixture folder holds what `save_pretrained` wrote (config.json, flax_model.msgpack or a
sharded index + shards) and expected.npz: the inputs (padded rows, attention_mask) and the
transformers Flax model's float32 outputs for them (`logits` of classifiers, `last_hidden_state`
of bare models). Re-running rewrites the folder with the same values (fixed seeds).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from flax.traverse_util import flatten_dict, unflatten_dict

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf_flax"
STD = 0.1
"""Of every drawn parameter (and around 1 for LayerNorm scales): logits of order 1, attention far from uniform."""
SIZES = dict(vocab_size=99, num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=37,
             max_position_embeddings=64)
GPT2_SIZES = dict(vocab_size=99, n_layer=2, n_head=4, n_embd=32, n_inner=37, n_positions=64)
BERT_FAMILY = dict(type_vocab_size=2, pad_token_id=0)
# RoBERTa's real layout: one token type, <pad> = 1 (position ids then start at 2), <s> = 0, </s> = 2.
ROBERTA_FAMILY = dict(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)


def randomized(params, seed: int):
    """Every leaf drawn afresh, biases and LayerNorm included: transformers' zeros and ones would
    let a conversion that swapped a LayerNorm's scale and bias, or dropped a bias, still match."""
    rng = np.random.default_rng(seed)
    flat = flatten_dict(params)
    drawn = {}
    for path, value in flat.items():
        noise = rng.standard_normal(value.shape).astype(np.float32)
        drawn[path] = jnp.asarray(1.0 + STD * noise if path[-1] == "scale" else STD * noise)
    return unflatten_dict(drawn)


def inputs(pad_token_id: int, token_types: int, seed: int) -> dict[str, np.ndarray]:
    """Three rows of 8 tokens: one full, two right-padded, and (with two types) a second segment."""
    rng = np.random.default_rng(seed)
    lengths = np.array([8, 5, 3])
    mask = (np.arange(8)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(3, SIZES["vocab_size"], size=(3, 8)).astype(np.int32)
    ids = np.where(mask == 1, ids, pad_token_id).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": mask}
    if token_types > 1:
        batch["token_type_ids"] = ((np.arange(8)[None, :] >= 2) & (mask == 1)).astype(np.int32)
    return batch


def save(name: str, model, params, batch: dict[str, np.ndarray], outputs: dict[str, np.ndarray], **save_kwargs):
    folder = OUT / name
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder, params=params, **save_kwargs)
    np.savez(folder / "expected.npz", **batch, **{k: np.asarray(v, np.float32) for k, v in outputs.items()})
    files = sorted(p.name for p in folder.iterdir())
    print(f"{name}: {files}, {sum(p.stat().st_size for p in folder.iterdir()):,} bytes")


def classifier(name: str, model_cls, config, seed: int, *, bf16: bool = False):
    model = model_cls(config, seed=seed)
    params = randomized(model.params, seed)
    if bf16:
        params = model.to_bf16(params)
    batch = inputs(config.pad_token_id, config.type_vocab_size, seed)
    # The expected logits: float32 compute on the saved values (bfloat16 ones upcast exactly).
    float32_params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    logits = model(**batch, params=float32_params).logits
    save(name, model, params, batch, {"logits": logits})


def bare(name: str, model_cls, config, seed: int, *, token_types: int, pad_token_id: int, **save_kwargs):
    model = model_cls(config, seed=seed)
    params = randomized(model.params, seed)
    batch = inputs(pad_token_id, token_types, seed)
    if model_cls is transformers.FlaxGPT2LMHeadModel:
        # The LM head is tied to wte: its logits are the hidden states times wte; keep the hidden states.
        hidden = transformers.FlaxGPT2Model(config, _do_init=False)(**batch, params=params["transformer"])[0]
    else:
        hidden = model(**batch, params=params).last_hidden_state
    save(name, model, params, batch, {"last_hidden_state": hidden}, **save_kwargs)


def main() -> int:
    print(f"transformers {transformers.__version__}, jax {jax.__version__}")
    OUT.mkdir(parents=True, exist_ok=True)
    bert = transformers.BertConfig(**SIZES, **BERT_FAMILY, num_labels=3)
    roberta = transformers.RobertaConfig(**SIZES, **ROBERTA_FAMILY, num_labels=2)
    gpt2 = transformers.GPT2Config(**GPT2_SIZES)
    classifier("bert_seq_cls", transformers.FlaxBertForSequenceClassification, bert, seed=1)
    classifier("roberta_seq_cls", transformers.FlaxRobertaForSequenceClassification, roberta, seed=2)
    classifier("bert_seq_cls_bf16", transformers.FlaxBertForSequenceClassification, bert, seed=3, bf16=True)
    bare("bert_model", transformers.FlaxBertModel, transformers.BertConfig(**SIZES, **BERT_FAMILY), seed=4,
         token_types=2, pad_token_id=0)
    bare("gpt2_model", transformers.FlaxGPT2Model, gpt2, seed=5, token_types=1, pad_token_id=0)
    # ~76 KB of float32 parameters in shards of at most 30 KB: three shards, some layers split across two.
    bare("gpt2_lm_sharded", transformers.FlaxGPT2LMHeadModel, gpt2, seed=6, token_types=1, pad_token_id=0,
         max_shard_size="30KB")
    # ALBERT: embeddings narrower than the hidden size, 2 groups of 2 shared layers.
    albert = transformers.AlbertConfig(**SIZES, **BERT_FAMILY, embedding_size=24, num_hidden_groups=2,
                                       inner_group_num=2, num_labels=3)
    classifier("albert_seq_cls", transformers.FlaxAlbertForSequenceClassification, albert, seed=7)
    return 0


if __name__ == "__main__":
    sys.exit(main())

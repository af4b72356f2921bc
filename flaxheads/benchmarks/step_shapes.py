"""What one step benchmark measures: the architecture, its size and the batch (`StepBench`), and
the Hugging Face config.json it builds. Shared by the flaxheads/PyTorch side (`steps.py`) and the
Hugging Face Flax peer (`hf_flax.py`)."""

from __future__ import annotations

import dataclasses
from typing import Any

SIZES = {
    # (hidden, layers, heads, intermediate)
    "minilm": (384, 6, 12, 1536),
    "bert-base": (768, 12, 12, 3072),
    "minilm-24l": (384, 24, 12, 1536),  # MiniLM's width, 24 layers: where compile time grows with depth
    "tiny": (32, 2, 2, 64),  # the GPU record's jobs on a CPU (`gpu_run --tiny`): plumbing, not speed
}
ARCHS = ("bert", "roberta", "xlm-roberta", "gpt2", "xlnet", "electra", "albert", "distilbert", "deberta-v3",
         "modernbert", "llama")
ALBERT_EMBEDDING = 128
DEBERTA_BUCKETS = 256
"""DeBERTa-v3's position_buckets: its attention also scores 2 * 256 relative positions."""
# GPT-2 would add token_type_ids through its token embedding; DistilBERT, ModernBERT and Llama have no
# segments at all (the decoders refuse them).
NO_TOKEN_TYPES = ("gpt2", "distilbert", "modernbert", "llama")


def modernbert_intermediate(hidden: int) -> int:
    """ModernBERT-base's GeGLU width for a hidden size (1152 for 768): its Wi outputs twice this."""
    return hidden * 3 // 2


@dataclasses.dataclass(frozen=True)
class StepBench:
    size: str = "minilm"  # "minilm" (6 x 384) or "bert-base" (12 x 768)
    seq_len: int = 128
    batch: int = 16
    dtype: str = "float32"  # compute dtype; parameters stay float32
    steps: int = 5
    repeats: int = 5
    warmup: int = 2
    arch: str = "bert"  # the Hugging Face model_type ("deberta-v3": deberta-v2 as v3 sets it); its canonical head
    attention_dropout: float = 0.1
    """BERT trains with 0.1; with 0 the flaxheads train step keeps cuDNN's fused attention."""
    padding: str = "none"
    """"none": every token real; "left" or "right": rows of 1/4 to all of `seq_len` real tokens,
    padded on that side (the padding's cost: attention kernels, decoders' left padding)."""

    def hf_config(self) -> dict[str, Any]:
        if self.size not in SIZES:
            raise ValueError(f"size {self.size!r}: choose one of {sorted(SIZES)}")
        d, layers, heads, ffn = SIZES[self.size]
        common = dict(model_type=self.arch, num_labels=2)
        if self.arch in ("bert", "roberta", "xlm-roberta"):
            vocab = dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2) if self.arch == "bert" else dict(
                vocab_size=50265 if self.arch == "roberta" else 250002, max_position_embeddings=514,
                type_vocab_size=1, pad_token_id=1)
            return dict(common, **vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=ffn, hidden_act="gelu", layer_norm_eps=1e-12,
                        attention_probs_dropout_prob=self.attention_dropout)
        if self.arch == "electra":  # ELECTRA-base's layout: BERT's sizes, embeddings as wide as the hidden states
            return dict(common, vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, embedding_size=d,
                        hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
                        hidden_act="gelu", layer_norm_eps=1e-12, attention_probs_dropout_prob=self.attention_dropout)
        if self.arch == "gpt2":
            # pad id 0 never occurs in the benchmark batch (ids from 1000), so every row is full length
            return dict(common, vocab_size=50257, n_positions=1024, n_embd=d, n_layer=layers, n_head=heads,
                        n_inner=ffn, attn_pdrop=self.attention_dropout, pad_token_id=0)
        if self.arch == "xlnet":
            return dict(common, vocab_size=32000, d_model=d, n_layer=layers, n_head=heads, d_head=d // heads,
                        d_inner=ffn, ff_activation="gelu", mem_len=None)
        if self.arch == "albert":  # ALBERT's defaults: embeddings 128 wide, one group shared by every layer
            return dict(common, vocab_size=30000, embedding_size=ALBERT_EMBEDDING, hidden_size=d, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ffn, attention_probs_dropout_prob=self.attention_dropout)
        if self.arch == "distilbert":  # no token types; its head's pre_classifier stands where BERT's pooler is
            return dict(common, vocab_size=30522, max_position_embeddings=512, dim=d, n_layers=layers, n_heads=heads,
                        hidden_dim=ffn, activation="gelu", attention_dropout=self.attention_dropout)
        if self.arch == "deberta-v3":  # DeBERTa-v3's switches: shared keys, log buckets, no absolute positions
            return dict(common, model_type="deberta-v2", vocab_size=128100, hidden_size=d, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512,
                        type_vocab_size=0, relative_attention=True, position_buckets=DEBERTA_BUCKETS,
                        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type="p2c|c2p",
                        position_biased_input=False, attention_probs_dropout_prob=self.attention_dropout)
        if self.arch == "modernbert":  # ModernBERT-base's layout at these sizes: its GeGLU width, global every 3rd layer
            return dict(common, vocab_size=50368, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=modernbert_intermediate(d), attention_dropout=self.attention_dropout)
        if self.arch == "llama":  # Llama's layout at these sizes (no GQA); pad id 0 never occurs in the batch
            return dict(common, vocab_size=32000, max_position_embeddings=2048, hidden_size=d, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ffn, pad_token_id=0,
                        attention_dropout=self.attention_dropout)
        raise ValueError(f"arch {self.arch!r}: choose one of {ARCHS}")

"""Tiny random-weight models built locally, for tests and demos (no downloads).

`build_tiny_models(dest)` writes three Hugging Face model folders under `dest`:

- `tiny-llama`: a 2-layer Llama (hidden 64, 4 heads of size 32) with a locally
  trained byte-level BPE tokenizer and a Jinja chat template; vLLM serves chat
  and completions with it.
- `tiny-bert`: a 2-layer BERT (`BertModel`, mean pooling) for embeddings.
- `tiny-reranker`: a 2-layer `BertForSequenceClassification` with one label, a
  cross-encoder for score and rerank.

Weights are random but deterministic (fixed seeds). Building is idempotent: a
folder that is already complete is left alone.

CLI: ``python -m local_engine.tiny_model DEST``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 1234
_DONE = ".batchyard-tiny-model"  # marker written last: its presence means the folder is complete
_VERSION = "2"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ content }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A small, fixed corpus: the tokenizer is trained on it, so it must never change
# (the token ids, and so every test's token counts, depend on it).
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "You are a helpful assistant. Answer the question briefly.",
    "What is the capital of France? The capital of France is Paris.",
    "The capital of Brazil is Brasilia. The capital of Japan is Tokyo.",
    "Batch inference runs many requests at once on one engine.",
    "A gateway routes each request by its model to a backend.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: {} [] () <> / \\ | - _ + = * & ^ % $ # @ ! ? , . ; :",
    "system user assistant tool function message content role name",
    "Once upon a time there was a tiny model that could only say random words.",
]


@dataclass(frozen=True, slots=True)
class TinyModels:
    """Paths of the built model folders (`reranker` is None when it was not built)."""

    root: Path
    llama: Path
    bert: Path
    reranker: Path | None


def _is_built(path: Path) -> bool:
    marker = path / _DONE
    return marker.is_file() and marker.read_text().strip() == _VERSION


def _atomic_build(path: Path, build: Any) -> None:
    """Build into a temp folder beside `path`, then rename it into place."""
    if _is_built(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        build(tmp)
        (tmp / _DONE).write_text(_VERSION + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private
        if path.exists():
            shutil.rmtree(path)
        try:
            os.replace(tmp, path)
        except OSError:
            if not _is_built(path):  # lost a race to a concurrent builder that did not finish
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _corpus() -> list[str]:
    return _CORPUS * 4


def _llama_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _bert_tokenizer() -> Any:
    """A WordPiece tokenizer whose vocab is spelled out (the WordPiece trainer is not deterministic)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words: set[str] = set()
    for text in _CORPUS:
        words.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789"))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    tokens += sorted(words - set(tokens))
    tok = Tokenizer(models.WordPiece(vocab={t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def _build_llama(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _llama_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _bert_config(vocab_size: int, **extra: Any) -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32
        intermediate_size=128,
        max_position_embeddings=512,
        type_vocab_size=2,
        pad_token_id=0,
        **extra,
    )


def _build_bert(out: Path) -> None:
    import torch
    from transformers import BertModel

    tokenizer = _bert_tokenizer()
    torch.manual_seed(SEED)
    model = BertModel(_bert_config(len(tokenizer)), add_pooling_layer=False).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # sentence-transformers' pooling description: vLLM reads it to pick mean pooling + normalisation.
    (out / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ],
            indent=2,
        )
    )
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}, indent=2)
    )
    (out / "2_Normalize").mkdir()


def _build_reranker(out: Path) -> None:
    import torch
    from transformers import BertForSequenceClassification

    tokenizer = _bert_tokenizer()
    torch.manual_seed(SEED + 1)
    model = BertForSequenceClassification(_bert_config(len(tokenizer), num_labels=1)).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _build_whisper(out: Path) -> None:
    """A 1+1-layer Whisper with random weights and a locally trained BPE tokenizer carrying Whisper's
    special tokens (start of transcript, languages, tasks, no-timestamps), for the audio endpoints."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizerFast,
    )
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    special = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in LANGUAGES), "<|translate|>",
               "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=len(special) + 400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = WhisperTokenizerFast(tokenizer_object=tok, unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                     eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=448)
    eot, sot = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>"])
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=1500, max_target_positions=448, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
        decoder_start_token_id=sot, suppress_tokens=[], begin_suppress_tokens=[],
    )
    torch.manual_seed(SEED)
    WhisperForConditionalGeneration(config).eval().save_pretrained(out)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer).save_pretrained(out)


def build_tiny_whisper(dest: Path | str) -> Path:
    """Build (or reuse) the tiny Whisper under `dest` (not part of `build_tiny_models`: audio tests only)."""
    path = Path(dest).expanduser().resolve() / "tiny-whisper"
    _atomic_build(path, _build_whisper)
    return path


def build_tiny_models(dest: Path | str, *, reranker: bool = True) -> TinyModels:
    """Build (or reuse) the tiny models under `dest`; returns their paths."""
    root = Path(dest).expanduser().resolve()
    llama, bert, rerank = root / "tiny-llama", root / "tiny-bert", root / "tiny-reranker"
    _atomic_build(llama, _build_llama)
    _atomic_build(bert, _build_bert)
    if reranker:
        _atomic_build(rerank, _build_reranker)
    return TinyModels(root=root, llama=llama, bert=bert, reranker=rerank if reranker else None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build tiny random-weight models for batchyard's local engine.")
    parser.add_argument("dest", type=Path, help="folder to build the models in")
    parser.add_argument("--no-reranker", action="store_true", help="skip the cross-encoder (score/rerank) model")
    args = parser.parse_args(argv)
    models = build_tiny_models(args.dest, reranker=not args.no_reranker)
    for name in ("llama", "bert", "reranker"):
        path = getattr(models, name)
        if path is not None:
            print(f"{name}: {path}")


if __name__ == "__main__":
    main()

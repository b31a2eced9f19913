"""A tiny Llama for vLLM's CPU build, made on the machine with no model hub: 2 layers,
hidden size 64, 2 heads of 32 (vLLM's CPU attention takes head sizes 32, 64, 80, ...;
16 passes its health check and dies on the first request), random bfloat16 weights (the
dtype vLLM's CPU build runs) from a fixed seed, and a byte-level BPE tokenizer trained on the reference stack's own query text
(reference_stack/corpus.py) with a chat template. Its answers are noise; what matters
is that it streams tokens through a real engine. The same inputs give the same files.

Run with the engine's interpreter (scripts/engine.sh): python tiny_model.py OUT_DIR"""
from __future__ import annotations

import json
import pathlib
import sys

CORPUS = pathlib.Path(__file__).resolve().parents[1] / "corpus.py"
VOCAB = 512
SPECIAL = ("<|begin|>", "<|end|>", "<|pad|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|begin|>{{ m['role'] }}: {{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|begin|>assistant: {% endif %}")


def tokenizer(out: pathlib.Path) -> int:
    """Train the tokenizer on the corpus, write tokenizer.json and its config; its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
        "pad_token": SPECIAL[2], "model_max_length": 2048, "chat_template": CHAT_TEMPLATE}, indent=1) + "\n")
    return tok.get_vocab_size()


def model(out: pathlib.Path, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=True,
                         torch_dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    model(out, tokenizer(out))
    print(f"tiny Llama written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

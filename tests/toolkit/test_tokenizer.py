"""The default tokenizer shipped with the package is the one transformers converts from the model's GGUF."""

from __future__ import annotations

import pytest

from toolkit.tokenizer import load_tokenizer, render_chat, resolve_model, tokenizer_fingerprint

pytestmark = pytest.mark.clone  # the tokenizer the repository carries (toolkit/data/smollm2)

TEXTS = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
         "Ich möchte drei Äpfel, s'il vous plaît — 你好, мир! 🙂", "  leading spaces\t\tand tabs\n\n\n", ""]


def test_packaged_tokenizer_equals_the_gguf_conversion():
    pytest.importorskip("torch", reason="converting a GGUF tokenizer needs torch (the hf extra)")
    from transformers import AutoTokenizer

    src = resolve_model(None)
    converted = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
    packaged = load_tokenizer()
    assert tokenizer_fingerprint(packaged) == tokenizer_fingerprint(converted)
    for text in TEXTS:
        assert packaged.encode(text, add_special_tokens=False) == converted.encode(text, add_special_tokens=False)
    chat = [{"role": "user", "content": "How do I sort a list?"}, {"role": "assistant", "content": "sorted(xs)"}]
    assert render_chat(packaged, chat, add_generation_prompt=True) == render_chat(converted, chat,
                                                                                  add_generation_prompt=True)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(packaged, name) == getattr(converted, name), name
    assert len(packaged) == len(converted)


def test_fingerprint_tracks_the_tokenizer_definition(tokenizer):
    """Loaded another way the fingerprint is the same; truncation settings do not count; one more token does."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a separate object, from its JSON
    again = PreTrainedTokenizerFast(tokenizer_object=raw)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tokenizer)
    raw.enable_truncation(max_length=7)
    assert tokenizer_fingerprint(PreTrainedTokenizerFast(tokenizer_object=raw)) == tokenizer_fingerprint(tokenizer)
    raw.add_tokens(["<crest-test-token>"])
    assert tokenizer_fingerprint(PreTrainedTokenizerFast(tokenizer_object=raw)) != tokenizer_fingerprint(tokenizer)

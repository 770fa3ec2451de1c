"""What the parent and a served child agree on about a server: the texts its tokenizer is checked on.

`repro endpoint` (repro.plan.endpoint, before any child) and each served child (repro.engine.served, before its
first request) send these to the server's `POST /tokenize` and compare the token IDs with their own tokenizer's,
exactly: words, digits, white space, bytes beyond ASCII, and chat markers that are special tokens in some
vocabularies (a vocabulary that spells them in bytes differs only there).
"""

from __future__ import annotations

TOKENIZER_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "kvkit 0123456789 prefix caching: 3.14159, 42%, x=y+1",
    "  leading spaces\tand\ttabs\nnew lines\n\n",
    "Grüße aus Köln, 東京の天気, emoji \U0001f642",
    "<|im_start|>user\nhello<|im_end|>\n<|endoftext|><s></s>",
)

"""How a chat probe ({"messages", "length", "filler"}, repro.plan.prompts.chat_spec) becomes token IDs, in any engine
child: the model's own chat template and tokenizer, behind four calls (apply_chat_template, encode, decode), so that
vLLM's child (a Hugging Face tokenizer) and llama.cpp's (the GGUF's template and vocabulary,
repro.llamacpp.tokenizer) cut the same probe the same way. Standard library only."""

from __future__ import annotations


def build_chat_prompt(tokenizer, spec: dict) -> tuple[list[int], list[dict]]:
    """Token IDs of exactly spec['length'] tokens: chat template around a truncated filler.

    The last message's content is the filler; it is cut at token level so the templated prompt
    has the exact length the probe asks for, with whatever tokenizer the model ships.
    """
    marker = "\u2063KVKIT_FILLER\u2063"
    messages = [dict(m) for m in spec["messages"]]
    messages[-1]["content"] = messages[-1]["content"] + marker
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if text.count(marker) != 1:
        raise ValueError("chat template does not render the filler exactly once")
    pre_text, post_text = text.split(marker)
    pre = tokenizer.encode(pre_text, add_special_tokens=False)
    post = tokenizer.encode(post_text, add_special_tokens=False)
    budget = int(spec["length"]) - len(pre) - len(post)
    if budget < 0:
        raise ValueError(f"chat probe length {spec['length']} is shorter than its template ({len(pre) + len(post)})")
    repeat = 1
    filler = tokenizer.encode(spec["filler"], add_special_tokens=False)
    while len(filler) < budget:
        repeat *= 2
        filler = tokenizer.encode(" ".join([spec["filler"]] * repeat), add_special_tokens=False)
    ids = pre + filler[:budget] + post
    final = [dict(m) for m in spec["messages"]]
    final[-1]["content"] = final[-1]["content"] + tokenizer.decode(filler[:budget])
    return ids, final

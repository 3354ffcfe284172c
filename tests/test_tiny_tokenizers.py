"""Tiny tokenizers add what the real ones add (registry/tiny.yaml tokenizers): nothing
on GPT-2 and Qwen2, ``<s>`` before the text on Llama, ``</s>`` after it on Pegasus,
both on BART; a chat template where the family's instruct checkpoints ship one. Each
is checked through the checkpoint's own saved tokenizer, loaded back with
AutoTokenizer, with left and right padding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from causalab_mini.generated.tiny import TINY_TOKENIZERS
from causalab_mini.tools import tiny
from causalab_mini.tools.tiny import TinyBuildError, build_tiny, tiny_tokenizer, tokenizer_row
from causalab_mini.tools.tiny import config as tiny_cfg

pytestmark = pytest.mark.slow

# The real tokenizers' behaviour (transformers 5.24: GPT2Tokenizer and Qwen2Tokenizer
# add nothing, LlamaTokenizer prepends its BOS, PegasusTokenizer appends its EOS,
# RobertaTokenizer / BartTokenizer wrap the text in <s> ... </s>), stated here rather
# than read from the registry, so a wrong row fails.
KINDS = {
    "gpt2": (False, False),
    "qwen2": (False, False),
    "llama": (True, False),
    "pegasus": (False, True),
    "bart": (True, True),
}
TEMPLATES = {"qwen2", "llama"}
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello there!"]


def _reloaded(model_type: str, padding_side: str) -> Any:
    """The tokenizer saved in the tiny checkpoint of ``model_type``, loaded back as a
    user loads it, padding on ``padding_side``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny(model_type), padding_side=padding_side)


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("model_type", sorted(KINDS))
def test_the_saved_tokenizer_adds_what_the_real_one_adds(
    model_type: str, padding_side: str
) -> None:
    bos, eos = KINDS[model_type]
    tok = _reloaded(model_type, padding_side)
    assert tok.padding_side == padding_side
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        tiny.BOS_ID,
        tiny.EOS_ID,
        tiny.PAD_ID,
    )
    batch = tok(TEXTS, padding=True, return_special_tokens_mask=True)
    width = len(batch["input_ids"][0])
    for i, text in enumerate(TEXTS):
        plain = tok(text, add_special_tokens=False)["input_ids"]
        row = [tiny.BOS_ID] * bos + plain + [tiny.EOS_ID] * eos
        pads = width - len(row)
        assert pads >= 0
        expected = (
            [tiny.PAD_ID] * pads + row if padding_side == "left" else row + [tiny.PAD_ID] * pads
        )
        assert batch["input_ids"][i] == expected, (model_type, text)
        # the mask marks the added tokens and the pads, and never a token of the text
        added = [1] * bos + [0] * len(plain) + [1] * eos
        mask = [1] * pads + added if padding_side == "left" else added + [1] * pads
        assert batch["special_tokens_mask"][i] == mask
        attention = batch["attention_mask"][i]
        assert sum(attention) == len(row)
        assert (attention[0] == 1) == (padding_side == "right" or pads == 0)
    # the second text is the shorter: padded on the side asked for
    assert batch["attention_mask"][1][0 if padding_side == "left" else -1] == 0


@pytest.mark.parametrize("model_type", sorted(KINDS))
def test_the_built_tokenizer_reports_what_it_adds(model_type: str) -> None:
    bos, eos = KINDS[model_type]
    tok = tiny_tokenizer(model_type)
    assert (tok.add_bos_token, tok.add_eos_token) == (bos, eos)
    assert tok.padding_side == "left"
    assert (tok.chat_template is not None) == (model_type in TEMPLATES)
    ids = tok("Hello", return_special_tokens_mask=True)
    assert (ids["input_ids"][0] == tiny.BOS_ID) == bos
    assert (ids["input_ids"][-1] == tiny.EOS_ID) == eos
    assert sum(ids["special_tokens_mask"]) == bos + eos


def test_a_type_the_table_does_not_list_keeps_the_default_bos() -> None:
    assert tokenizer_row() == tokenizer_row("no_such_model_type") == ("bos", None)
    default, unlisted = tiny_tokenizer(), tiny_tokenizer("no_such_model_type")
    assert default.backend_tokenizer.to_str() == unlisted.backend_tokenizer.to_str()
    assert (default.add_bos_token, default.add_eos_token) == (True, False)
    assert default.chat_template is None
    assert default("Hello")["input_ids"][0] == tiny.BOS_ID
    # every kind keeps the same vocabulary: only which special tokens are added differs
    assert tiny_tokenizer("gpt2").get_vocab() == default.get_vocab()


def _content_tokens(tok: Any, rendered: str, content: str) -> list[int]:
    """The ids of the tokens whose characters lie inside ``content``'s one occurrence
    in ``rendered`` (offsets of the rendered text, tokenized as a template's text is)."""
    assert rendered.count(content) == 1
    start = rendered.index(content)
    end = start + len(content)
    enc = tok(rendered, add_special_tokens=False, return_offsets_mapping=True)
    return [
        i
        for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
        if start <= a and b <= end
    ]


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize(
    ("model_type", "opening", "prompt"),
    [
        ("qwen2", "<|im_start|>user\n", "<|im_start|>assistant\n"),
        (
            "llama",
            "<s><|start_header_id|>user",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
    ],
    ids=["qwen2", "llama"],
)
def test_the_saved_chat_template_renders_messages_and_the_generation_prompt(
    model_type: str, opening: str, prompt: str, padding_side: str
) -> None:
    bos, _ = KINDS[model_type]
    tok = _reloaded(model_type, padding_side)
    assert tok.chat_template is not None
    chats = [
        [{"role": "user", "content": "Where is the Eiffel Tower?"}],
        [
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Good morning."},
            {"role": "user", "content": "How are you today?"},
        ],
    ]
    rendered = [
        tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats
    ]
    for chat, text in zip(chats, rendered, strict=True):
        assert text.startswith(opening) and text.endswith(prompt)
        for message in chat:
            assert message["content"] in text
        without = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        assert text == without + prompt
    # the template's text tokenized as apply_chat_template does it: the template's own
    # BOS where the family's template writes one, and no second one
    batch = tok(rendered, add_special_tokens=False, padding=True)
    for i, chat in enumerate(chats):
        ids = [
            t for t, a in zip(batch["input_ids"][i], batch["attention_mask"][i], strict=True) if a
        ]
        assert ids.count(tiny.BOS_ID) == int(bos)
        assert (ids[0] == tiny.BOS_ID) == bos
        content = chat[-1]["content"]
        assert tok.decode(_content_tokens(tok, rendered[i], content)) == content
    side = 0 if padding_side == "left" else -1
    assert batch["attention_mask"][0][side] == 0  # the shorter chat is padded
    # what apply_chat_template itself tokenizes
    direct = tok.apply_chat_template(chats[0], add_generation_prompt=True)["input_ids"]
    assert direct == tok(rendered[0], add_special_tokens=False)["input_ids"]
    # the real tokenizers' double BOS: the rendered text tokenized with special tokens
    again = tok(rendered[0])["input_ids"]
    assert again[: 2 if bos else 1].count(tiny.BOS_ID) == 2 * int(bos)


@pytest.mark.parametrize(("spec", "bos"), [("tiny:gpt2", False), ("tiny:llama", True)])
def test_a_loaded_model_tokenizes_as_its_checkpoint_does(
    spec: str, bos: bool, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    ids = model.tokenizer("The quick brown fox")["input_ids"]
    plain = model.tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"]
    assert ids == [tiny.BOS_ID] * bos + plain


@pytest.mark.parametrize("model_type", sorted(TINY_TOKENIZERS))
def test_every_listed_tokenizer_builds_and_passes_its_own_checks(model_type: str) -> None:
    # tiny_tokenizer checks the special-tokens mask of a probe and that the template
    # renders a conversation and a generation prompt: every row of the table passes
    kind, template = tokenizer_row(model_type)
    tok = tiny_tokenizer(model_type)
    assert kind in ("none", "bos", "eos", "bos_eos")
    assert (tok.add_bos_token, tok.add_eos_token) == (
        kind in ("bos", "bos_eos"),
        kind in ("eos", "bos_eos"),
    )
    assert tok.chat_template == template


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{% for m in messages %}{{ m['content'] }}", "does not render a conversation"),
        ("{{ messages[0]['content'] }}", r"must hold every message's text \(\['Good morning"),
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "add a generation prompt"),
    ],
    ids=["unclosed", "first-message-only", "no-generation-prompt"],
)
def test_a_template_that_cannot_serve_refuses_the_build(
    template: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        tiny_cfg, "TINY_TOKENIZERS", {"toy": {"adds": "none", "chat_template": "t"}}
    )
    monkeypatch.setattr(tiny_cfg, "TINY_CHAT_TEMPLATES", {"t": template})
    with pytest.raises(TinyBuildError, match=reason) as refused:
        tiny_tokenizer("toy")
    assert "tiny 'toy'" in str(refused.value) and "registry/tiny.yaml" in str(refused.value)


# ---------------------------------------------- the rows held to transformers' classes

# model types whose tokenizer class alone decides what it adds (the class's own post-
# processor, built from a vocabulary here, no checkpoint's tokenizer config involved).
# Gemma's and OPT's checkpoints set it in their tokenizer config (the class's defaults
# add nothing) and Llama has no class of its own in the auto table, so their rows are
# held to the real checkpoints by KINDS above instead.
CLASS_DECIDES = (
    "gpt2", "gpt_neox", "qwen2", "qwen3", "bart", "roberta", "bert", "pegasus",
    "t5", "mt5", "switch_transformers",
)  # fmt: skip


def _class_tokenizer(model_type: str) -> Any:
    """``model_type``'s tokenizer class in transformers' auto table, built from a small
    vocabulary: byte-level BPE (the tiny tokenizer's own vocabulary and merges), a
    sentencepiece-style unigram list, or a wordpiece dictionary, as its constructor
    takes."""
    import inspect
    import json

    import transformers
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    name = TOKENIZER_MAPPING_NAMES[model_type]
    if isinstance(name, (tuple, list)):
        name = next(n for n in reversed(name) if n)
    cls = getattr(transformers, str(name))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    state = json.loads(tiny_tokenizer("gpt2").backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    params = inspect.signature(cls.__init__).parameters
    if "merges" in params:
        merges = [
            tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
            for m in state["model"]["merges"]
        ]
        return cls(vocab=vocab, merges=merges, **specials)
    if "cls_token" in params:  # a wordpiece vocabulary (BERT)
        return cls(vocab={**vocab, "[CLS]": len(vocab), "[SEP]": len(vocab) + 1}, **specials)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(c, -1.0) for c in "▁abcdefghijklmnopqrstuvwxyzHW,!"]
    kwargs = {"extra_ids": 0} if "extra_ids" in params else {}
    return cls(vocab=pieces, **{**specials, **kwargs})


@pytest.mark.parametrize("model_type", CLASS_DECIDES)
def test_the_row_adds_what_the_familys_tokenizer_class_adds(model_type: str) -> None:
    tok = _class_tokenizer(model_type)
    mask = tok("Hello world", return_special_tokens_mask=True)["special_tokens_mask"]
    kind = {(0, 0): "none", (1, 0): "bos", (0, 1): "eos", (1, 1): "bos_eos"}[(mask[0], mask[-1])]
    assert sum(mask) == mask[0] + mask[-1]  # added at the ends only
    assert tokenizer_row(model_type)[0] == kind, (type(tok).__name__, kind)

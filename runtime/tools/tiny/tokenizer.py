"""The tiny tokenizer: a byte-level BPE trained in-process on a fixed corpus, adding
the special tokens the model type's real tokenizer adds (registry/tiny.yaml
tokenizers) and carrying its chat template, checked to give the registry's ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from causalab_mini.generated.tiny import (
    TINY_TOKENIZER_KINDS,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast
from .config import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    MAX_POSITIONS,
    PAD,
    PAD_ID,
    RESERVED_IDS,
    UNK,
    VOCAB,
    TinyBuildError,
    first_line,
    tokenizer_row,
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A tiny model reads a short sentence and
predicts the next word. Language models learn patterns from text: words, numbers,
punctuation and spaces. When Mary and John went to the store, John gave a drink to Mary.
The Eiffel Tower is in Paris, the capital of France. Rome is the capital of Italy and
Berlin is the capital of Germany. One, two, three, four, five, six, seven, eight, nine,
ten. 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024. Hello, world! How are you today? I am fine,
thank you. The cat sat on the mat; the dog slept by the door. Attention heads move
information between positions, and the residual stream carries it from layer to layer.
Every layer adds an update. The weather is nice, so we walk in the park and talk about
science, history, music, art and mathematics. She said that he would come back later
this evening, after the meeting with the team. They were happy because the results
looked good. Good morning! Good night. Please open the window and close the door.
def add(a, b):
    return a + b
for i in range(10):
    print(i)
"""


def tiny_tokenizer(model_type: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a fixed in-code corpus (deterministic,
    at most ``VOCAB - RESERVED_IDS`` entries) with left padding, adding around a text
    what ``model_type``'s real tokenizer adds (registry/tiny.yaml tokenizers: nothing
    like GPT-2's, ``<s>`` before it like Llama's, ``</s>`` after it like Pegasus's, or
    both like BART's) and carrying its chat template where the table gives one. No
    ``model_type`` (or one the table does not list): the default kind, ``<s>``
    before the text. The tokenizer says what it adds through its own API:
    ``add_bos_token`` / ``add_eos_token``, and a special-tokens mask that marks
    exactly the added tokens (checked here on a probe text). transformers 5.24 does
    not save the two attributes: loaded back from the checkpoint, the tokenizer adds
    the same tokens (its post-processor is saved) and reports both False, so its
    special-tokens mask, not the attributes, is what to read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    kind, template = tokenizer_row(model_type)
    adds = TINY_TOKENIZER_KINDS[kind]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - RESERVED_IDS,
        min_frequency=1,
        special_tokens=[PAD, BOS, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer)
    before = [BOS] if adds["bos"] else []
    after = [EOS] if adds["eos"] else []
    single = [*before, "$A", *after]
    tok.post_processor = processors.TemplateProcessing(
        single=single,
        pair=[*single, *before, "$B:1", *after],
        special_tokens=[(t, i) for t, i in ((BOS, BOS_ID), (EOS, EOS_ID)) if t in single],
    )
    assert tok.token_to_id(PAD) == PAD_ID and tok.token_to_id(EOS) == EOS_ID
    wrapper: Any = PreTrainedTokenizerFast  # untyped constructor
    fast: PreTrainedTokenizerFast = wrapper(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        padding_side="left",
        model_max_length=MAX_POSITIONS,
        add_bos_token=adds["bos"],
        add_eos_token=adds["eos"],
        chat_template=template,
    )
    _check_tokenizer(fast, model_type, kind, len(before), len(after))
    return fast


def _check_tokenizer(
    tokenizer: Any, model_type: str | None, kind: str, before: int, after: int
) -> None:
    """The built tokenizer adds exactly the kind's tokens, and its special-tokens mask
    marks exactly those (a transformers that rebuilt the post-processor otherwise
    would give a tokenizer of another kind)."""
    probe = "Hello, world!"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    got = tokenizer(probe, return_special_tokens_mask=True)
    expected = [BOS_ID] * before + plain + [EOS_ID] * after
    mask = [1] * before + [0] * len(plain) + [1] * after
    if got["input_ids"] != expected or got["special_tokens_mask"] != mask:
        raise TinyBuildError(
            f"the tiny tokenizer of {model_type or 'the default kind'!r} should add {kind} "
            f"(registry/tiny.yaml tokenizers) and encodes {probe!r} as {got['input_ids']} "
            f"(special-tokens mask {got['special_tokens_mask']}), not {expected} ({mask})"
        )
    if tokenizer.chat_template is None:
        return
    # the template renders a conversation: each message's text, then the generation
    # prompt after what it renders without one
    chat = [
        {"role": "user", "content": "Hello, world!"},
        {"role": "assistant", "content": "Good morning."},
        {"role": "user", "content": "How are you today?"},
    ]
    try:
        bare = tokenizer.apply_chat_template(chat, tokenize=False)
        prompted = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise TinyBuildError(
            f"the chat template of tiny {model_type!r} (registry/tiny.yaml tokenizers, "
            f"chat_templates) does not render a conversation: {type(exc).__name__}: "
            f"{first_line(exc)}; fix the template"
        ) from exc
    missing = [m["content"] for m in chat if m["content"] not in bare]
    if missing or not prompted.startswith(bare) or prompted == bare:
        raise TinyBuildError(
            f"the chat template of tiny {model_type!r} (registry/tiny.yaml chat_templates) "
            f"renders {prompted!r}: it must hold every message's text ({missing} are "
            "missing) and add a generation prompt after the conversation"
        )

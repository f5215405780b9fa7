"""The tokenizer and dataset torchtitan's debug configs name, made here: its wheel ships neither.

``llama3_torchft_debugmodel`` reads ``./tests/assets/tokenizer`` (a Hugging Face
``tokenizer.json`` and ``tokenizer_config.json``) and the ``c4_test`` dataset at
``tests/assets/c4_test``, both paths of torchtitan's repository relative to where it runs.
Here both are generated, with no network, from seeded random text: a byte-level BPE
tokenizer trained on it to the debug model's 2048-token vocabulary, and the text as JSON lines.
The same seed gives the same files, so every group (and a restarted one) reads the same data.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

__all__ = ["BOS", "EOS", "VOCAB_SIZE", "ensure_assets"]

VOCAB_SIZE = 2048
"""The debug model's vocabulary (``models/llama3/__init__.py``)."""
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
NUM_DOCUMENTS = 2000
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]


def _documents(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(600)]
    return [" ".join(rng.choices(words, k=rng.randint(40, 120))) + "." for _ in range(NUM_DOCUMENTS)]


def _write_tokenizer(folder: Path, documents: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))


def ensure_assets(root: Path, seed: int = 0) -> Path:
    """``root/tests/assets/{tokenizer,c4_test}``, made once (atomically: a restarted group may
    start while another makes them); returns ``root``."""
    target = root / "tests" / "assets"
    if target.is_dir():
        return root
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".assets-", dir=target.parent))
    staging.chmod(0o755)
    documents = _documents(seed)
    (staging / "tokenizer").mkdir()
    _write_tokenizer(staging / "tokenizer", documents)
    (staging / "c4_test").mkdir()
    with open(staging / "c4_test" / "train.json", "w") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")
    try:
        os.rename(staging, target)
    except OSError:  # another process made them first
        if not target.is_dir():
            raise
    return root

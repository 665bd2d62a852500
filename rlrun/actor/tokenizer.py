"""The actor's tokenizer: `tokenizer.json` read by the `tokenizers` package, without transformers.

Importing transformers for `AutoTokenizer` takes ~5 s of CPU on a 2-core machine, most of a
restarted actor's time to its first token; `tokenizers` loads the same file in ~0.1 s. That fast
path is taken only where it tokenizes exactly as transformers does for the actor's two calls
(encode without special tokens, decode skipping them): a tokenizer class whose wrapper adds
nothing to the file's pipeline, and no `clean_up_tokenization_spaces`. Anything else loads
`AutoTokenizer`: slower to start, never different.
"""

from __future__ import annotations

import json
from pathlib import Path

# transformers classes whose encode(add_special_tokens=False) / decode(skip_special_tokens=True)
# are those of tokenizer.json's pipeline (tests/unit/test_actor_tokenizer.py checks it on the tiny model).
PLAIN_CLASSES = frozenset(
    {
        "Qwen2Tokenizer",
        "Qwen2TokenizerFast",
        "GPT2Tokenizer",
        "GPT2TokenizerFast",
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
    }
)


class JsonTokenizer:
    """A `tokenizers.Tokenizer` behind transformers' encode/decode signatures."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)


def plain_pipeline(folder: Path) -> bool:
    """True when `folder`'s tokenizer.json alone tokenizes as transformers would (see above)."""
    if not (folder / "tokenizer.json").is_file():
        return False
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False  # no config to tell the class: let transformers decide
    if not isinstance(config, dict) or config.get("clean_up_tokenization_spaces"):
        return False
    return config.get("tokenizer_class") in PLAIN_CLASSES


def load_tokenizer(model_path: str | Path):
    """The fastest loader that tokenizes exactly as transformers' AutoTokenizer does."""
    folder = Path(model_path)
    if plain_pipeline(folder):
        return JsonTokenizer(folder / "tokenizer.json")
    from transformers import AutoTokenizer  # heavy (seconds): only for tokenizers the fast path cannot match

    return AutoTokenizer.from_pretrained(str(folder))

"""A model folder's chat template, rendered without transformers (`model.chat_template=true`).

The actor turns each task prompt into the text a chat model was trained on: the prompt as one
user message, the template's generation prompt after it. transformers' `apply_chat_template`
would cost the actor seconds of import at every (re)start (see rlrun/actor/tokenizer.py); the
template is Jinja, rendered here in the sandbox and with the options transformers uses
(trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson without HTML escapes), with the
folder's special tokens as variables. tests/integration/test_real_model.py checks the result
against transformers' own on the real model.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, Sequence

from rlrun.errors import ConfigError

TEMPLATE_FILE = "chat_template.jinja"  # transformers 5 saves it beside tokenizer_config.json
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def read_template(folder: str | Path) -> tuple[str, dict[str, str]]:
    """The folder's chat template and its special tokens (chat_template.jinja, else the
    `chat_template` of tokenizer_config.json); ConfigError when it has none."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}
    specials = {key: _token_text(config.get(key)) for key in SPECIAL_TOKENS if config.get(key)}
    if (folder / TEMPLATE_FILE).is_file():
        return (folder / TEMPLATE_FILE).read_text(), specials
    template = config.get("chat_template")
    if isinstance(template, str) and template:
        return template, specials
    raise ConfigError(
        f"model.chat_template=true but the model folder {folder} has no chat template ({TEMPLATE_FILE} or "
        "tokenizer_config.json's chat_template): set model.chat_template=false to give it the prompts as they are."
    )


def _token_text(value) -> str:
    return value.get("content", "") if isinstance(value, dict) else str(value)


def chat_renderer(folder: str | Path) -> Callable[[str | Sequence[Mapping]], str]:
    """A prompt -> the text of its conversation, ready for the reply: prompt text is one user
    message; a sequence of {role, content} messages is the conversation itself."""
    render = compile_template(*read_template(folder))

    def render_prompt(prompt: str | Sequence[Mapping]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return render(messages, add_generation_prompt=True)

    return render_prompt


def compile_template(template_text: str, specials: Mapping[str, str]) -> Callable[..., str]:
    """`render(messages, add_generation_prompt, tools=None) -> text`, as transformers'
    apply_chat_template(tokenize=False) renders it; one Jinja setup for prompts and multi-turn
    observations (rlrun/task/turns.py). A TemplateError from the template propagates."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    template = env.from_string(template_text)
    specials = dict(specials)

    def render(messages: Sequence[Mapping], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=None,
            **specials,
        )

    return render

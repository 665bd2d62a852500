"""model.chat_template: the actor renders a folder's chat template without transformers, exactly as
transformers' apply_chat_template does (tests/integration/test_real_model.py: on the real model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlrun.errors import ConfigError
from rlrun.models import tiny
from rlrun.models.chat import TEMPLATE_FILE, chat_renderer, read_template

# Uses what transformers' renderer offers: loop controls, trim/lstrip of blocks, raise_exception,
# tojson without HTML escapes, the special tokens as variables, add_generation_prompt.
TEMPLATE = """{{ bos_token }}
{% for message in messages %}
  {% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}
  {% if loop.first and message['role'] != 'system' %}<|system|>Be brief & exact.{{ eos_token }}
{% endif %}
  <|{{ message['role'] }}|>{{ message['content'] | trim }}{{ eos_token }}
  {% if loop.last %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{{ {'x': '<&>'} | tojson }}{% endif %}"""


@pytest.fixture
def folder(tmp_path) -> Path:
    tokenizer = tiny.build_tokenizer(64)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("prompt", ["12+7=", "  What is 3 + 4? Answer with the number only.\n", "<eos> & {{ braces }}", ""])
def test_rendered_as_transformers_renders_it(folder, prompt):
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    assert chat_renderer(folder)(prompt) == expected
    assert expected.startswith("<bos>") and "<|assistant|>" in expected  # the template did run


def test_a_template_in_tokenizer_config_is_read_too(folder):
    (folder / TEMPLATE_FILE).unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "[{{ messages[0]['content'] }}]{% if add_generation_prompt %}>{% endif %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert chat_renderer(folder)("hi") == "[hi]>"


def test_a_folder_without_a_template_is_a_config_error_naming_the_fix(tmp_path):
    tiny.build_tokenizer(64).save_pretrained(tmp_path)
    with pytest.raises(ConfigError) as info:
        read_template(tmp_path)
    assert "no chat template" in str(info.value) and "model.chat_template=false" in str(info.value)

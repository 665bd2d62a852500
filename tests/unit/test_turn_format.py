"""Multi-turn ids (rlrun/task/turns.py): the ids sent for prompt + turns + observations decode to the
text transformers' apply_chat_template renders for the whole conversation, on SmolLM2's template
and on TRL's Qwen2.5 template (both paired with SmolLM2's ChatML tokenizer), and the sampled ids
reach the trainer untouched. The SmolLM2 folder is built once per machine (~30 s, cached)."""

from __future__ import annotations

import importlib.resources
import json
import shutil
from pathlib import Path

import pytest

from rlrun.actor.tokenizer import load_tokenizer
from rlrun.config import compose
from rlrun.models import tiny
from rlrun.models.source import model_path
from rlrun.task.turns import (
    Observation,
    ToolCall,
    chat_turn_format,
    parse_tool_calls,
    plain_turn_format,
    scan_tool_calls,
    tools_supported,
    with_tools_described,
)

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}  # fmt: skip
PROMPT = "What is 2+3? Use the tool."
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'  # as Qwen2.5 writes calls
ANSWER = "The sum is 5."


@pytest.fixture(scope="module")
def smollm2() -> Path:
    cfg, _ = compose(["recipe=smollm2_grpo"])
    return Path(model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand))


@pytest.fixture(scope="module")
def qwen2_5(smollm2, tmp_path_factory) -> Path:
    """TRL's Qwen2.5 template with SmolLM2's tokenizer: both ChatML (<|im_start|>, <|im_end|>)."""
    folder = tmp_path_factory.mktemp("qwen2_5")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2 / name, folder / name)
    template = importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja"
    (folder / "chat_template.jinja").write_text(template.read_text())
    return folder


@pytest.fixture(params=["smollm2", "qwen2_5"])
def chat(request):
    """(folder, format, tokenizer) of one ChatML template."""
    folder = request.getfixturevalue(request.param)
    tokenizer = load_tokenizer(folder)
    return folder, chat_turn_format(folder, tokenizer), tokenizer


def reference(folder: Path, messages: list[dict], tools=None) -> str:
    """What transformers renders for the whole conversation, ready for the next model turn."""
    from transformers import AutoTokenizer

    if tools and not tools_supported((folder / "chat_template.jinja").read_text()):
        messages, tools = with_tools_described(messages, tools), None
    return AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )


def play(fmt, tokenizer, prompt, script, tools=None):
    """The actor's side: each request's prompt ids, and the pieces (prompt, turn, observation, ...)."""
    pieces = [tokenizer.encode(fmt.prompt_text(prompt, tools), add_special_tokens=False)]
    sent = [pieces[0]]
    for turn, stopped, observation in script:
        pieces += [turn, fmt.observation_ids(observation, stopped)]
        sent.append(sent[-1] + turn + pieces[-1])
    return sent, pieces


def sampled(tokenizer, fmt, text: str, stopped: bool, canonical: bool = True) -> list[int]:
    """A model turn's ids as vLLM returns them. Not canonical: one token per character, as a
    model may sample them, which re-tokenizing the text would not give back."""
    ids = tokenizer.encode(text, add_special_tokens=False) if canonical else [
        i for c in text for i in tokenizer.encode(c, add_special_tokens=False)]  # fmt: skip
    return ids + list(fmt.end_of_turn_ids if stopped else ())


def two_turns(tokenizer, fmt, canonical=True):
    """A tool call answered by the tool, then an answer answered by the environment's feedback."""
    script = [
        (sampled(tokenizer, fmt, CALL, True, canonical), True, Observation("5", name="add")),
        (sampled(tokenizer, fmt, ANSWER, True, canonical), True, Observation("Correct. Now say bye.", role="user")),
    ]
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [call]},  # rendered by Qwen2.5 exactly as CALL
        {"role": "tool", "content": "5", "name": "add"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "Correct. Now say bye."},
    ]
    return script, messages


# --- (a) the delta reproduces the template ---------------------------------------------------------
def test_the_ids_sent_decode_to_the_templates_own_conversation(chat):
    folder, fmt, tokenizer = chat
    script, messages = two_turns(tokenizer, fmt)
    if not fmt.renders_tools:  # SmolLM2: the structured call is not rendered; the model's text is
        messages[1] = {"role": "assistant", "content": CALL}
    sent, pieces = play(fmt, tokenizer, PROMPT, script, tools=[ADD])
    expected = reference(folder, messages, tools=[ADD])
    assert tokenizer.decode(sent[-1]) == expected
    # special tokens bound every piece, so tokenizing the whole text at once gives the same ids
    assert tokenizer.encode(expected, add_special_tokens=False) == sent[-1]


def test_a_turn_that_ran_out_of_tokens_is_closed_by_the_observation(chat):
    folder, fmt, tokenizer = chat
    cut = sampled(tokenizer, fmt, "The sum i", stopped=False)
    observation = fmt.observation_ids(Observation("Finish your sentence.", role="user"), model_stopped=False)
    sent, _ = play(fmt, tokenizer, PROMPT, [(cut, False, Observation("Finish your sentence.", role="user"))])
    assert tokenizer.decode(observation).startswith("<|im_end|>")
    assert tokenizer.decode(sent[-1]) == reference(folder, [
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": "The sum i"},
        {"role": "user", "content": "Finish your sentence."}])  # fmt: skip


def test_observation_deltas_are_the_chatml_texts(smollm2, qwen2_5):
    """The literal texts (README-worthy): SmolLM2 renders a tool role; Qwen2.5 wraps the result in
    <tool_response> inside a user turn."""
    deltas = {}
    for folder in (smollm2, qwen2_5):
        tokenizer = load_tokenizer(folder)
        fmt = chat_turn_format(folder, tokenizer)
        deltas[folder] = tokenizer.decode(fmt.observation_ids(Observation("5", name="add"), model_stopped=True))
        assert fmt.end_of_turn_ids == tuple(tokenizer.encode("<|im_end|>", add_special_tokens=False))
    assert deltas[smollm2] == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    assert deltas[qwen2_5] == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


# --- (b) the trainer gets the sampled ids --------------------------------------------------------
def test_the_trainer_gets_the_ids_sent_never_retokenized(chat):
    folder, fmt, tokenizer = chat
    script, messages = two_turns(tokenizer, fmt, canonical=False)
    sent, pieces = play(fmt, tokenizer, PROMPT, script)
    for earlier, later in zip(sent, sent[1:]):
        assert later[: len(earlier)] == earlier  # each request extends the last one
    # the trainer's sequence is the pieces sent, the sampled turns among them as sampled
    assert sent[-1] == [i for piece in pieces for i in piece]
    assert pieces[1::2] == [turn for turn, _, _ in script]
    # the text is the same, but tokenizing it again would have changed the model's ids
    assert tokenizer.encode(tokenizer.decode(sent[-1]), add_special_tokens=False) != sent[-1]


# --- (c) tool calls ------------------------------------------------------------------------------
def test_the_call_a_qwen_model_writes_is_parsed(qwen2_5):
    tokenizer = load_tokenizer(qwen2_5)
    fmt = chat_turn_format(qwen2_5, tokenizer)
    turn = tokenizer.decode(sampled(tokenizer, fmt, CALL, stopped=True), skip_special_tokens=True)
    assert parse_tool_calls(turn) == [ToolCall("add", {"a": 2, "b": 3})]


def test_several_calls_whitespace_and_string_arguments():
    text = ('Let me add.\n<tool_call>  {"name": "add", "arguments": "{\\"a\\": 1}"}\n\n</tool_call>'
            '<tool_call>{"name":"now","arguments":{}}</tool_call>')  # fmt: skip
    assert parse_tool_calls(text) == [ToolCall("add", {"a": 1}), ToolCall("now", {})]


def test_malformed_calls_are_skipped_and_reported():
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
            '<tool_call>{"name": "ok", "arguments": {"x": [1]}}</tool_call>'
            '<tool_call>["add"]</tool_call><tool_call>{"name": "add", "arguments": 3}</tool_call>'
            '<tool_call>{"name": "cut", "argu')  # fmt: skip
    calls, errors = scan_tool_calls(text)
    assert calls == [ToolCall("ok", {"x": [1]})]
    assert [e.split(":")[0] for e in errors[:3]] == ["tool call 1", "tool call 3", "tool call 4"]
    assert "not JSON" in errors[0] and '"name"' in errors[1] and "not a JSON object" in errors[2]
    assert errors[3] == "a <tool_call> is not closed by </tool_call>"
    assert scan_tool_calls("no calls here") == ([], [])


# --- tools in the first prompt ---------------------------------------------------------------------
def test_tools_go_to_templates_that_render_them_and_into_a_system_message_otherwise(smollm2, qwen2_5):
    assert tools_supported((qwen2_5 / "chat_template.jinja").read_text())
    assert not tools_supported((smollm2 / "chat_template.jinja").read_text())
    fmt = chat_turn_format(smollm2, load_tokenizer(smollm2))
    text = fmt.prompt_text(PROMPT, [ADD])
    assert text.startswith("<|im_start|>system\nYou can call these tools")
    assert json.dumps(ADD) in text and '<tool_call>{"name": <name>, "arguments": <args-json>}</tool_call>' in text
    kept = fmt.prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}], [ADD])
    assert kept.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools") and kept.count("system") == 1
    assert fmt.prompt_text(PROMPT, None) == reference(smollm2, [{"role": "user", "content": PROMPT}])


# --- (d) truncation --------------------------------------------------------------------------------
def test_a_long_observation_is_cut_with_a_visible_note(smollm2):
    tokenizer = load_tokenizer(smollm2)
    fmt = chat_turn_format(smollm2, tokenizer)
    content = "line one of a long tool output\n" * 20
    ids = tokenizer.encode(content, add_special_tokens=False)
    assert fmt.truncate(content, 7) == (tokenizer.decode(ids[:7]) + "\n[... truncated to 7 tokens]", True)
    assert fmt.truncate(content, len(ids)) == (content, False)
    with pytest.raises(ValueError, match="max_tokens=-1"):
        fmt.truncate(content, -1)


# --- the tiny model: no chat template ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny.build_tokenizer(64).save_pretrained(folder)
    tiny._portable_tokenizer_config(folder / "tokenizer_config.json")
    return load_tokenizer(folder)


EOS_ID = tiny.SPECIAL_TOKENS.index(tiny.EOS)


def test_plain_observations_are_their_content_after_the_eos(tiny_tokenizer):
    tokenizer = tiny_tokenizer
    fmt = plain_turn_format(tokenizer, EOS_ID)
    script = [
        (tokenizer.encode("18", add_special_tokens=False) + [EOS_ID], True, Observation("wrong, try again: 12+7=", role="user")),
        (tokenizer.encode("1", add_special_tokens=False), False, Observation("(ran out)", name="x")),
    ]
    sent, pieces = play(fmt, tokenizer, "12+7=", script)
    assert tokenizer.decode(sent[-1]) == "12+7=18<eos>wrong, try again: 12+7=1<eos>(ran out)"
    assert sent[-1] == [i for piece in pieces for i in piece]
    assert fmt.end_of_turn_ids == (EOS_ID,)


def test_plain_refuses_what_the_character_vocabulary_cannot_say(tiny_tokenizer):
    fmt = plain_turn_format(tiny_tokenizer, EOS_ID)
    with pytest.raises(ValueError, match="cannot encode"):
        fmt.observation_ids(Observation("a<b\nc"), model_stopped=True)
    with pytest.raises(ValueError, match="no messages, no tools"):
        fmt.prompt_text([{"role": "user", "content": "1+1="}], None)
    with pytest.raises(ValueError, match="no messages, no tools"):
        fmt.prompt_text("1+1=", [ADD])


def test_plain_truncation_note_is_in_the_character_vocabulary(tiny_tokenizer):
    fmt = plain_turn_format(tiny_tokenizer, EOS_ID)
    text, cut = fmt.truncate("0123456789" * 5, 12)
    assert (text, cut) == ("012345678901 [... truncated to 12 tokens]", True)
    assert tiny_tokenizer.decode(fmt.observation_ids(Observation(text), model_stopped=True)) == text


# --- (e) templates without a delta are refused ----------------------------------------------------
# The assistant's <eos> is left out when a tool result follows: the result goes inside its turn.
NOT_APPEND_ONLY = (
    "{% for m in messages %}{% if m.role == 'tool' %} result: {{ m.content }}{{ eos_token }}{% else %}"
    "{{ m.role }}: {{ m.content }}"
    "{% if m.role != 'assistant' or loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ eos_token }}{% endif %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
NO_TOOL_ROLE = (
    "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('only user and assistant roles') }}{% endif %}"
    "{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
NO_END_TOKEN = "{% for m in messages %}{{ m.role }}: {{ m.content }} ;{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
OTHER_TURN_OPENING = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:: {% endif %}"
)

def tiny_chat_folder(tmp_path, template: str) -> Path:
    tokenizer = tiny.build_tokenizer(64)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_a_template_that_rewrites_the_turn_for_a_tool_result_is_refused_naming_it(tmp_path):
    folder = tiny_chat_folder(tmp_path, NOT_APPEND_ONLY)
    tokenizer = load_tokenizer(folder)
    fmt = chat_turn_format(folder, tokenizer)
    with pytest.raises(ValueError, match="not append-only for 'tool' messages") as info:
        fmt.observation_ids(Observation("5"), model_stopped=True)
    assert str(folder) in str(info.value)
    feedback = fmt.observation_ids(Observation("no", role="user"), model_stopped=True)  # users' are appended
    assert tokenizer.decode(feedback) == "user: no<eos>assistant: "


@pytest.mark.parametrize(
    "template, fragment",
    [(NO_END_TOKEN, "no special end-of-turn token"), (OTHER_TURN_OPENING, "generation prompt followed by the content")],
)
def test_templates_whose_turns_are_not_sampled_text_are_refused_when_built(tmp_path, template, fragment):
    folder = tiny_chat_folder(tmp_path, template)
    with pytest.raises(ValueError, match=fragment) as info:
        chat_turn_format(folder, load_tokenizer(folder))
    assert str(folder) in str(info.value)


def test_a_template_that_refuses_the_tool_role_says_so(tmp_path):
    folder = tiny_chat_folder(tmp_path, NO_TOOL_ROLE)
    with pytest.raises(ValueError, match="refuses a 'tool' message.*only user and assistant roles"):
        chat_turn_format(folder, load_tokenizer(folder)).observation_ids(Observation("5"), model_stopped=True)


def test_an_observation_role_other_than_tool_or_user_is_refused():
    with pytest.raises(ValueError, match="'system'"):
        Observation("x", role="system")

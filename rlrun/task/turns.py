"""Multi-turn conversations as token ids: what goes between two model turns.

The actor never re-tokenizes a conversation (the model's turns must reach the trainer as the ids it
sampled), so each request's prompt is the last one's ids + the model's turn + the ids made here for
the observation that follows it. Those ids are the chat template's own text for the observation,
taken as a "delta": what the template renders after an assistant turn's content when a tool or
user message and the next generation prompt are appended. Their concatenation is then the text the
template renders for the whole conversation (tests/unit/test_turn_format.py checks it against
transformers). Owns: the first prompt's text (tools included), the observation's ids, truncating
an observation, the `<tool_call>{json}</tool_call>` format. Refuses: templates that rewrite earlier
turns when a message is appended (there is no delta to send); sampling and the journal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from rlrun.models.chat import compile_template, read_template

ROLES = ("tool", "user")
# Stand-ins rendered once to find where the template puts the model's turn; plain words, so no
# template trims or escapes them.
USER = {"role": "user", "content": "U"}
SENTINEL = "TURNSENTINEL7f3a"
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probetool7f3a", "description": "", "parameters": {"type": "object", "properties": {}}},
}
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
CALL_FORMAT = '<tool_call>{"name": <name>, "arguments": <args-json>}</tool_call>'


@dataclass(frozen=True)
class Observation:
    """What the environment answers to a model turn."""

    content: str
    role: str = "tool"  # "tool" (a tool's result) or "user" (environment feedback)
    name: str | None = None  # the tool's name, for templates that render it

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"observation role {self.role!r}: expected one of {', '.join(ROLES)}")

    def message(self) -> dict:
        if self.role == "user":
            return {"role": "user", "content": self.content}
        return {"role": "tool", "content": self.content, **({"name": self.name} if self.name else {})}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


class TurnFormat:
    """What goes between one model's turns; built once per actor."""

    end_of_turn_ids: tuple[int, ...] = ()  # the id the model samples to end its turn (vLLM keeps it)
    note_separator = "\n"  # between a truncated content and its note

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def prompt_text(self, prompt: str | Sequence[Mapping], tools: list[dict] | None = None) -> str:
        """The first request's text: the conversation, ready for the model's first turn."""
        raise NotImplementedError

    def observation_ids(self, observation: Observation, model_stopped: bool) -> list[int]:
        """The ids to send after the model's turn: `model_stopped` when it ended the turn itself
        (its ids end with the end-of-turn token), false when it ran out of tokens (then these ids
        close its turn first)."""
        raise NotImplementedError

    def truncate(self, content: str, max_tokens: int) -> tuple[str, bool]:
        """`content` cut to its first `max_tokens` tokens, with a note saying so (the note's own
        tokens come on top), and whether it was cut."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens={max_tokens}: expected 0 or more")
        ids = self._tokenizer.encode(content, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return content, False
        kept = self._tokenizer.decode(ids[:max_tokens]).rstrip("\ufffd")  # no half of a cut character
        return f"{kept}{self.note_separator}[... truncated to {max_tokens} tokens]", True


class ChatTurnFormat(TurnFormat):
    """A chat template's format. The template must render a conversation append-only: the
    generation prompt, then the sampled content, then the end-of-turn token, then whatever an
    appended message adds; anything else raises a ValueError naming the template. The delta is
    measured after one user message and one model turn: it holds for templates that render a
    message from itself and the message before it, as ChatML templates do."""

    def __init__(self, render: Callable[..., str], tokenizer, name: str) -> None:
        super().__init__(tokenizer)
        self._render, self.name = render, name
        turn = render([USER, {"role": "assistant", "content": SENTINEL}], add_generation_prompt=False)
        start = turn.find(SENTINEL)
        if start < 0 or turn[:start] != render([USER], add_generation_prompt=True):
            raise ValueError(
                f"chat template {name} does not render an assistant turn as its generation prompt followed by the "
                "content: the model's sampled turns would not be the template's text. Use another template."
            )
        self._content_end = start + len(SENTINEL)
        # The end-of-turn token is the special token right after the content (`<|im_end|>` in ChatML).
        after = tokenizer.encode(turn[self._content_end :], add_special_tokens=False)[:1]
        end = tokenizer.decode(after) if after and tokenizer.decode(after, skip_special_tokens=True) == "" else ""
        if not end or not turn.startswith(end, self._content_end):
            raise ValueError(
                f"chat template {name} puts no special end-of-turn token right after an assistant turn's content: "
                "a model that ends its turn could not end it as the template does. Use another template."
            )
        self.end_of_turn_ids = tuple(after)
        self._turn = turn[: self._content_end + len(end)]  # what the sampled ids stand for, on a stop
        self.renders_tools = _renders_tools(render)

    def prompt_text(self, prompt: str | Sequence[Mapping], tools: list[dict] | None = None) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if tools and not self.renders_tools:
            messages, tools = with_tools_described(messages, tools), None
        return self._render(messages, add_generation_prompt=True, tools=tools)

    def observation_ids(self, observation: Observation, model_stopped: bool) -> list[int]:
        import jinja2

        messages = [USER, {"role": "assistant", "content": SENTINEL}, observation.message()]
        try:
            text = self._render(messages, add_generation_prompt=True)
        except jinja2.TemplateError as exc:
            role = observation.role
            raise ValueError(
                f"chat template {self.name} refuses a {role!r} message after the model's turn: {exc}"
            ) from None
        if not text.startswith(self._turn):
            raise ValueError(
                f"chat template {self.name} is not append-only for {observation.role!r} messages: appending one changes "
                "how the model's turn before it is rendered, so the ids already sent would not be the conversation's. "
                "Use another template or another observation role."
            )
        start = len(self._turn) if model_stopped else self._content_end
        return self._tokenizer.encode(text[start:], add_special_tokens=False)


class PlainTurnFormat(TurnFormat):
    """No chat template (the tiny demo model): the prompt as it is; an observation is its content
    alone, separated from the model's turn by the EOS token and followed by nothing, so that a
    character vocabulary without '<', '>' or newline can encode it."""

    note_separator = " "

    def __init__(self, tokenizer, eos_id: int) -> None:
        super().__init__(tokenizer)
        self.end_of_turn_ids = (eos_id,)

    def prompt_text(self, prompt: str | Sequence[Mapping], tools: list[dict] | None = None) -> str:
        if not isinstance(prompt, str) or tools:
            raise ValueError("a model without a chat template takes prompt text only: no messages, no tools")
        return prompt

    def observation_ids(self, observation: Observation, model_stopped: bool) -> list[int]:
        ids = self._tokenizer.encode(observation.content, add_special_tokens=False)
        if self._tokenizer.decode(ids) != observation.content:  # a character vocabulary drops what it lacks
            raise ValueError(f"the model's vocabulary cannot encode the observation {observation.content!r}")
        return ids if model_stopped else [*self.end_of_turn_ids, *ids]


def chat_turn_format(folder: str | Path, tokenizer) -> ChatTurnFormat:
    """The format of the model folder's chat template (ConfigError when it has none)."""
    return ChatTurnFormat(compile_template(*read_template(folder)), tokenizer, name=str(folder))


def plain_turn_format(tokenizer, eos_id: int) -> PlainTurnFormat:
    return PlainTurnFormat(tokenizer, eos_id)


def tools_supported(template: str) -> bool:
    """Whether a chat template's text renders the `tools` it is given."""
    return _renders_tools(compile_template(template, {}))


def _renders_tools(render: Callable[..., str]) -> bool:
    import jinja2

    try:
        return "probetool7f3a" in render([USER], add_generation_prompt=True, tools=[PROBE_TOOL])
    except jinja2.TemplateError:
        return False


def with_tools_described(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tools described in the system message, for templates that ignore
    `tools`: the schemas and the call format parse_tool_calls reads."""
    text = (
        "You can call these tools (JSON schemas):\n"
        + "\n".join(json.dumps(tool) for tool in tools)
        + f"\n\nTo call one, write {CALL_FORMAT}"
    )
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in a model's turn that can be read (scan_tool_calls says why others cannot)."""
    return scan_tool_calls(text)[0]


def scan_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """The calls in a model's turn, in order, and one message per `<tool_call>` that could not be
    read, for the environment to tell the model."""
    calls, errors = [], []
    for number, match in enumerate(TOOL_CALL.finditer(text), 1):
        try:
            calls.append(_tool_call(match.group(1)))
        except ValueError as exc:
            errors.append(f"tool call {number}: {exc}; expected {CALL_FORMAT}")
    if "<tool_call>" in TOOL_CALL.sub("", text):
        errors.append("a <tool_call> is not closed by </tool_call>")
    return calls, errors


def _tool_call(body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ValueError('not a JSON object with a "name"')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError(f'the "arguments" string of {value["name"]!r} is not JSON') from None
    if not isinstance(arguments, dict):
        raise ValueError(f'the "arguments" of {value["name"]!r} are not a JSON object')
    return ToolCall(value["name"], arguments)

"""The official `anthropic` package against flashseek serve."""

import anthropic
import pytest

from conftest import KEY, MODEL, URL

USER = [{"role": "user", "content": "Write one sentence about mountains."}]
TOOLS = [{
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
TOOL_CONVERSATION = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 degrees, sunny"}]},
]


def test_messages_plain_and_usage(claude):
    m = claude.messages.create(model=MODEL, max_tokens=8, messages=USER, system="Be brief.",
                               extra_body={"ignore_eos": True, "seed": 5})
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text"
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 8
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 5


def test_messages_stream_matches_plain(claude):
    kw = dict(model=MODEL, max_tokens=10, messages=USER, extra_body={"ignore_eos": True, "seed": 9, "temperature": 0.8})
    plain = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == plain.content[0].text
    assert final.content[0].text == text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 10


def test_thinking_blocks(claude):
    kw = dict(model=MODEL, max_tokens=6, messages=USER, thinking={"type": "enabled", "budget_tokens": 1024},
              extra_body={"ignore_eos": True, "seed": 1})
    m = claude.messages.create(**kw)
    assert m.content[0].type == "thinking"
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking"
    assert final.content[0].thinking == m.content[0].thinking


def test_tool_conversation_and_count_tokens(claude):
    m = claude.messages.create(model=MODEL, max_tokens=5, messages=TOOL_CONVERSATION, tools=TOOLS)
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    n = claude.messages.count_tokens(model=MODEL, messages=TOOL_CONVERSATION, tools=TOOLS)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    n0 = claude.messages.count_tokens(model=MODEL, messages=TOOL_CONVERSATION)
    assert n0.input_tokens < n.input_tokens


def test_stop_sequences(claude):
    m = claude.messages.create(model=MODEL, max_tokens=40, messages=USER, stop_sequences=["e", "a"],
                               extra_body={"ignore_eos": True, "seed": 2})
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence in ("e", "a")
    text = m.content[0].text
    assert "e" not in text and "a" not in text


def test_errors(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=0, messages=USER)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[])
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "system", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-unknown", max_tokens=5, messages=USER)
    bad = anthropic.Anthropic(base_url=URL, api_key=KEY + "-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=MODEL, max_tokens=5, messages=USER)

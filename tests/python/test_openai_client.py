"""The official `openai` package against flashseek serve."""

import json

import openai
import pytest

from conftest import KEY, MODEL, URL

USER = [{"role": "user", "content": "Write one sentence about the sea."}]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
    ]},
    {"role": "tool", "tool_call_id": "call_abc", "content": "18 degrees, sunny"},
]


def test_models(oai):
    ids = [m.id for m in oai.models.list()]
    assert ids == [MODEL]


def test_chat_plain_and_usage(oai):
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, seed=7, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    timings = r.usage.model_extra["timings"]
    assert timings["prefill_ms"] > 0 and timings["decode_ms"] > 0


def test_chat_stream_matches_plain(oai):
    kw = dict(model=MODEL, messages=USER, max_tokens=10, seed=3, temperature=0.9, extra_body={"ignore_eos": True})
    plain = oai.chat.completions.create(**kw)
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


def test_thinking_gives_reasoning_content(oai):
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, seed=1,
                                    extra_body={"thinking": {"type": "enabled"}, "ignore_eos": True})
    assert isinstance(r.choices[0].message.model_extra.get("reasoning_content"), str)
    r2 = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, seed=1, reasoning_effort="high",
                                     extra_body={"ignore_eos": True})
    assert r2.choices[0].message.model_extra.get("reasoning_content") == r.choices[0].message.model_extra.get("reasoning_content")
    # Streamed reasoning arrives as reasoning_content deltas.
    chunks = list(oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, seed=1, stream=True,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": True}, "ignore_eos": True}))
    streamed = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for ch in chunks if ch.choices)
    assert streamed == r.choices[0].message.model_extra["reasoning_content"]


def test_tool_conversation(oai):
    r = oai.chat.completions.create(model=MODEL, messages=TOOL_CONVERSATION, tools=TOOLS, max_tokens=6, seed=2)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The tools block is rendered: the prompt is longer than without tools.
    r2 = oai.chat.completions.create(model=MODEL, messages=TOOL_CONVERSATION, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert r.usage.prompt_tokens > r2.usage.prompt_tokens
    chunks = list(oai.chat.completions.create(model=MODEL, messages=TOOL_CONVERSATION, tools=TOOLS, max_tokens=4, stream=True))
    assert chunks[-1].choices[0].finish_reason is not None


def test_logprobs_and_stop(oai):
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, seed=4, logprobs=True, top_logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs.content
    assert len(lp) == 4
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lp)
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=30, seed=4, stop=["e", "a"],
                                    extra_body={"ignore_eos": True})
    assert "e" not in r.choices[0].message.content and "a" not in r.choices[0].message.content


def test_completions(oai):
    r = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, seed=1, logprobs=2,
                               extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == 5
    assert len(r.choices[0].logprobs.tokens) == 5
    text = "".join(ch.choices[0].text for ch in oai.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, seed=1, stream=True, extra_body={"ignore_eos": True})
        if ch.choices)
    assert text == r.choices[0].text


def test_errors(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=0)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=[], max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=[{"role": "narrator", "content": "x"}], max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, n=2)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, temperature=5)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=10**7)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=3)
    bad = openai.OpenAI(base_url=URL + "/v1", api_key=KEY + "-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=MODEL, prompt="x", max_tokens=-1)

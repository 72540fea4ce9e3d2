"""Conformance with the official `openai` Python SDK against the `pagewise` binary.

Run by .ci/run: PAGEWISE_BIN=<binary> PAGEWISE_SMOLLM2_GGUF=<gguf> python -m pytest tests/openai_sdk
Servers: the tiny Qwen2 fixture (with a ChatML template and API keys) and SmolLM2 (its own template).
On the GPU machines (scripts/gpu/tp.sh) PAGEWISE_SDK_TINY names another tiny model (GPU kernels
need head dims of 64 or more) and PAGEWISE_SDK_SERVE_ARGS adds flags to every server (e.g.
`--tensor-parallel-size 2`).
"""

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import openai
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("PAGEWISE_BIN", os.path.join(ROOT, "target", "debug", "pagewise"))
TINY = os.environ.get("PAGEWISE_SDK_TINY", os.path.join(ROOT, "tests", "fixtures", "qwen2-bias"))
EXTRA = os.environ.get("PAGEWISE_SDK_SERVE_ARGS", "").split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
KEY = "sk-test-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([BIN, "serve", *args, *EXTRA, "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError("server did not become ready: " + self.proc.stderr.read().decode()[-2000:])

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tiny():
    server = Server(TINY, "--served-model-name", "tiny", "--api-key", KEY, "--chat-template", CHATML)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(tiny):
    return openai.OpenAI(base_url=tiny.url + "/v1", api_key=KEY, max_retries=0)


def test_chat_and_completions(client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=5, temperature=0)
    assert chat.object == "chat.completion"
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens <= 5
    comp = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert comp.object == "text_completion"
    assert comp.usage.completion_tokens == 4
    assert comp.choices[0].finish_reason == "length"
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_streaming_with_usage(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].finish_reason is None for c in chunks[:5])
    assert chunks[5].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert text == plain.choices[0].message.content


def test_n_logprobs_seed_and_max_completion_tokens(client):
    comp = client.completions.create(model="tiny", prompt="abc", n=3, max_tokens=3, seed=5, logprobs=2)
    assert sorted(c.index for c in comp.choices) == [0, 1, 2]
    assert len(comp.choices[0].logprobs.top_logprobs[0]) == 2
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                          max_tokens=3, logprobs=True, top_logprobs=2, temperature=0)
    lp = chat.choices[0].logprobs.content[0]
    assert lp.logprob <= 0 and len(lp.top_logprobs) == 2
    a = client.completions.create(model="tiny", prompt="abc", max_tokens=8, seed=42, temperature=1.0)
    b = client.completions.create(model="tiny", prompt="abc", max_tokens=8, seed=42, temperature=1.0)
    assert a.choices[0].text == b.choices[0].text
    c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 3


def test_stop_strings(client):
    full = client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[4:6]
    assert stop
    cut = client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[:full.index(stop)]


def test_errors_map_to_sdk_exceptions(tiny, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", temperature=-1)
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x" * 300, max_tokens=10)
    assert "maximum context length is 256 tokens" in e.value.message
    anonymous = openai.OpenAI(base_url=tiny.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()


def test_flood_of_cancelled_streams_frees_every_block(tiny):
    async def flood():
        aclient = openai.AsyncOpenAI(base_url=tiny.url + "/v1", api_key=KEY, max_retries=0)

        async def one():
            stream = await aclient.completions.create(model="tiny", prompt="flood", max_tokens=200, stream=True,
                                                      extra_body={"ignore_eos": True})
            async for _ in stream:
                pass

        tasks = [asyncio.create_task(one()) for _ in range(200)]
        await asyncio.sleep(0.5)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await aclient.close()

    asyncio.run(flood())
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key=KEY, max_retries=0, timeout=5)
    start = time.time()
    client.completions.create(model="tiny", prompt="after", max_tokens=4)
    assert time.time() - start < 5
    deadline = time.time() + 10
    while 'vllm:kv_cache_usage_perc{model_name="tiny",engine="0"} 0\n' not in tiny.metrics():
        assert time.time() < deadline, tiny.metrics()
        time.sleep(0.1)
    assert 'vllm:num_requests_running{model_name="tiny",engine="0"} 0\n' in tiny.metrics()


def test_sigterm_drains_in_flight_requests():
    server = Server(TINY, "--served-model-name", "tiny", "--chat-template", CHATML, "--shutdown-timeout", "20")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    result = {}

    def long_request():
        result["r"] = client.completions.create(model="tiny", prompt="drain", max_tokens=200,
                                                extra_body={"ignore_eos": True})

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    t.join(timeout=30)
    assert result["r"].usage.completion_tokens == 200, "the in-flight request completes"
    assert server.proc.wait(timeout=30) == 0


@pytest.mark.skipif(not os.environ.get("PAGEWISE_SMOLLM2_GGUF"), reason="SmolLM2 not fetched")
def test_smollm2_answers_paris():
    server = Server(os.environ["PAGEWISE_SMOLLM2_GGUF"], "--served-model-name", "smollm2", "--max-model-len", "1024")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        chat = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=20,
            messages=[{"role": "system", "content": "You are a helpful assistant."},
                      {"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in chat.choices[0].message.content
    finally:
        server.stop()


# Structured outputs and tool calls through the SDK on SmolLM2: a small model, but a constraint
# makes its output valid whatever it would have said.

@pytest.fixture(scope="module")
def smollm2():
    if not os.environ.get("PAGEWISE_SMOLLM2_GGUF"):
        pytest.skip("SmolLM2 not fetched")
    server = Server(os.environ["PAGEWISE_SMOLLM2_GGUF"], "--served-model-name", "smollm2", "--max-model-len", "1024")
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    server.stop()


def ask(content):
    return [{"role": "user", "content": content}]


def test_parse_with_a_pydantic_model(smollm2):
    from typing import Literal

    import pydantic

    class Cat(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        age: int
        mood: Literal["happy", "sleepy", "grumpy"]

    done = smollm2.chat.completions.parse(model="smollm2", temperature=0, max_tokens=80, response_format=Cat,
                                          messages=ask("Describe a cat as JSON."))
    cat = done.choices[0].message.parsed
    assert isinstance(cat, Cat), done
    assert cat.mood in ("happy", "sleepy", "grumpy")


def test_json_object_regex_and_choice(smollm2):
    import json
    import re

    out = smollm2.chat.completions.create(model="smollm2", temperature=0, max_tokens=200,
                                          response_format={"type": "json_object"},
                                          messages=ask("Give me a JSON object describing a cat with name and age."))
    assert out.choices[0].finish_reason == "stop", out
    assert isinstance(json.loads(out.choices[0].message.content), dict)
    rx = r"[A-Z][a-z]{2,8}, [0-9]{4}"
    out = smollm2.chat.completions.create(model="smollm2", temperature=0.7, seed=1, max_tokens=30,
                                          messages=ask("A city and a year?"),
                                          extra_body={"structured_outputs": {"regex": rx}})
    assert re.fullmatch(rx, out.choices[0].message.content), out
    choices = ["positive", "negative", "neutral"]
    out = smollm2.completions.create(model="smollm2", prompt="The movie was great! Sentiment:", max_tokens=10,
                                     extra_body={"guided_choice": choices})
    assert out.choices[0].text in choices


def test_bad_schemas_are_400s(smollm2):
    with pytest.raises(openai.BadRequestError) as e:
        smollm2.chat.completions.create(model="smollm2", max_tokens=5, messages=ask("Hi"),
                                        response_format={"type": "json_schema", "json_schema": {
                                            "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}})
    assert "nope" in str(e.value)


def test_named_and_streamed_tool_calls(smollm2):
    import json

    import pydantic

    class GetWeather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=30)
        unit: str = pydantic.Field(pattern="^(celsius|fahrenheit)$")

    tools = [openai.pydantic_function_tool(GetWeather)]
    named = {"type": "function", "function": {"name": "GetWeather"}}
    kwargs = dict(model="smollm2", temperature=0, max_tokens=60, tools=tools, tool_choice=named,
                  messages=ask("What is the weather in Paris?"))
    out = smollm2.chat.completions.create(**kwargs)
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "GetWeather"
    GetWeather.model_validate_json(call.function.arguments)
    with smollm2.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert streamed.function.name == call.function.name
    assert json.loads(streamed.function.arguments) == json.loads(call.function.arguments)
    assert isinstance(streamed.function.parsed_arguments, GetWeather)

    required = smollm2.chat.completions.create(**{**kwargs, "tool_choice": "required"})
    assert required.choices[0].finish_reason == "tool_calls"
    for c in required.choices[0].message.tool_calls:
        GetWeather.model_validate_json(c.function.arguments)


def test_strict_schemas_and_tools_name_every_key(smollm2):
    """The report of issue 57: a strict schema without `additionalProperties` (as hand-written
    schemas and some client libraries send them) got invented keys; a strict tool too."""
    import json

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["name", "country"]}
    out = smollm2.chat.completions.create(
        model="smollm2", temperature=0.8, seed=3, n=4, max_tokens=80, messages=ask("Describe Paris as JSON."),
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    for c in out.choices:
        assert c.finish_reason == "stop", c
        assert set(json.loads(c.message.content)) == {"name", "country"}, c
    tool = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
    out = smollm2.chat.completions.create(model="smollm2", temperature=0.8, seed=3, n=4, max_tokens=80,
                                          messages=ask("Weather in Paris?"), tools=[tool], tool_choice="required")
    for c in out.choices:
        for call in c.message.tool_calls:
            assert set(json.loads(call.function.arguments)) <= {"city", "unit"}, call


# The Responses API through the SDK's own calls: create, stream, parse, retrieve, delete, and a
# conversation continued with previous_response_id.

def test_responses_create_retrieve_and_continue(client):
    first = client.responses.create(model="tiny", input="Hello", instructions="Be brief.", max_output_tokens=8,
                                    temperature=0)
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.output_text and first.usage.output_tokens == 8
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(model="tiny", previous_response_id=first.id, max_output_tokens=8,
                                     input=[{"role": "user", "content": [{"type": "input_text", "text": "More"}]}])
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 8
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input="x", previous_response_id=first.id)


def test_responses_stream_events(client):
    import json

    # Cut by max_output_tokens: the stream ends with response.incomplete, as OpenAI's does.
    with client.responses.stream(model="tiny", input="Hello", max_output_tokens=8, temperature=0) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete"
    whole = client.responses.create(model="tiny", input="Hello", max_output_tokens=8, temperature=0)
    assert events[-1].response.output_text == whole.output_text
    # A constrained answer completes: the SDK's final response.
    fmt = {"format": {"type": "json_schema", "name": "pick", "strict": True,
                      "schema": {"type": "object", "properties": {"pick": {"enum": ["a", "b"]}},
                                 "required": ["pick"]}}}
    with client.responses.stream(model="tiny", input="Pick", text=fmt, max_output_tokens=30) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and json.loads(final.output_text)["pick"] in ("a", "b")


def test_responses_parse_and_function_tools(smollm2):
    import json

    import pydantic

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        country: str = pydantic.Field(max_length=20)

    out = smollm2.responses.parse(model="smollm2", input="Describe Paris as JSON.", text_format=City,
                                  temperature=0, max_output_tokens=80)
    assert isinstance(out.output_parsed, City), out
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                             "required": ["city"], "additionalProperties": False}}]
    out = smollm2.responses.create(model="smollm2", input="Weather in Paris?", tools=tools, tool_choice="required",
                                   parallel_tool_calls=False, temperature=0, max_output_tokens=60)
    calls = [item for item in out.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", out
    assert set(json.loads(calls[0].arguments)) == {"city"}
    follow = smollm2.responses.create(model="smollm2", previous_response_id=out.id, max_output_tokens=30,
                                      input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                              "output": "Sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete") and follow.output_text

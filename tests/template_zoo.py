"""Verbatim chat templates of popular open model families, for tests.

Each ``*_TEMPLATE`` constant is the exact ``chat_template`` string a model's tokenizer_config.json (or
chat_template.json / chat_template.jinja) ships, copied byte for byte from a public source named in the
comment above it (with the sha256 of its UTF-8 bytes). The strings are written as JSON-style escaped
literals split at template line ends, so every character (newlines, quotes, backslashes, the
full-width DeepSeek markers) is exact; do not reformat them.

- ``ZOO``: family label -> template.
- ``SPECIALS``: family label -> the special-token strings the template text itself emits (each one
  occurs literally in the template). ``bos_token``/``eos_token`` are not repeated there unless the
  template also writes them literally; see ``BOS``/``EOS``.
- ``BOS`` / ``EOS``: the bos_token / eos_token strings of the model's tokenizer_config.json, to be passed
  to the template as ``bos_token`` / ``eos_token`` (``""`` where the config has ``null``).

Render them the way transformers does: ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])`` with globals ``raise_exception`` and
``strftime_now`` and a ``tojson`` filter that keeps non-ASCII (``ensure_ascii=False``).
"""

from __future__ import annotations

# meta-llama/Llama-3.1-8B-Instruct (= Meta-Llama-3.1-8B-Instruct), tokenizer_config.json chat_template.
# Source: ggml-org/llama.cpp models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja (written there by
# scripts/get_chat_template.py, commit 8b576b6c5, never edited since; read from the mirrors
# Raudbjorn/ggml-llama.cpp and ye-NX/llama.cpp). Byte-identical to huggingface/huggingface.js
# packages/jinja/test/e2e.test.js "meta-llama/Llama-3.1-8B-Instruct" and to the llama3-instruct entry of
# ollama/ollama template/index.json.
# sha256 e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65, 4614 characters.
LLAMA3_1_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if custom_tools is defined %}\n"
    "    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n"
    "    {%- set tools_in_user_message = true %}\n"
    "{%- endif %}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- System message + builtin tools #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with JSON "
    "for a function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
    "and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n"
    "    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    "        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user "
    "message!\") }}\n"
    "{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
    "and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "    {{- first_user_message + \"<|eot_id|>\"}}\n"
    "{%- endif %}\n"
    "\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
    "        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- endif %}\n"
    "                {%- endfor %}\n"
    "            {{- \")\" }}\n"
    "        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- \"}\" }}\n"
    "        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n"
    "            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n"
    "            {{- \"<|eot_id|>\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n"
    "        {%- else %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)


# meta-llama/Meta-Llama-3-8B-Instruct, tokenizer_config.json chat_template.
# Source: ollama/ollama template/index.json (entry named "llama3-instruct", the short one). Byte-identical
# to the chat_template in YJiangcm/WebR Meta-Llama-3-8B-Instruct/tokenizer_config.json.
# EOS: Meta changed eos_token from <|end_of_text|> to <|eot_id|> on 2024-05-10 (see
# axolotl-ai-cloud/axolotl#1553); the current tokenizer_config says <|eot_id|>.
# sha256 ba03a121d097859c7b5b9cd03af99aafe95275210d2876f642ad9929a150f122, 389 characters.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n"
    "\n"
    "'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "' }}{% endif %}"
)


# Qwen/Qwen2.5-7B-Instruct, tokenizer_config.json chat_template (tools + default "You are Qwen..." system).
# Source: ggml-org/llama.cpp models/templates/Qwen-Qwen2.5-7B-Instruct.jinja (get_chat_template.py output).
# Byte-identical to huggingface/huggingface.js e2e.test.js "Qwen/Qwen2.5-7B-Instruct" and to
# microsoft/onnxruntime-extensions test/data/qwen2.5/tokenizer_config.json.
# BOS: tokenizer_config has "bos_token": null; the template never reads bos_token, "" stands in here.
# sha256 cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f, 2507 characters.
QWEN2_5_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou "
    "are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


# Qwen/Qwen3-0.6B tokenizer_config.json chat_template (the hybrid-thinking template shared by the Qwen3
# dense releases, Qwen3-8B included; <think> blocks, enable_thinking).
# Source: ggml-org/llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja (get_chat_template.py output, commit
# e121edc43). Byte-identical to huggingface/huggingface.js e2e.test.js "Qwen/Qwen3-0.6B".
# BOS: tokenizer_config has "bos_token": null; the template never reads bos_token, "" stands in here.
# sha256 87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5, 4116 characters.
QWEN3_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) "
    "%}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split("
    "'<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}"
)


# google/gemma-3-*-it chat_template (chat_template.json / tokenizer_config.json).
# Source: microsoft/onnxruntime-extensions test/data/gemma-3-chat/chat_template.json. Byte-identical to
# test/data/models/gemma-3/tokenizer_config.json there and to the gemma3-instruct entry of
# ollama/ollama template/index.json.
# sha256 7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4, 1532 characters.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n"
    "\n"
    "' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n"
    "\n"
    "' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n"
    "' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n"
    "' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n"
    "'}}\n"
    "{%- endif -%}\n"
)


# google/gemma-2-2b-it tokenizer_config.json chat_template. Kept OUT of ZOO/SPECIALS/BOS/EOS on purpose:
# it raises 'System role not supported' for a leading system message, so it does not render every
# conversation the ZOO entries must (bos_token <bos>, eos_token <eos>; emits <start_of_turn>, <end_of_turn>).
# Source: ggml-org/llama.cpp models/templates/google-gemma-2-2b-it.jinja (get_chat_template.py output).
# sha256 ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6, 591 characters.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n"
    "' + message['content'] | trim + '<end_of_turn>\n"
    "' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n"
    "'}}{% endif %}"
)


# mistralai/Mistral-Nemo-Instruct-2407 tokenizer_config.json chat_template ([INST], [AVAILABLE_TOOLS],
# [TOOL_CALLS], [TOOL_RESULTS]; the system message is folded into the last user turn).
# Source: ggml-org/llama.cpp models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja (get_chat_template.py
# output, Jan 2025; huggingface.js e2e.test.js holds an older revision of the same model's template).
# sha256 e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272, 3945 characters.
MISTRAL_TEMPLATE = (
    "{%- if messages[0][\"role\"] == \"system\" %}\n"
    "    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n"
    "\n"
    "{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n"
    "{%- set ns = namespace() %}\n"
    "{%- set ns.index = 0 %}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.tool_calls is "
    "defined and message.tool_calls is not none)) %}\n"
    "        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n"
    "            {{- raise_exception(\"After the optional system message, conversation roles must "
    "alternate user/assistant/user/assistant/...\") }}\n"
    "        {%- endif %}\n"
    "        {%- set ns.index = ns.index + 1 %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if tools is not none and (message == user_messages[-1]) %}\n"
    "            {{- \"[AVAILABLE_TOOLS][\" }}\n"
    "            {%- for tool in tools %}\n"
    "                {%- set tool = tool.function %}\n"
    "                {{- '{\"type\": \"function\", \"function\": {' }}\n"
    "                {%- for key, val in tool.items() if key != \"return\" %}\n"
    "                    {%- if val is string %}\n"
    "                        {{- '\"' + key + '\": \"' + val + '\"' }}\n"
    "                    {%- else %}\n"
    "                        {{- '\"' + key + '\": ' + val|tojson }}\n"
    "                    {%- endif %}\n"
    "                    {%- if not loop.last %}\n"
    "                        {{- \", \" }}\n"
    "                    {%- endif %}\n"
    "                {%- endfor %}\n"
    "                {{- \"}}\" }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- else %}\n"
    "                    {{- \"]\" }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "            {{- \"[/AVAILABLE_TOOLS]\" }}\n"
    "            {%- endif %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n"
    "            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n"
    "        {{- \"[TOOL_CALLS][\" }}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- set out = tool_call.function|tojson %}\n"
    "            {{- out[:-1] }}\n"
    "            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n"
    "                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") "
    "}}\n"
    "            {%- endif %}\n"
    "            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n"
    "            {%- if not loop.last %}\n"
    "                {{- \", \" }}\n"
    "            {%- else %}\n"
    "                {{- \"]\" + eos_token }}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n"
    "        {{- message[\"content\"] + eos_token}}\n"
    "    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n"
    "        {%- if message.content is defined and message.content.content is defined %}\n"
    "            {%- set content = message.content.content %}\n"
    "        {%- else %}\n"
    "            {%- set content = message.content %}\n"
    "        {%- endif %}\n"
    "        {{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}\n"
    "        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n"
    "            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n"
    "        {%- endif %}\n"
    "        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!\") }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
)


# microsoft/Phi-3.5-mini-instruct tokenizer_config.json chat_template.
# Source: ggml-org/llama.cpp models/templates/microsoft-Phi-3.5-mini-instruct.jinja (get_chat_template.py
# output). BOS/EOS as in Phi-3(.5)-mini's tokenizer_config (cf. microsoft/onnxruntime-extensions
# test/data/phi-3-mini/tokenizer_config.json).
# sha256 78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90, 430 characters.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% elif message['role'] == 'user' %}{{'<|user|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n"
    "' }}{% else %}{{ eos_token }}{% endif %}"
)


# microsoft/phi-4 tokenizer_config.json chat_template (<|im_start|>role<|im_sep|>...<|im_end|>).
# Source: microsoft/onnxruntime-extensions test/data/phi-4-base/tokenizer_config.json (chat_template,
# bos_token, eos_token).
# sha256 fe4120415a3858b873955c92ce3a103a95bc97c2cb00b72e62659aaf0f891ee5, 462 characters.
PHI4_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}"
    "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'user') %}"
    "{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'assistant') %}"
    "{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)


# deepseek-ai/DeepSeek-R1-Distill-Qwen-32B tokenizer_config.json chat_template (the R1 family template:
# <｜User｜>/<｜Assistant｜> markers, generation prompt opens <think>).
# Source: ggml-org/llama.cpp models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja as written by
# get_chat_template.py in commit c7f460ab8 (read from the mirror ye-NX/llama.cpp). NOTE: llama.cpp later
# hand-edited that file (commits 566059a26, 5e54d51b1); the current upstream file is NOT the HF template.
# BOS/EOS from Evilcarbon/DeepSeek-R1-Distill-Qwen-32B tokenizer_config.json (an HF mirror whose older
# template revision differs only in ending with '<｜Assistant｜>' instead of '<｜Assistant｜><think>\n').
# sha256 56a1447ad31926fdc21fb07e56e5642bd9c850c4f52d8c8af7bbe5f079a84f5f, 2090 characters.
DEEPSEEK_R1_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}"
    "{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is none %}"
    "{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
    "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + "
    "'<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}"
    "{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + "
    "'```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}"
    "{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}"
    "{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)


# openai/gpt-oss chat_template.jinja (harmony format; "You are ChatGPT, a large language model trained by
# OpenAI."; gpt-oss-20b and gpt-oss-120b ship the same template).
# Source: ggml-org/llama.cpp models/templates/openai-gpt-oss-120b.jinja (commit b204a5a23, Aug 2025; the
# post-release revision; microsoft/onnxruntime-extensions test/data/gpt-oss/chat_template.jinja holds the
# launch-day revision). Uses strftime_now(). BOS/EOS: gpt-oss tokenizer_config.json
# (bos <|startoftext|>, eos <|return|>, pad <|endoftext|>).
# sha256 a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146, 16714 characters.
GPT_OSS_TEMPLATE = (
    "{#-\n"
    "  In addition to the normal inputs of `messages` and `tools`, this template also accepts the\n"
    "  following kwargs:\n"
    "  - \"builtin_tools\": A list, can contain \"browser\" and/or \"python\".\n"
    "  - \"model_identity\": A string that optionally describes the model identity.\n"
    "  - \"reasoning_effort\": A string that describes the reasoning effort, defaults to \"medium\".\n"
    " #}\n"
    "\n"
    "{#- Tool Definition Rendering ============================================== #}\n"
    "{%- macro render_typescript_type(param_spec, required_params, is_nullable=false) -%}\n"
    "    {%- if param_spec.type == \"array\" -%}\n"
    "        {%- if param_spec['items'] -%}\n"
    "            {%- if param_spec['items']['type'] == \"string\" -%}\n"
    "                {{- \"string[]\" }}\n"
    "            {%- elif param_spec['items']['type'] == \"number\" -%}\n"
    "                {{- \"number[]\" }}\n"
    "            {%- elif param_spec['items']['type'] == \"integer\" -%}\n"
    "                {{- \"number[]\" }}\n"
    "            {%- elif param_spec['items']['type'] == \"boolean\" -%}\n"
    "                {{- \"boolean[]\" }}\n"
    "            {%- else -%}\n"
    "                {%- set inner_type = render_typescript_type(param_spec['items'], required_params) "
    "-%}\n"
    "                {%- if inner_type == \"object | object\" or inner_type|length > 50 -%}\n"
    "                    {{- \"any[]\" }}\n"
    "                {%- else -%}\n"
    "                    {{- inner_type + \"[]\" }}\n"
    "                {%- endif -%}\n"
    "            {%- endif -%}\n"
    "            {%- if param_spec.nullable -%}\n"
    "                {{- \" | null\" }}\n"
    "            {%- endif -%}\n"
    "        {%- else -%}\n"
    "            {{- \"any[]\" }}\n"
    "            {%- if param_spec.nullable -%}\n"
    "                {{- \" | null\" }}\n"
    "            {%- endif -%}\n"
    "        {%- endif -%}\n"
    "    {%- elif param_spec.type is defined and param_spec.type is iterable and param_spec.type is not "
    "string and param_spec.type is not mapping and param_spec.type[0] is defined -%}\n"
    "        {#- Handle array of types like [\"object\", \"object\"] from Union[dict, list] #}\n"
    "        {%- if param_spec.type | length > 1 -%}\n"
    "            {{- param_spec.type | join(\" | \") }}\n"
    "        {%- else -%}\n"
    "            {{- param_spec.type[0] }}\n"
    "        {%- endif -%}\n"
    "    {%- elif param_spec.oneOf -%}\n"
    "        {#- Handle oneOf schemas - check for complex unions and fallback to any #}\n"
    "        {%- set has_object_variants = false -%}\n"
    "        {%- for variant in param_spec.oneOf -%}\n"
    "            {%- if variant.type == \"object\" -%}\n"
    "                {%- set has_object_variants = true -%}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "        {%- if has_object_variants and param_spec.oneOf|length > 1 -%}\n"
    "            {{- \"any\" }}\n"
    "        {%- else -%}\n"
    "            {%- for variant in param_spec.oneOf -%}\n"
    "                {{- render_typescript_type(variant, required_params) -}}\n"
    "                {%- if variant.description %}\n"
    "                    {{- \"// \" + variant.description }}\n"
    "                {%- endif -%}\n"
    "                {%- if variant.default is defined %}\n"
    "                    {{ \"// default: \" + variant.default|tojson }}\n"
    "                {%- endif -%}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \" | \" }}\n"
    "                {% endif -%}\n"
    "            {%- endfor -%}\n"
    "        {%- endif -%}\n"
    "    {%- elif param_spec.type == \"string\" -%}\n"
    "        {%- if param_spec.enum -%}\n"
    "            {{- '\"' + param_spec.enum|join('\" | \"') + '\"' -}}\n"
    "        {%- else -%}\n"
    "            {{- \"string\" }}\n"
    "            {%- if param_spec.nullable %}\n"
    "                {{- \" | null\" }}\n"
    "            {%- endif -%}\n"
    "        {%- endif -%}\n"
    "    {%- elif param_spec.type == \"number\" -%}\n"
    "        {{- \"number\" }}\n"
    "    {%- elif param_spec.type == \"integer\" -%}\n"
    "        {{- \"number\" }}\n"
    "    {%- elif param_spec.type == \"boolean\" -%}\n"
    "        {{- \"boolean\" }}\n"
    "\n"
    "    {%- elif param_spec.type == \"object\" -%}\n"
    "        {%- if param_spec.properties -%}\n"
    "            {{- \"{\\n\" }}\n"
    "            {%- for prop_name, prop_spec in param_spec.properties.items() -%}\n"
    "                {{- prop_name -}}\n"
    "                {%- if prop_name not in (param_spec.required or []) -%}\n"
    "                    {{- \"?\" }}\n"
    "                {%- endif -%}\n"
    "                {{- \": \" }}\n"
    "                {{ render_typescript_type(prop_spec, param_spec.required or []) }}\n"
    "                {%- if not loop.last -%}\n"
    "                    {{-\", \" }}\n"
    "                {%- endif -%}\n"
    "            {%- endfor -%}\n"
    "            {{- \"}\" }}\n"
    "        {%- else -%}\n"
    "            {{- \"object\" }}\n"
    "        {%- endif -%}\n"
    "    {%- else -%}\n"
    "        {{- \"any\" }}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "\n"
    "{%- macro render_tool_namespace(namespace_name, tools) -%}\n"
    "    {{- \"## \" + namespace_name + \"\\n\\n\" }}\n"
    "    {{- \"namespace \" + namespace_name + \" {\\n\\n\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {%- set tool = tool.function %}\n"
    "        {{- \"// \" + tool.description + \"\\n\" }}\n"
    "        {{- \"type \"+ tool.name + \" = \" }}\n"
    "        {%- if tool.parameters and tool.parameters.properties %}\n"
    "            {{- \"(_: {\\n\" }}\n"
    "            {%- for param_name, param_spec in tool.parameters.properties.items() %}\n"
    "                {%- if param_spec.description %}\n"
    "                    {{- \"// \" + param_spec.description + \"\\n\" }}\n"
    "                {%- endif %}\n"
    "                {{- param_name }}\n"
    "                {%- if param_name not in (tool.parameters.required or []) -%}\n"
    "                    {{- \"?\" }}\n"
    "                {%- endif -%}\n"
    "                {{- \": \" }}\n"
    "                {{- render_typescript_type(param_spec, tool.parameters.required or []) }}\n"
    "                {%- if param_spec.default is defined -%}\n"
    "                    {%- if param_spec.enum %}\n"
    "                        {{- \", // default: \" + param_spec.default }}\n"
    "                    {%- elif param_spec.oneOf %}\n"
    "                        {{- \"// default: \" + param_spec.default }}\n"
    "                    {%- else %}\n"
    "                        {{- \", // default: \" + param_spec.default|tojson }}\n"
    "                    {%- endif -%}\n"
    "                {%- endif -%}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \",\\n\" }}\n"
    "                {%- else %}\n"
    "                    {{- \",\\n\" }}\n"
    "                {%- endif -%}\n"
    "            {%- endfor %}\n"
    "            {{- \"}) => any;\\n\\n\" }}\n"
    "        {%- else -%}\n"
    "            {{- \"() => any;\\n\\n\" }}\n"
    "        {%- endif -%}\n"
    "    {%- endfor %}\n"
    "    {{- \"} // namespace \" + namespace_name }}\n"
    "{%- endmacro -%}\n"
    "\n"
    "{%- macro render_builtin_tools(browser_tool, python_tool) -%}\n"
    "    {%- if browser_tool %}\n"
    "        {{- \"## browser\\n\\n\" }}\n"
    "        {{- \"// Tool for browsing.\\n\" }}\n"
    "        {{- \"// The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\\n\" }}\n"
    "        {{- \"// Cite information from the tool using the following format:\\n\" }}\n"
    "        {{- \"// `【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or "
    "`【8†L3】`.\\n\" }}\n"
    "        {{- \"// Do not quote more than 10 words directly from the tool output.\\n\" }}\n"
    "        {{- \"// sources=web (default: web)\\n\" }}\n"
    "        {{- \"namespace browser {\\n\\n\" }}\n"
    "        {{- \"// Searches for information related to `query` and displays `topn` results.\\n\" }}\n"
    "        {{- \"type search = (_: {\\n\" }}\n"
    "        {{- \"query: string,\\n\" }}\n"
    "        {{- \"topn?: number, // default: 10\\n\" }}\n"
    "        {{- \"source?: string,\\n\" }}\n"
    "        {{- \"}) => any;\\n\\n\" }}\n"
    "        {{- \"// Opens the link `id` from the page indicated by `cursor` starting at line number "
    "`loc`, showing `num_lines` lines.\\n\" }}\n"
    "        {{- \"// Valid link ids are displayed with the formatting: `【{id}†.*】`.\\n\" }}\n"
    "        {{- \"// If `cursor` is not provided, the most recent page is implied.\\n\" }}\n"
    "        {{- \"// If `id` is a string, it is treated as a fully qualified URL associated with "
    "`source`.\\n\" }}\n"
    "        {{- \"// If `loc` is not provided, the viewport will be positioned at the beginning of the "
    "document or centered on the most relevant passage, if available.\\n\" }}\n"
    "        {{- \"// Use this function without `id` to scroll to a new location of an opened page.\\n\" }}\n"
    "        {{- \"type open = (_: {\\n\" }}\n"
    "        {{- \"id?: number | string, // default: -1\\n\" }}\n"
    "        {{- \"cursor?: number, // default: -1\\n\" }}\n"
    "        {{- \"loc?: number, // default: -1\\n\" }}\n"
    "        {{- \"num_lines?: number, // default: -1\\n\" }}\n"
    "        {{- \"view_source?: boolean, // default: false\\n\" }}\n"
    "        {{- \"source?: string,\\n\" }}\n"
    "        {{- \"}) => any;\\n\\n\" }}\n"
    "        {{- \"// Finds exact matches of `pattern` in the current page, or the page given by "
    "`cursor`.\\n\" }}\n"
    "        {{- \"type find = (_: {\\n\" }}\n"
    "        {{- \"pattern: string,\\n\" }}\n"
    "        {{- \"cursor?: number, // default: -1\\n\" }}\n"
    "        {{- \"}) => any;\\n\\n\" }}\n"
    "        {{- \"} // namespace browser\\n\\n\" }}\n"
    "    {%- endif -%}\n"
    "\n"
    "    {%- if python_tool %}\n"
    "        {{- \"## python\\n\\n\" }}\n"
    "        {{- \"Use this tool to execute Python code in your chain of thought. The code will not be "
    "shown to the user. This tool should be used for internal reasoning, but not for code that is "
    "intended to be visible to the user (e.g. when creating plots, tables, or files).\\n\\n\" }}\n"
    "        {{- \"When you send a message containing Python code to python, it will be executed in a "
    "stateful Jupyter notebook environment. python will respond with the output of the execution or time "
    "out after 120.0 seconds. The drive at '/mnt/data' can be used to save and persist user files. "
    "Internet access for this session is UNKNOWN. Depends on the cluster.\\n\\n\" }}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "\n"
    "{#- System Message Construction ============================================ #}\n"
    "{%- macro build_system_message() -%}\n"
    "    {%- if model_identity is not defined %}\n"
    "        {%- set model_identity = \"You are ChatGPT, a large language model trained by OpenAI.\" %}\n"
    "    {%- endif %}\n"
    "    {{- model_identity + \"\\n\" }}\n"
    "    {{- \"Knowledge cutoff: 2024-06\\n\" }}\n"
    "    {{- \"Current date: \" + strftime_now(\"%Y-%m-%d\") + \"\\n\\n\" }}\n"
    "    {%- if reasoning_effort is not defined %}\n"
    "        {%- set reasoning_effort = \"medium\" %}\n"
    "    {%- endif %}\n"
    "    {{- \"Reasoning: \" + reasoning_effort + \"\\n\\n\" }}\n"
    "    {%- if builtin_tools %}\n"
    "        {{- \"# Tools\\n\\n\" }}\n"
    "        {%- set available_builtin_tools = namespace(browser=false, python=false) %}\n"
    "        {%- for tool in builtin_tools %}\n"
    "            {%- if tool == \"browser\" %}\n"
    "                {%- set available_builtin_tools.browser = true %}\n"
    "            {%- elif tool == \"python\" %}\n"
    "                {%- set available_builtin_tools.python = true %}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "        {{- render_builtin_tools(available_builtin_tools.browser, available_builtin_tools.python) }}"
    "\n"
    "    {%- endif -%}\n"
    "    {{- \"# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.\" }}\n"
    "    {%- if tools -%}\n"
    "        {{- \"\\nCalls to these tools must go to the commentary channel: 'functions'.\" }}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "\n"
    "{#- Main Template Logic ================================================= #}\n"
    "{#- Set defaults #}\n"
    "\n"
    "{#- Render system message #}\n"
    "{{- \"<|start|>system<|message|>\" }}\n"
    "{{- build_system_message() }}\n"
    "{{- \"<|end|>\" }}\n"
    "\n"
    "{#- Extract developer message #}\n"
    "{%- if messages[0].role == \"developer\" or messages[0].role == \"system\" %}\n"
    "    {%- set developer_message = messages[0].content %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set developer_message = \"\" %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- Render developer message #}\n"
    "{%- if developer_message or tools %}\n"
    "    {{- \"<|start|>developer<|message|>\" }}\n"
    "    {%- if developer_message %}\n"
    "        {{- \"# Instructions\\n\\n\" }}\n"
    "        {{- developer_message }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endif %}\n"
    "    {%- if tools -%}\n"
    "        {{- \"# Tools\\n\\n\" }}\n"
    "        {{- render_tool_namespace(\"functions\", tools) }}\n"
    "    {%- endif -%}\n"
    "    {{- \"<|end|>\" }}\n"
    "{%- endif %}\n"
    "\n"
    "{#- Render messages #}\n"
    "{%- set last_tool_call = namespace(name=none) %}\n"
    "{%- for message in loop_messages -%}\n"
    "    {#- At this point only assistant/user/tool messages should remain #}\n"
    "    {%- if message.role == 'assistant' -%}\n"
    "        {#- Checks to ensure the messages are being passed in the format we expect #}\n"
    "        {%- if \"content\" in message %}\n"
    "            {%- if \"<|channel|>analysis<|message|>\" in message.content or "
    "\"<|channel|>final<|message|>\" in message.content %}\n"
    "                {{- raise_exception(\"You have passed a message containing <|channel|> tags in the "
    "content field. Instead of doing this, you should pass analysis messages (the string between "
    "'<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string between "
    "'<|message|>' and '<|end|>') in the 'content' field.\") }}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if \"thinking\" in message %}\n"
    "            {%- if \"<|channel|>analysis<|message|>\" in message.thinking or "
    "\"<|channel|>final<|message|>\" in message.thinking %}\n"
    "                {{- raise_exception(\"You have passed a message containing <|channel|> tags in the "
    "thinking field. Instead of doing this, you should pass analysis messages (the string between "
    "'<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string between "
    "'<|message|>' and '<|end|>') in the 'content' field.\") }}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if \"tool_calls\" in message %}\n"
    "            {#- We need very careful handling here - we want to drop the tool call analysis message "
    "if the model #}\n"
    "            {#- has output a later <|final|> message, but otherwise we want to retain it. This is "
    "the only case #}\n"
    "            {#- when we render CoT/analysis messages in inference. #}\n"
    "            {%- set future_final_message = namespace(found=false) %}\n"
    "            {%- for future_message in loop_messages[loop.index:] %}\n"
    "                {%- if future_message.role == 'assistant' and \"tool_calls\" not in future_message %}\n"
    "                    {%- set future_final_message.found = true %}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "            {#- We assume max 1 tool call per message, and so we infer the tool call name #}\n"
    "            {#- in \"tool\" messages from the most recent assistant tool call name #}\n"
    "            {%- set tool_call = message.tool_calls[0] %}\n"
    "            {%- if tool_call.function %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {%- if message.content and message.thinking %}\n"
    "                {{- raise_exception(\"Cannot pass both content and thinking in an assistant message "
    "with tool calls! Put the analysis message in one or the other, but not both.\") }}\n"
    "            {%- elif message.content and not future_final_message.found %}\n"
    "                {{- \"<|start|>assistant<|channel|>analysis<|message|>\" + message.content + "
    "\"<|end|>\" }}\n"
    "            {%- elif message.thinking and not future_final_message.found %}\n"
    "                {{- \"<|start|>assistant<|channel|>analysis<|message|>\" + message.thinking + "
    "\"<|end|>\" }}\n"
    "            {%- endif %}\n"
    "            {{- \"<|start|>assistant to=\" }}\n"
    "            {{- \"functions.\" + tool_call.name + \"<|channel|>commentary \" }}\n"
    "            {{- (tool_call.content_type if tool_call.content_type is defined else \"json\") + "
    "\"<|message|>\" }}\n"
    "            {{- tool_call.arguments|tojson }}\n"
    "            {{- \"<|call|>\" }}\n"
    "            {%- set last_tool_call.name = tool_call.name %}\n"
    "        {%- elif loop.last and not add_generation_prompt %}\n"
    "            {#- Only render the CoT if the final turn is an assistant turn and "
    "add_generation_prompt is false #}\n"
    "            {#- This is a situation that should only occur in training, never in inference. #}\n"
    "            {%- if \"thinking\" in message %}\n"
    "                {{- \"<|start|>assistant<|channel|>analysis<|message|>\" + message.thinking + "
    "\"<|end|>\" }}\n"
    "            {%- endif %}\n"
    "            {#- <|return|> indicates the end of generation, but <|end|> does not #}\n"
    "            {#- <|return|> should never be an input to the model, but we include it as the final "
    "token #}\n"
    "            {#- when training, so the model learns to emit it. #}\n"
    "            {{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|return|>\" }}\n"
    "        {%- else %}\n"
    "            {#- CoT is dropped during all previous turns, so we never render it for inference #}\n"
    "            {{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}\n"
    "            {%- set last_tool_call.name = none %}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == 'tool' -%}\n"
    "        {%- if last_tool_call.name is none %}\n"
    "            {{- raise_exception(\"Message has tool role, but there was no previous assistant message "
    "with a tool call!\") }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|start|>functions.\" + last_tool_call.name }}\n"
    "        {{- \" to=assistant<|channel|>commentary<|message|>\" + message.content|tojson + \"<|end|>\" }}\n"
    "    {%- elif message.role == 'user' -%}\n"
    "        {{- \"<|start|>user<|message|>\" + message.content + \"<|end|>\" }}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "\n"
    "{#- Generation prompt #}\n"
    "{%- if add_generation_prompt -%}\n"
    "<|start|>assistant\n"
    "{%- endif -%}"
)


# HuggingFaceTB/SmolLM2-135M-Instruct tokenizer_config.json chat_template (ChatML with a default SmolLM
# system prompt). No vendored copy of the file was found; the string below is the one several public
# test suites assert verbatim against that tokenizer_config.json / its GGUF tokenizer.chat_template (e.g.
# javanhut/GoTransformers chat TestChatMLMatchesSmolLM2Template, and a Rust test that loads
# SmolLM2-135M-Instruct/tokenizer_config.json and also asserts bos <|im_start|>, eos <|im_end|>).
# sha256 872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788, 368 characters.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}"
)


ZOO: dict[str, str] = {
    "llama3.1": LLAMA3_1_TEMPLATE,
    "llama3": LLAMA3_TEMPLATE,
    "qwen2.5": QWEN2_5_TEMPLATE,
    "qwen3": QWEN3_TEMPLATE,
    "gemma3": GEMMA3_TEMPLATE,
    "mistral": MISTRAL_TEMPLATE,
    "phi3": PHI3_TEMPLATE,
    "phi4": PHI4_TEMPLATE,
    "deepseek-r1": DEEPSEEK_R1_TEMPLATE,
    "gpt-oss": GPT_OSS_TEMPLATE,
    "smollm2": SMOLLM2_TEMPLATE,
}

#: family label -> a Hub repository that ships the template (the vetted baselines name it)
REPOS: dict[str, str] = {
    "llama3.1": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3": "meta-llama/Meta-Llama-3-8B-Instruct",
    "qwen2.5": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3": "Qwen/Qwen3-0.6B",
    "gemma3": "google/gemma-3-4b-it",
    "mistral": "mistralai/Mistral-Nemo-Instruct-2407",
    "phi3": "microsoft/Phi-3.5-mini-instruct",
    "phi4": "microsoft/phi-4",
    "deepseek-r1": "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "gpt-oss": "openai/gpt-oss-20b",
    "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
}

SPECIALS: dict[str, tuple[str, ...]] = {
    "llama3.1": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "qwen2.5": ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
    "qwen3": (
        "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
        "</tool_response>",
    ),
    "gemma3": ("<start_of_turn>", "<end_of_turn>", "<start_of_image>"),
    "mistral": (
        "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    ),
    "phi3": ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
    "phi4": ("<|im_start|>", "<|im_sep|>", "<|im_end|>"),
    "deepseek-r1": (
        "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>", "<｜tool▁outputs▁end｜>",
    ),
    "gpt-oss": ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
}

BOS: dict[str, str] = {
    "llama3.1": "<|begin_of_text|>",
    "llama3": "<|begin_of_text|>",
    "qwen2.5": "",
    "qwen3": "",
    "gemma3": "<bos>",
    "mistral": "<s>",
    "phi3": "<s>",
    "phi4": "<|endoftext|>",
    "deepseek-r1": "<｜begin▁of▁sentence｜>",
    "gpt-oss": "<|startoftext|>",
    "smollm2": "<|im_start|>",
}

EOS: dict[str, str] = {
    "llama3.1": "<|eot_id|>",
    "llama3": "<|eot_id|>",
    "qwen2.5": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "gemma3": "<eos>",
    "mistral": "</s>",
    "phi3": "<|endoftext|>",
    "phi4": "<|im_end|>",
    "deepseek-r1": "<｜end▁of▁sentence｜>",
    "gpt-oss": "<|return|>",
    "smollm2": "<|im_end|>",
}

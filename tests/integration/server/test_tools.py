"""Tool calls end to end with the official openai client: real chat templates (Llama 3.1,
Qwen 2.5, Mistral Nemo, Hermes 2 Pro) served with `--chat-template-file`, a tool_choice that
the grammar enforces (so even the tiny test model writes a valid call), the call parsed into
`tool_calls` (whole and streamed as deltas, the same), the tool's result sent back through the
template, and an answer with tool_choice "auto"; unknown functions and unenforceable choices
are 400s."""
import json
import os
import unittest

import openai

from server_harness import STORIES, Server

TEMPLATES = os.path.join(os.environ.get("FLASHDLLM_SHARED") or
                         os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared"),
                         "chat-templates", "templates")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name", "enum": ["Paris", "Oslo"]},
                                      "days": {"type": "integer", "description": "Days ahead", "minimum": 0,
                                               "maximum": 9}},
                       "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time now",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def is_json(text):
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def streamed_calls(stream):
    """Content and tool calls accumulated from chat chunks the way OpenAI clients do."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    call["id"] = tc.id
                if tc.function and tc.function.name:
                    call["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            finish = ch.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


class ToolsThroughTemplates(unittest.TestCase):
    def round_trip(self, template, tool_choice, id_length=None):
        with Server("--chat-template-file", os.path.join(TEMPLATES, template), model=STORIES) as s:
            c = s.openai()
            args = dict(model="x", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, temperature=0,
                        max_tokens=200)
            r = c.chat.completions.create(**args)
            choice = r.choices[0]
            calls = choice.message.tool_calls
            self.assertTrue(calls, (template, choice))
            for call in calls:
                self.assertEqual(call.type, "function")
                self.assertIn(call.function.name, ("get_weather", "get_time"))
                arguments = json.loads(call.function.arguments)  # a JSON string of the arguments object
                self.assertIsInstance(arguments, dict)
                if call.function.name == "get_weather":
                    self.assertIn(arguments["city"], ("Paris", "Oslo"))
                if id_length:
                    self.assertEqual(len(call.id), id_length, call.id)
                    self.assertTrue(call.id.isalnum(), call.id)
                else:
                    self.assertTrue(call.id.startswith("call_"), call.id)
            if choice.finish_reason == "tool_calls":
                self.assertIsNone(choice.message.content)
            else:  # "required" lets the model add calls until max_tokens; the complete ones stand
                self.assertEqual(choice.finish_reason, "length")
            if isinstance(tool_choice, dict):
                self.assertEqual([c.function.name for c in calls], [tool_choice["function"]["name"]])
                self.assertEqual(choice.finish_reason, "tool_calls")

            # Streamed: the same calls as deltas (ids are fresh per response). A call cut off by
            # max_tokens was already begun in the stream: it stays there with partial arguments,
            # while the whole response leaves it out; both give its text as content.
            content, streamed, finish = streamed_calls(c.chat.completions.create(stream=True, **args))
            if finish == "length":
                streamed = [x for x in streamed if is_json(x["arguments"])]
            self.assertEqual([(x["name"], x["arguments"]) for x in streamed],
                             [(x.function.name, x.function.arguments) for x in calls])
            self.assertTrue(all(x["id"] for x in streamed))
            self.assertEqual(finish, choice.finish_reason)
            self.assertEqual(content, choice.message.content or "")

            # The calls and their results go back through the template; the answer is free.
            messages = QUESTION + [
                {"role": "assistant", "content": None,
                 "tool_calls": [x.model_dump(exclude_none=True) for x in calls[:1]]},
                {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temp_c": 18})},
            ]
            answer = c.chat.completions.create(model="x", messages=messages, tools=TOOLS, tool_choice="auto",
                                               temperature=0, max_tokens=16)
            self.assertIn(answer.choices[0].finish_reason, ("stop", "length", "tool_calls"))
            m = answer.choices[0].message
            self.assertTrue(m.content is not None or m.tool_calls)
            _, _, finish = streamed_calls(c.chat.completions.create(
                model="x", messages=messages, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=16,
                stream=True))
            self.assertEqual(finish, answer.choices[0].finish_reason)

            # Unknown function → 400 naming it.
            with self.assertRaises(openai.BadRequestError) as e:
                c.chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, max_tokens=4,
                                          tool_choice={"type": "function", "function": {"name": "nope"}})
            self.assertIn("nope", str(e.exception))
            self.assertEqual(e.exception.body["param"], "tool_choice")

    def test_llama_3_1_named(self):
        self.round_trip("meta-llama-Llama-3.1-8B-Instruct.jinja",
                        {"type": "function", "function": {"name": "get_weather"}})

    def test_qwen_2_5_required(self):
        self.round_trip("Qwen-Qwen2.5-7B-Instruct.jinja", "required")

    def test_qwen_2_5_named(self):
        self.round_trip("Qwen-Qwen2.5-7B-Instruct.jinja", {"type": "function", "function": {"name": "get_weather"}})

    def test_mistral_nemo_named(self):  # its template accepts only 9-character ids
        self.round_trip("mistralai-Mistral-Nemo-Instruct-2407.jinja",
                        {"type": "function", "function": {"name": "get_weather"}}, id_length=9)

    def test_hermes_2_pro_named(self):
        self.round_trip("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
                        {"type": "function", "function": {"name": "get_time"}})

    def test_hermes_2_pro_none_gives_the_template_its_tools_and_a_text_reply(self):
        # This template fails a tool turn without tools: "none" still passes them, as vLLM does.
        with Server("--chat-template-file", os.path.join(TEMPLATES, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"),
                    model=STORIES) as s:
            r = s.openai().chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, tool_choice="none",
                                                   temperature=0, max_tokens=8)
            self.assertIsNone(r.choices[0].message.tool_calls)
            self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
            self.assertIsNotNone(r.choices[0].message.content)

    def test_qwen_2_5_required_without_parallel_calls_is_one_call(self):
        with Server("--chat-template-file", os.path.join(TEMPLATES, "Qwen-Qwen2.5-7B-Instruct.jinja"),
                    model=STORIES) as s:
            c = s.openai()
            args = dict(model="x", messages=QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                        temperature=0, max_tokens=200)
            choice = c.chat.completions.create(**args).choices[0]
            self.assertEqual(len(choice.message.tool_calls), 1, choice)
            self.assertEqual(choice.finish_reason, "tool_calls")
            _, streamed, finish = streamed_calls(c.chat.completions.create(stream=True, **args))
            self.assertEqual([(x["name"], x["arguments"]) for x in streamed],
                             [(x.function.name, x.function.arguments) for x in choice.message.tool_calls])
            self.assertEqual(finish, "tool_calls")
            with self.assertRaises(openai.BadRequestError) as e:
                c.chat.completions.create(**{**args, "extra_body": {"parallel_tool_calls": "no"}, "parallel_tool_calls": openai.NOT_GIVEN})
            self.assertEqual(e.exception.body["param"], "parallel_tool_calls")


class ToolChoiceRefusals(unittest.TestCase):
    def test_unenforceable_choices_are_400(self):
        # Gemma 2's template has no tool-call syntax: "auto" leaves replies as text, while
        # "required" cannot be enforced.
        with Server("--chat-template-file", os.path.join(TEMPLATES, "google-gemma-2-2b-it.jinja")) as s:
            c = s.openai()
            for choice, param in (("required", "tool_choice"), ("sometimes", "tool_choice")):
                with self.assertRaises(openai.BadRequestError) as e:
                    c.chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, tool_choice=choice,
                                              max_tokens=2)
                self.assertEqual(e.exception.body["param"], param, e.exception.body)
            with self.assertRaises(openai.BadRequestError) as e:  # required without tools
                c.chat.completions.create(model="x", messages=QUESTION, tool_choice="required", max_tokens=2)
            self.assertEqual(e.exception.body["param"], "tool_choice")
            r = c.chat.completions.create(model="x", messages=QUESTION, tools=TOOLS, max_tokens=4)
            self.assertIsNone(r.choices[0].message.tool_calls)

    def test_bad_and_repeated_tool_names_are_400(self):
        # Names follow OpenAI's rule (plus '.' and ':'), so that an enforced call always parses
        # back as a call; two tools of one name are refused.
        def tool(name):
            return {"type": "function", "function": {"name": name}}
        with Server("--chat-template-file", os.path.join(TEMPLATES, "Qwen-Qwen2.5-7B-Instruct.jinja")) as s:
            c = s.openai()
            for tools, message in (([tool("get time")], "'tools[0].function.name' must be 1 to 64 characters"),
                                   ([tool("get_time"), tool("wetter_\u00fc")], "'tools[1].function.name' must be"),
                                   ([tool("x" * 65)], "'tools[0].function.name' must be"),
                                   ([tool("f"), tool("f")], "repeats the name 'f' of tools[0]")):
                with self.assertRaises(openai.BadRequestError) as e:
                    c.chat.completions.create(model="x", messages=QUESTION, tools=tools, tool_choice="required",
                                              max_tokens=2)
                self.assertEqual(e.exception.body["param"], "tools", e.exception.body)
                self.assertIn(message, e.exception.body["message"])
            longest = "ns.get:time-" + "x" * 52  # 64 characters, all of them allowed
            r = c.chat.completions.create(model="x", messages=QUESTION, tools=[tool(longest)], max_tokens=200,
                                          tool_choice={"type": "function", "function": {"name": longest}},
                                          temperature=0)
            self.assertEqual(r.choices[0].finish_reason, "tool_calls")
            self.assertEqual([x.function.name for x in r.choices[0].message.tool_calls], [longest])

    def test_non_object_parameters_and_deep_json_are_400(self):
        with Server("--chat-template-file", os.path.join(TEMPLATES, "Qwen-Qwen2.5-7B-Instruct.jinja")) as s:
            c = s.openai()
            for params in ({"type": "string"}, {"type": "array", "items": {}}, [1]):
                with self.assertRaises(openai.BadRequestError) as e:
                    c.chat.completions.create(model="x", messages=QUESTION, max_tokens=2, tool_choice="required",
                                              tools=[{"type": "function", "function": {"name": "f", "parameters": params}}])
                self.assertEqual(e.exception.body["param"], "tools", e.exception.body)
            # Deeply nested JSON in a tool's schema or a call's arguments is refused before any
            # recursive walk of it (templates, serialization).
            deep = "[" * 20000 + "]" * 20000
            body = ('{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f",'
                    '"parameters":{"type":"object","x-junk":' + deep + '}}}]}')
            status, headers, data = s.request("POST", "/v1/chat/completions", body.encode())
            self.assertEqual(status, 400, data[:300])
            self.assertIn(b"levels deep", data)
            args = json.dumps({"a": json.loads("[" * 200 + "]" * 200)})
            status, payload = s.post("/v1/chat/completions", {"messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"}], "max_tokens": 2})
            self.assertEqual(status, 400, payload)
            self.assertEqual(payload["error"]["param"], "messages[1].tool_calls[0].function.arguments")
            self.assertEqual(s.request("GET", "/health")[0], 200)


if __name__ == "__main__":
    unittest.main()

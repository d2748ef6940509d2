// Clients nobody here wrote, against the real router (TEXTGEN_URL): the `openai` package
// (completions, streaming) and `@huggingface/inference` (text generation against an endpoint URL).
// Greedy outputs must equal what /generate returns for the same prompt.
import test from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { InferenceClient } from "@huggingface/inference";

const url = process.env.TEXTGEN_URL;
const prompt = "The quick brown fox";

async function reference(maxNew) {
  const r = await fetch(`${url}/generate`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ inputs: prompt, parameters: { max_new_tokens: maxNew } }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).generated_text;
}

test("openai: completions", async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused" });
  const r = await client.completions.create({ model: "llama-gqa", prompt, max_tokens: 6, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.choices[0].text, await reference(6));
  assert.equal(r.usage.completion_tokens, 6);
});

test("openai: streaming completions add up to the whole text", async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused" });
  const stream = await client.completions.create({ model: "llama-gqa", prompt, max_tokens: 6, temperature: 0, stream: true });
  let text = "";
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0].text;
    finish = chunk.choices[0].finish_reason ?? finish;
    chunks += 1;
  }
  assert.equal(chunks, 6);
  assert.equal(finish, "length");
  assert.equal(text, await reference(6));
});

test("@huggingface/inference: textGeneration against the endpoint URL", async () => {
  const hf = new InferenceClient();
  const r = await hf.textGeneration({
    endpointUrl: url,
    inputs: prompt,
    parameters: { max_new_tokens: 5, temperature: 0 },
  });
  assert.equal(r.generated_text, await reference(5));
});

test("@huggingface/inference: textGenerationStream", async () => {
  const hf = new InferenceClient();
  let text = "";
  let n = 0;
  try {
    for await (const event of hf.textGenerationStream({ endpointUrl: url, inputs: prompt, parameters: { max_new_tokens: 5, temperature: 0 } })) {
      text += event.token?.text ?? event.choices?.[0]?.text ?? "";
      n += 1;
    }
  } catch (e) {
    assert.fail(`stream failed: ${e}`);
  }
  assert.ok(n >= 5, `events: ${n}`);
  assert.equal(text, await reference(5));
});

// Chat: the router has a chat template (tests/integration/chat/tokenizer_config.json).
const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: prompt }];
const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 8 }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city", "unit"],
    },
  },
};

async function chatReference(maxTokens) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: maxTokens, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).choices[0].message.content;
}

test("openai: chat completions", async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused" });
  const r = await client.chat.completions.create({ model: "llama-gqa", messages, max_tokens: 6, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.choices[0].finish_reason, "length");
});

test("openai: streaming chat adds up, with usage", async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused" });
  const stream = await client.chat.completions.create({
    model: "llama-gqa", messages, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, await chatReference(6));
  assert.equal(usage.completion_tokens, 6);
});

test("openai: tools (required) return a valid call", async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused" });
  const r = await client.chat.completions.create({
    model: "llama-gqa", messages, max_tokens: 80, temperature: 0, tools: [weather], tool_choice: "required",
    tool_prompt: "Use a tool.", // TGI's parameter; its default prompt is long for this model's context
  });
  const call = r.choices[0].message.tool_calls[0];
  assert.equal(r.choices[0].finish_reason, "tool_calls");
  assert.equal(call.function.name, "get_weather");
  const args = JSON.parse(call.function.arguments);
  assert.ok(typeof args.city === "string" && args.city.length <= 8, JSON.stringify(args));
  assert.ok(["celsius", "fahrenheit"].includes(args.unit), JSON.stringify(args));
  // Streamed, through the client's own accumulation of tool-call deltas.
  const runner = client.chat.completions.stream({
    model: "llama-gqa", messages, max_tokens: 80, temperature: 0, tools: [weather], tool_choice: "required",
    tool_prompt: "Use a tool.", // TGI's parameter; its default prompt is long for this model's context
  });
  const final = await runner.finalChatCompletion();
  const streamed = final.choices[0].message.tool_calls[0];
  assert.equal(streamed.function.name, "get_weather");
  assert.deepEqual(JSON.parse(streamed.function.arguments), args);
});

test("openai: structured outputs with response_format json_schema", async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused" });
  const schema = {
    type: "object",
    properties: { answer: { type: "string", enum: ["yes", "no"] }, confidence: { type: "integer", enum: [1, 2, 3] } },
    required: ["answer", "confidence"],
    additionalProperties: false,
  };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model: "llama-gqa", messages, max_tokens: 60, temperature: 1.0, seed,
      response_format: { type: "json_schema", json_schema: { name: "verdict", schema, strict: true } },
    });
    const value = JSON.parse(r.choices[0].message.content);
    assert.ok(["yes", "no"].includes(value.answer), r.choices[0].message.content);
    assert.ok([1, 2, 3].includes(value.confidence), r.choices[0].message.content);
    assert.deepEqual(Object.keys(value), ["answer", "confidence"]);
  }
});

test("@huggingface/inference: chatCompletion and chatCompletionStream", async () => {
  const hf = new InferenceClient();
  const r = await hf.chatCompletion({ endpointUrl: url, messages, max_tokens: 5, temperature: 0 });
  assert.equal(r.choices[0].message.content, await chatReference(5));
  let text = "";
  for await (const chunk of hf.chatCompletionStream({ endpointUrl: url, messages, max_tokens: 5, temperature: 0 })) {
    if (chunk.choices && chunk.choices.length) text += chunk.choices[0].delta.content ?? "";
  }
  assert.equal(text, await chatReference(5));
});

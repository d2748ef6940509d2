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

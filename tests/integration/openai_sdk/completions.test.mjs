// POST /v1/completions through client.completions.create().
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, greedy, MODEL } from './client.mjs';

test('completions.create: a text prompt', async () => {
  const reply = await client.completions.create(greedy({ prompt: 'Hello there, world', max_tokens: 7 }));
  assert.equal(reply.object, 'text_completion');
  assert.match(reply.id, /^cmpl-/);
  assert.equal(reply.model, MODEL);
  assert.equal(reply.choices.length, 1);
  assert.equal(typeof reply.choices[0].text, 'string');
  assert.equal(reply.choices[0].finish_reason, 'length');
  assert.equal(reply.usage.completion_tokens, 7);
  assert.ok(reply.usage.prompt_tokens > 0);
  assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + 7);
});

test('completions.create: a token-id prompt counts exactly those tokens', async () => {
  const prompt = [5, 6, 7, 8, 9];
  const reply = await client.completions.create(greedy({ prompt, max_tokens: 3 }));
  assert.equal(reply.usage.prompt_tokens, prompt.length);
  assert.equal(reply.usage.completion_tokens, 3);
  assert.equal(reply.choices[0].finish_reason, 'length');
});

test('completions.create stream: the pieces make the whole text', async () => {
  const fields = greedy({ prompt: 'Streaming check', max_tokens: 9 });
  const whole = await client.completions.create(fields);
  const stream = await client.completions.create({ ...fields, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.length >= 2, `${chunks.length} chunks`);
  assert.equal(chunks.map((c) => c.choices[0].text).join(''), whole.choices[0].text);
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  for (const chunk of chunks.slice(0, -1)) assert.equal(chunk.choices[0].finish_reason, null);
});

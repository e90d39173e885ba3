// POST /v1/chat/completions through client.chat.completions.create().
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, greedy, MODEL } from './client.mjs';

const messages = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'Hello!' },
];

test('chat.completions.create: one answer with usage', async () => {
  const reply = await client.chat.completions.create(greedy({ messages, max_tokens: 6 }));
  assert.equal(reply.object, 'chat.completion');
  assert.match(reply.id, /^chatcmpl-/);
  assert.equal(reply.model, MODEL);
  assert.equal(reply.choices.length, 1);
  const [choice] = reply.choices;
  assert.equal(choice.index, 0);
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.equal(choice.finish_reason, 'length');
  assert.equal(reply.usage.completion_tokens, 6);
  assert.ok(reply.usage.prompt_tokens > 0);
  assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + reply.usage.completion_tokens);
});

test('chat.completions.create: max_completion_tokens bounds the answer', async () => {
  const reply = await client.chat.completions.create(
    greedy({ messages, max_completion_tokens: 3 }));
  assert.equal(reply.usage.completion_tokens, 3);
  assert.equal(reply.choices[0].finish_reason, 'length');
});

test('chat.completions.create stream: deltas, finish_reason and usage match the whole answer', async () => {
  const fields = greedy({ messages, max_tokens: 8 });
  const whole = await client.chat.completions.create(fields);
  const stream = await client.chat.completions.create({
    ...fields, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.length >= 3, `${chunks.length} chunks`);
  for (const chunk of chunks) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.equal(chunk.id, chunks[0].id);
  }
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  // The last chunk carries only the usage; the one before it the finish.
  const usageChunk = chunks.at(-1);
  assert.deepEqual(usageChunk.choices, []);
  assert.deepEqual(usageChunk.usage, whole.usage);
  const choiceChunks = chunks.slice(0, -1);
  const finishes = choiceChunks.map((c) => c.choices[0].finish_reason);
  assert.deepEqual(finishes, [...finishes.slice(0, -1).map(() => null), 'length']);
  const content = choiceChunks.map((c) => c.choices[0].delta.content ?? '').join('');
  assert.equal(content, whole.choices[0].message.content);
});

test('chat.completions.create stream: no usage chunk unless asked', async () => {
  const stream = await client.chat.completions.create(
    greedy({ messages, max_tokens: 2, stream: true }));
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.every((c) => c.choices.length === 1 && !c.usage));
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
});

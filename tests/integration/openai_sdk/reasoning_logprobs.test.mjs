// Reasoning apart from the answer, reasoning effort, log-probabilities and
// n choices through the SDK.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, greedy } from './client.mjs';

const messages = [{ role: 'user', content: 'What is 2+2?' }];

test('thinking: reasoning_content apart from content (cut before </think>: content null)', async () => {
  const reply = await client.chat.completions.create(
    greedy({ messages, max_tokens: 6, chat_template_kwargs: { thinking: true } }));
  const { message } = reply.choices[0];
  assert.equal(typeof message.reasoning_content, 'string');
  assert.ok(message.reasoning_content.length > 0);
  assert.equal(message.reasoning, message.reasoning_content);
  assert.equal(message.content, null);
  const stream = await client.chat.completions.create(
    greedy({ messages, max_tokens: 6, chat_template_kwargs: { thinking: true }, stream: true }));
  let reasoning = '';
  let content = '';
  for await (const chunk of stream) {
    reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
    content += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, message.reasoning_content);
  assert.equal(content, '');
});

test('reasoning_effort: accepted values think, none does not, unknown is a 400', async () => {
  const high = await client.chat.completions.create(
    greedy({ messages, max_tokens: 2, reasoning_effort: 'high' }));
  assert.equal(typeof high.choices[0].message.reasoning_content, 'string');
  const none = await client.chat.completions.create(
    greedy({ messages, max_tokens: 2, reasoning_effort: 'none' }));
  assert.equal(none.choices[0].message.reasoning_content, undefined);
  assert.equal(typeof none.choices[0].message.content, 'string');
  await assert.rejects(
    client.chat.completions.create(greedy({ messages, max_tokens: 2, reasoning_effort: 'extreme' })),
    (err) => err.status === 400 && err.param === 'reasoning_effort');
});

test('chat logprobs: one entry per token, top_logprobs alternatives, greedy picks the best', async () => {
  const reply = await client.chat.completions.create(
    greedy({ messages, max_tokens: 5, logprobs: true, top_logprobs: 3 }));
  const { content } = reply.choices[0].logprobs;
  assert.equal(content.length, reply.usage.completion_tokens);
  for (const entry of content) {
    assert.equal(typeof entry.token, 'string');
    assert.ok(entry.logprob <= 0);
    assert.ok(Array.isArray(entry.bytes));
    assert.equal(entry.top_logprobs.length, 3);
    assert.equal(entry.top_logprobs[0].logprob, entry.logprob);
    for (let k = 1; k < 3; ++k) {
      assert.ok(entry.top_logprobs[k].logprob <= entry.top_logprobs[k - 1].logprob);
    }
  }
});

test('completions echo + logprobs: the prompt first (null), then exactly one generated token', async () => {
  const prompt = [40, 41, 42, 43, 44];
  const reply = await client.completions.create({
    model: 'mneme', prompt: [prompt], max_tokens: 1, logprobs: 1, echo: true, temperature: 0, seed: 1234,
  });
  const { logprobs } = reply.choices[0];
  assert.equal(logprobs.tokens.length, prompt.length + 1);
  assert.equal(logprobs.token_logprobs[0], null);
  assert.equal(logprobs.top_logprobs[0], null);
  for (let i = 1; i <= prompt.length; ++i) {
    assert.equal(logprobs.top_logprobs[i][logprobs.tokens[i]], logprobs.token_logprobs[i]);
  }
  assert.equal(reply.usage.completion_tokens, 1);
});

test('n choices: indexed, each with its own sample', async () => {
  const reply = await client.chat.completions.create({
    model: 'mneme', messages, max_tokens: 4, n: 3, temperature: 1, seed: 11, ignore_eos: true,
  });
  assert.deepEqual(reply.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(reply.usage.completion_tokens, 12);
  const again = await client.chat.completions.create({
    model: 'mneme', messages, max_tokens: 4, n: 3, temperature: 1, seed: 11, ignore_eos: true,
  });
  assert.deepEqual(again.choices.map((c) => c.message.content), reply.choices.map((c) => c.message.content));
  const stream = await client.chat.completions.create({
    model: 'mneme', messages, max_tokens: 4, n: 3, temperature: 1, seed: 11, ignore_eos: true, stream: true,
  });
  const texts = ['', '', ''];
  for await (const chunk of stream) {
    for (const c of chunk.choices) texts[c.index] += c.delta.content ?? '';
  }
  assert.deepEqual(texts, reply.choices.map((c) => c.message.content));
});

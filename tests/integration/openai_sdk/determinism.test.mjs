// The same request twice gives the same text: greedy decoding, and sampling
// with the same seed.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, greedy } from './client.mjs';

const messages = [{ role: 'user', content: 'Tell me a story.' }];

test('greedy: two identical requests give identical text', async () => {
  const fields = greedy({ prompt: 'Once upon a time', max_tokens: 8, seed: 7 });
  const a = await client.completions.create(fields);
  const b = await client.completions.create(fields);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const c = await client.chat.completions.create(greedy({ messages, max_tokens: 8, seed: 7 }));
  const d = await client.chat.completions.create(greedy({ messages, max_tokens: 8, seed: 7 }));
  assert.equal(c.choices[0].message.content, d.choices[0].message.content);
});

test('sampling with a seed: two identical requests give identical text', async () => {
  const fields = greedy({ messages, max_tokens: 8, temperature: 1, top_p: 0.95, seed: 1234 });
  const a = await client.chat.completions.create(fields);
  const b = await client.chat.completions.create(fields);
  assert.equal(a.usage.completion_tokens, 8);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

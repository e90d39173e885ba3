// Errors as the SDK sees them: the right APIError subclass and status, and
// the OpenAI error body ({"error": {"message", "type", "param", "code"}}).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { API_KEY, BASE_URL, client, greedy, OpenAI, rejection } from './client.mjs';

// Checks that `err` is the SDK's error for HTTP `status` in OpenAI's format,
// of error type `type` and about request field `param` (when given).
function assertApiError(err, ErrorClass, status, { type, param } = {}) {
  assert.ok(err instanceof ErrorClass, `${err?.constructor?.name}: ${err?.message}`);
  assert.ok(err instanceof OpenAI.APIError);
  assert.equal(err.status, status);
  assert.equal(typeof err.error?.message, 'string', JSON.stringify(err.error));
  assert.ok(err.error.message.length > 0);
  assert.equal(typeof err.type, 'string', JSON.stringify(err.error));
  if (type !== undefined) assert.equal(err.type, type);
  if (param !== undefined) assert.equal(err.param, param);
}

const messages = [{ role: 'user', content: 'Hi' }];

// An unknown model is a 404 (NotFoundError), as OpenAI and vLLM answer it,
// about the field "model".
test('an unknown model: NotFoundError naming the model', async () => {
  for (const create of [
    () => client.chat.completions.create(greedy({ model: 'gpt-4', messages, max_tokens: 1 })),
    () => client.completions.create(greedy({ model: 'gpt-4', prompt: 'x', max_tokens: 1 })),
    () => client.chat.completions.create(
      greedy({ model: 'gpt-4', messages, max_tokens: 1, stream: true })),
  ]) {
    const err = await rejection(create());
    assertApiError(err, OpenAI.NotFoundError, 404, { type: 'not_found_error', param: 'model' });
    assert.match(err.message, /gpt-4/);
  }
});

test('invalid fields: BadRequestError naming the field', async () => {
  const cases = [
    [{ prompt: 'x', max_tokens: 'three' }, 'max_tokens'],
    [{ prompt: 'x', max_tokens: 1, temperature: -1 }, 'temperature'],
    [{ prompt: 'x', max_tokens: 1, stop: [1] }, 'stop'],
    [{ prompt: [1, 'two'], max_tokens: 1 }, 'prompt'],
  ];
  for (const [fields, param] of cases) {
    const err = await rejection(client.completions.create(greedy(fields)));
    assertApiError(err, OpenAI.BadRequestError, 400, { type: 'invalid_request_error', param });
  }
  const err = await rejection(client.chat.completions.create(
    greedy({ messages: [{ role: 'robot', content: 'x' }], max_tokens: 1 })));
  assertApiError(err, OpenAI.BadRequestError, 400,
    { type: 'invalid_request_error', param: 'messages[0].role' });
});

test('an unknown path: NotFoundError', async () => {
  const err = await rejection(client.get('/nothing'));
  assert.ok(err instanceof OpenAI.NotFoundError, `${err?.constructor?.name}: ${err?.message}`);
  assert.equal(err.status, 404);
  assert.match(err.error.message, /no route/);
});

test('the server still answers after the errors', async () => {
  const reply = await client.completions.create(greedy({ prompt: 'ok', max_tokens: 1 }));
  assert.equal(reply.usage.completion_tokens, 1);
});

test('a wrong API key: AuthenticationError (401); liveness needs none', async () => {
  const stranger = new OpenAI({ baseURL: BASE_URL, apiKey: `${API_KEY}-wrong`, maxRetries: 0 });
  const err = await rejection(stranger.models.list());
  assertApiError(err, OpenAI.AuthenticationError, 401);
  const health = await fetch(BASE_URL.replace(/\/v1$/, '/health'));
  assert.equal(health.status, 200);
});

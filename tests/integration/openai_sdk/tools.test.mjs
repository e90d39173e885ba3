// Tool calls through client.chat.completions.create(): the declared tools,
// a forced call (tool_choice naming a function) whole and streamed as
// OpenAI's deltas, and tool results sent back in the history.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, greedy } from './client.mjs';

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
  },
}];
const messages = [{ role: 'user', content: 'Weather in Paris?' }];
const forced = { type: 'function', function: { name: 'get_weather' } };

test('tool_choice naming a function: message.tool_calls and finish_reason tool_calls', async () => {
  const reply = await client.chat.completions.create(
    greedy({ messages, tools, tool_choice: forced, max_tokens: 12 }));
  const [choice] = reply.choices;
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  const [call] = choice.message.tool_calls;
  assert.match(call.id, /^call_[0-9a-f]{24}$/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args, 'object');
  assert.ok(!Array.isArray(args));
});

test('a streamed forced call arrives as index / id / name, then argument fragments', async () => {
  const fields = greedy({ messages, tools, tool_choice: forced, max_tokens: 12 });
  const whole = await client.chat.completions.create(fields);
  const stream = await client.chat.completions.create({ ...fields, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const [choice] = chunk.choices;
    if (choice.finish_reason) finish = choice.finish_reason;
    for (const delta of choice.delta.tool_calls ?? []) {
      if (delta.id) {
        assert.equal(delta.type, 'function');
        calls[delta.index] = { id: delta.id, name: delta.function.name, arguments: '' };
      }
      calls[delta.index].arguments += delta.function?.arguments ?? '';
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments),
    JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments));
});

test('tool results go back in the history; tool_choice none answers in text', async () => {
  const history = [
    ...messages,
    {
      role: 'assistant', content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 2}' } }],
    },
    { role: 'tool', tool_call_id: 'call_1', content: 'Sunny, 21 C' },
  ];
  const reply = await client.chat.completions.create(
    greedy({ messages: history, tools, tool_choice: 'none', max_tokens: 4 }));
  assert.equal(reply.choices[0].finish_reason, 'length');
  assert.equal(reply.choices[0].message.tool_calls, undefined);
  assert.equal(typeof reply.choices[0].message.content, 'string');
});

test('bad tool input is a 400 naming the field', async () => {
  for (const [fields, param] of [
    [{ tools: [{ type: 'function', function: {} }] }, 'tools[0].function.name'],
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].tool_call_id'],
  ]) {
    await assert.rejects(
      client.chat.completions.create(greedy({ messages, max_tokens: 2, ...fields })),
      (err) => err instanceof client.constructor.BadRequestError && err.param === param,
      JSON.stringify(fields));
  }
});

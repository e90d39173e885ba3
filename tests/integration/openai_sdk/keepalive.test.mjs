// Requests on kept-alive connections: answers and streams one after another
// on the same connection, past the server's per-connection request limit
// (after which it closes the connection and the client opens another).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { greedy, keepAliveClient } from './client.mjs';

test('keep-alive: streamed and whole answers alternate on reused connections', async () => {
  const messages = [{ role: 'user', content: 'Again and again' }];
  for (let round = 0; round < 4; round++) {
    const whole = await keepAliveClient.chat.completions.create(greedy({ messages, max_tokens: 3 }));
    const stream = await keepAliveClient.chat.completions.create(
      greedy({ messages, max_tokens: 3, stream: true }));
    let content = '';
    let finish = null;
    for await (const chunk of stream) {
      content += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'length', `round ${round}`);
    assert.equal(content, whole.choices[0].message.content, `round ${round}`);
  }
});

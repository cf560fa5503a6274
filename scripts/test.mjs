#!/usr/bin/env node
// `npm test`: the type check (`tsc -b`) and the lint (`biome check .`) run beside the test suite
// (`vitest run`) instead of before it, and the run fails when any of the three fails. The type check is a
// single-threaded half minute during which the suite would otherwise not start, and the suite leaves a
// core idle for about that long in all (its tests wait on processes and timers): run side by side, the
// whole takes about what the suite alone takes.
//
// The one test that needs what the type check builds (the package test: `npm pack` builds dist/, which
// `tsc -b` is writing) waits for it: METASTATIC_TYPECHECK_DONE names a file written when `tsc -b` has
// ended (testkit/installedPackage.ts). The type check's and the lint's output is printed at the end,
// after the suite's. Arguments are passed to vitest (`npm test -- test/unit`).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const bin = (name) => join(root, 'node_modules', '.bin', name);
const marks = mkdtempSync(join(tmpdir(), 'metastatic-test-'));
const typecheckDone = join(marks, 'typecheck.done');
const children = new Set();

/** Runs a command; its output is kept (or passed through) and its exit code and duration returned. */
function start(name, command, args, { passThrough = false, env = process.env } = {}) {
  const started = Date.now();
  const child = spawn(command, args, {
    cwd: root,
    env,
    stdio: passThrough ? 'inherit' : ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  let output = '';
  child.stdout?.on('data', (d) => {
    output += d;
  });
  child.stderr?.on('data', (d) => {
    output += d;
  });
  return new Promise((resolve) => {
    const done = (code) => {
      children.delete(child);
      resolve({ name, code, output, seconds: (Date.now() - started) / 1000 });
    };
    child.on('error', (err) => {
      output += `${name}: ${err.message}\n`;
      done(127);
    });
    child.on('close', (code, signal) => done(code ?? (signal ? 128 : 1)));
  });
}

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    for (const child of children) child.kill(signal);
  });
}

const typecheck = start('typecheck (tsc -b)', bin('tsc'), ['-b']).then((r) => {
  writeFileSync(typecheckDone, String(r.code));
  return r;
});
const lint = start('lint (biome check .)', bin('biome'), ['check', '.']);
const suite = start('vitest run', bin('vitest'), ['run', ...process.argv.slice(2)], {
  passThrough: true,
  env: { ...process.env, METASTATIC_TYPECHECK_DONE: typecheckDone },
});

const results = await Promise.all([suite, typecheck, lint]);
rmSync(marks, { recursive: true, force: true });
for (const r of results.slice(1)) {
  if (r.code !== 0) process.stdout.write(`\n${r.name} failed (exit ${r.code}):\n${r.output}`);
  process.stdout.write(`${r.name}: ${r.code === 0 ? 'passed' : 'FAILED'} in ${r.seconds.toFixed(1)} s\n`);
}
process.exitCode = results.find((r) => r.code !== 0)?.code ?? 0;

#!/usr/bin/env node
// Entry point of the `metastatic` CLI. Installed from the package, it runs the built JavaScript in dist/.
// In this repository (the TypeScript sources are beside it) it runs the sources, bundled on demand by
// bin/fromSources.mjs and rebuilt whenever one changes, so an edit needs no build step before the next
// command, and a dist/ left from an earlier build is never run stale.
import { existsSync } from 'node:fs';

// Node 20 is supported for local use; Lambda runs a current runtime, so the SDK's notice is noise here.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
if (existsSync(new URL('../cli/main.ts', import.meta.url))) {
  const { sourceBuild } = await import('./fromSources.mjs');
  const dir = await sourceBuild();
  // Stack traces point into the bundle (unminified, each module headed by its source path); with
  // NODE_OPTIONS=--enable-source-maps they point into the TypeScript sources. Not on by default: reading
  // the source maps of every module a command loads is a sixth of its start (0.50 -> 0.42 CPU-s a
  // command, measured), which every command and every test of the CLI pays.
  await import(new URL(`file://${dir}/main.js`).href);
} else {
  await import('../dist/cli/main.js');
}

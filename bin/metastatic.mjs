#!/usr/bin/env node
// Entry point of the `metastatic` CLI. Installed from the package, it runs the built JavaScript in dist/.
// In this repository (the TypeScript sources are beside it) it runs the sources through tsx, so an edit
// needs no build step before the next command, and a dist/ left from an earlier build is never run stale.
import { existsSync } from 'node:fs';

// Node 20 is supported for local use; Lambda runs a current runtime, so the SDK's notice is noise here.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
const sources = new URL('../cli/main.ts', import.meta.url);
if (existsSync(sources)) {
  const { register } = await import('tsx/esm/api');
  register();
  await import(sources.href);
} else {
  await import('../dist/cli/main.js');
}

#!/usr/bin/env node
// Entry point of the `metastatic` CLI. The sources are TypeScript run through tsx, so the command
// works right after `npm ci` with no build step.
import { register } from 'tsx/esm/api';

// Node 20 is supported for local use; Lambda runs a current runtime, so the SDK's notice is noise here.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
register();
await import('../cli/main.ts');

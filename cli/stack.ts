/** A deployed pool's stack outputs: read by the client library (client/stack.ts), which the CLI uses. */
export { readStack, type StackInfo } from '../client/stack.ts';

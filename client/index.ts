/**
 * `metastatic/client`: a typed client of a metastatic pool, embedded (`metastatic dev`, by its state dir)
 * or deployed (`cdk deploy`, by its stack name). Documented in docs/client.md.
 */
export type { AwsCredentials, PoolTarget } from './connection.ts';
export {
  AbortedError,
  InvalidInputError,
  MetastaticError,
  NodeHeldError,
  NodeLostError,
  NodeNotFoundError,
  NodeUnreachableError,
  PoolNotFoundError,
  PoolStoppedError,
  RenewRefusedError,
  RequestExistsError,
  RequestFailedError,
  RequestNotFoundError,
  TimeoutError,
  UnknownLabelError,
} from './errors.ts';
export { newRequestId, type RequestSpec, type Shape } from './messages.ts';
export {
  checkIdentity,
  IdentityError,
  knownHostsLines,
  loginOf,
  remoteCommandLine,
  runSsh,
  type SshLogin,
  type SshRunOptions,
  shellQuote,
} from './openssh.ts';
export {
  DEFAULT_RUN_LEASE,
  type RunContext,
  type RunOptions,
  type WaitForOptions,
  type WaitOptions,
} from './options.ts';
export { PoolClient } from './poolClient.ts';
export type { ReadyNode } from './readyNode.ts';
export type { PoolNode, PoolRequest } from './records.ts';

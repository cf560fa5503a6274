export { LauncherPermissions, type LauncherPermissionsProps, POOL_TAG_KEY } from './launcherPermissions.ts';
export { MetastaticPool } from './metastaticPool.ts';
export { MetastaticStack, type MetastaticStackProps } from './metastaticStack.ts';
export {
  environmentSize,
  LAMBDA_ENVIRONMENT_LIMIT,
  PoolFunction,
  type PoolFunctionName,
  type PoolFunctionProps,
} from './poolFunction.ts';
export { PoolGithub, type PoolGithubProps } from './poolGithub.ts';
export {
  EC2_DETAIL_TYPES,
  EC2_EVENT_STATES,
  FULFIL_MAX_CONCURRENCY,
  FULFIL_MAX_RECEIVE_COUNT,
  GITHUB_FUNCTION_TIMEOUT_SECONDS,
  GITHUB_MAX_CONCURRENCY,
  GITHUB_MAX_RECEIVE_COUNT,
  METRICS_NAMESPACE,
  type MetastaticPoolProps,
  POWERTOOLS_SERVICE_NAME,
  REQUEST_MAX_CONCURRENCY,
  REQUEST_MAX_RECEIVE_COUNT,
} from './poolProps.ts';
export { PoolTable, type PoolTableProps } from './poolTable.ts';
export { QueueWithDlq, type QueueWithDlqProps } from './queueWithDlq.ts';

/**
 * The CloudFormation outputs a deployed pool publishes, by the key the CLI and the client library read
 * them with (`metastatic --stack`, client/stack.ts). MetastaticPool creates them itself (with these
 * logical ids, whatever its path in the app), so a stack of the user's that embeds the construct can be
 * read as well as MetastaticStack: the keys are part of the construct's documented interface
 * (docs/deploy.md#outputs) and must not change.
 */
export const STACK_OUTPUTS = {
  requestQueueUrl: 'RequestQueueUrl',
  leaseQueueUrl: 'LeaseQueueUrl',
  fulfilQueueUrl: 'FulfilQueueUrl',
  tableName: 'TableName',
  eventBusName: 'EventBusName',
  poolId: 'PoolId',
} as const;

export type StackOutputName = (typeof STACK_OUTPUTS)[keyof typeof STACK_OUTPUTS];

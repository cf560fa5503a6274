import { CfnResource } from 'aws-cdk-lib/core';
import type { IConstruct } from 'constructs';

/**
 * The CloudFormation resource of an L2 construct, so that a cdk-nag acknowledgement lands on exactly
 * that resource and not on the construct's whole subtree (a queue's policy, a function's mappings).
 */
export function cfnResource(construct: IConstruct): CfnResource {
  const child = construct.node.defaultChild;
  if (!CfnResource.isCfnResource(child)) {
    throw new Error(`${construct.node.path} has no CloudFormation resource to acknowledge a finding on`);
  }
  return child;
}

import {
  type Attribute,
  AttributeType,
  BillingMode,
  ProjectionType,
  Table,
  TableEncryption,
} from 'aws-cdk-lib/aws-dynamodb';
import { Grant, type IGrantable } from 'aws-cdk-lib/aws-iam';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { RemovalPolicy } from 'aws-cdk-lib/core';
import { Construct } from 'constructs';
import { TTL_ATTRIBUTE, tableDefinition } from '../shared/store/table.ts';

export interface PoolTableProps {
  /**
   * Customer-managed KMS key for encryption at rest.
   * @default - an AWS managed key (`aws/dynamodb`)
   */
  readonly encryptionKey?: IKey;
  /**
   * What happens to the table when it leaves the stack. It holds the only record of which EC2 instances
   * the pool runs, so losing it orphans them.
   * @default RemovalPolicy.RETAIN
   */
  readonly removalPolicy?: RemovalPolicy;
}

/** The construct id of the table inside PoolTable. Part of its logical id: never change it. */
const TABLE_ID = 'Resource';

/**
 * The pool's single table, built from `tableDefinition` (shared/store/table.ts): the same keys and the
 * `free` and `reap` indexes the embedded pool creates with CreateTable. On-demand, point-in-time
 * recovery, encrypted, retained on delete; TTL on `expiresAt`, which only ended records carry (requests
 * whose nodes all ended, stopped backing nodes: the configuration's `record-retention` after they ended).
 */
export class PoolTable extends Construct {
  readonly table: Table;
  /** The names of the global secondary indexes, in definition order. */
  readonly indexNames: readonly string[];

  constructor(scope: Construct, id: string, props: PoolTableProps = {}) {
    super(scope, id);
    const def = tableDefinition;
    if (def.BillingMode !== 'PAY_PER_REQUEST') {
      throw new Error(
        `tableDefinition uses billing mode ${def.BillingMode}; PoolTable expects PAY_PER_REQUEST`,
      );
    }
    const keys = keySchema(def.KeySchema);
    this.table = new Table(this, TABLE_ID, {
      partitionKey: keys.partitionKey,
      ...(keys.sortKey ? { sortKey: keys.sortKey } : {}),
      billingMode: BillingMode.PAY_PER_REQUEST,
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
      ...(props.encryptionKey
        ? { encryption: TableEncryption.CUSTOMER_MANAGED, encryptionKey: props.encryptionKey }
        : { encryption: TableEncryption.AWS_MANAGED }),
      removalPolicy: props.removalPolicy ?? RemovalPolicy.RETAIN,
      // Ended records carry the time DynamoDB may delete them (`record-retention` after they ended).
      timeToLiveAttribute: TTL_ATTRIBUTE,
    });
    const names: string[] = [];
    for (const gsi of def.GlobalSecondaryIndexes ?? []) {
      if (!gsi.IndexName) throw new Error('tableDefinition has a global secondary index without a name');
      if (gsi.Projection?.ProjectionType !== 'ALL') {
        throw new Error(`index ${gsi.IndexName}: PoolTable supports only projection ALL`);
      }
      const indexKeys = keySchema(gsi.KeySchema);
      this.table.addGlobalSecondaryIndex({
        indexName: gsi.IndexName,
        partitionKey: indexKeys.partitionKey,
        ...(indexKeys.sortKey ? { sortKey: indexKeys.sortKey } : {}),
        projectionType: ProjectionType.ALL,
      });
      names.push(gsi.IndexName);
    }
    this.indexNames = names;
  }

  get tableName(): string {
    return this.table.tableName;
  }

  /**
   * What the pool's code does with the table (shared/store): single-item reads and writes, batched reads
   * (a label's min-ready seats, read together by the reaper) and queries on the table (a capacity set's
   * places are one item collection, changed by transactions of these writes), queries on its indexes,
   * named one by one rather than as `index/*`.
   * Unlike `Table.grantReadWriteData`: no Scan (only the CLI's listings scan, with the caller's own
   * credentials), no batch writes, no DescribeTable (the embedded pool's, to create its
   * table), no stream actions (the table has no stream).
   */
  grantReadWriteData(grantee: IGrantable): Grant {
    const tableArn = this.table.tableArn;
    const grant = Grant.addToPrincipal({
      grantee,
      actions: [
        'dynamodb:GetItem',
        'dynamodb:BatchGetItem',
        'dynamodb:Query',
        'dynamodb:PutItem',
        'dynamodb:UpdateItem',
        'dynamodb:DeleteItem',
        // A capacity set's transactions (TransactWriteItems has no action of its own: each of its actions
        // is authorized as its single-item write; a ConditionCheck as this one).
        'dynamodb:ConditionCheckItem',
      ],
      resourceArns: [tableArn],
    }).combine(
      Grant.addToPrincipal({
        grantee,
        actions: ['dynamodb:Query'],
        resourceArns: this.indexNames.map((name) => `${tableArn}/index/${name}`),
      }),
    );
    // What DynamoDB needs of a customer-managed table key, named action by action (grantEncryptDecrypt
    // would add kms:ReEncrypt* and kms:GenerateDataKey*).
    this.table.encryptionKey?.grant(
      grantee,
      'kms:Decrypt',
      'kms:Encrypt',
      'kms:GenerateDataKey',
      'kms:ReEncryptFrom',
      'kms:ReEncryptTo',
      'kms:DescribeKey',
    );
    return grant;
  }
}

function keySchema(schema: typeof tableDefinition.KeySchema): {
  partitionKey: Attribute;
  sortKey?: Attribute;
} {
  let partitionKey: Attribute | undefined;
  let sortKey: Attribute | undefined;
  for (const element of schema ?? []) {
    const name = element.AttributeName;
    if (!name) throw new Error('tableDefinition has a key without an attribute name');
    const attribute = { name, type: attributeType(name) };
    if (element.KeyType === 'HASH') partitionKey = attribute;
    else if (element.KeyType === 'RANGE') sortKey = attribute;
  }
  if (!partitionKey) throw new Error('tableDefinition has a key schema without a HASH key');
  return sortKey ? { partitionKey, sortKey } : { partitionKey };
}

function attributeType(name: string): AttributeType {
  const type = tableDefinition.AttributeDefinitions?.find((a) => a.AttributeName === name)?.AttributeType;
  switch (type) {
    case 'S':
      return AttributeType.STRING;
    case 'N':
      return AttributeType.NUMBER;
    case 'B':
      return AttributeType.BINARY;
    default:
      throw new Error(`tableDefinition does not define the type of key attribute ${name}`);
  }
}

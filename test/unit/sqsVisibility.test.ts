import { describe, expect, it } from 'vitest';
import { queueUrlOfArn } from '../../shared/runtime/sqsVisibility.ts';

describe('a queue URL from the ARN a Lambda SQS record carries', () => {
  it('is SQS endpoint of the region and partition, then the account and the name', () => {
    expect(queueUrlOfArn('arn:aws:sqs:eu-west-1:123456789012:pool-RequestQueue-AbC')).toBe(
      'https://sqs.eu-west-1.amazonaws.com/123456789012/pool-RequestQueue-AbC',
    );
    expect(queueUrlOfArn('arn:aws-cn:sqs:cn-north-1:123456789012:q.fifo')).toBe(
      'https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q.fifo',
    );
  });

  it('refuses what is not an SQS queue ARN', () => {
    expect(() => queueUrlOfArn('arn:aws:sns:eu-west-1:123456789012:topic')).toThrow(/not an SQS queue ARN/);
    expect(() => queueUrlOfArn('https://sqs.eu-west-1.amazonaws.com/1/q')).toThrow(/not an SQS queue ARN/);
  });
});

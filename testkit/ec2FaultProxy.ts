import { randomUUID } from 'node:crypto';
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  DescribeLaunchTemplateVersionsCommand,
  EC2Client,
  type ResponseLaunchTemplateData,
} from '@aws-sdk/client-ec2';
import { MOTO_CREDENTIALS } from './moto.ts';

/**
 * A fault-injecting HTTP proxy in front of moto_server's EC2 (loopback only): it answers chosen EC2
 * Query API requests with EC2's own XML error document and HTTP status, and passes every other request
 * through. The SDK's real deserializer turns those documents into exceptions, so a test through the
 * proxy checks how our code classifies what EC2 really sends, not how a mock builds an exception.
 *
 * - `fail(fault)`: the next `times` requests of an Action (matching `when`) get the error. Faults are
 *   checked in the order added; an exhausted one is dropped.
 * - `enforceNetworkInterfaceRules`: RunInstances is checked against the rule moto 5.2.1 leaves out
 *   (it merges a launch template's security groups silently): "If you specify a network interface, you
 *   must specify any security groups and subnets as part of the network interface" (RunInstances API
 *   reference, SecurityGroupIds / SubnetId), also when one half comes from the launch template (its
 *   parameters can be overridden at launch, not removed). EC2 then answers InvalidParameterCombination
 *   with "Network interfaces and an instance-level security groups / subnet ID may not be specified on
 *   the same request" (the messages EC2 users report for both cases). moto itself rejects only a
 *   request's own NetworkInterfaces + SubnetId.
 * - `requests`: every request seen, in order, with what answered it.
 */

/** One EC2 Query API request as the proxy saw it. */
export interface Ec2Request {
  readonly action: string;
  /** The form parameters (`InstanceType`, `NetworkInterface.1.SubnetId`, `SecurityGroupId.1`...). */
  readonly params: URLSearchParams;
  /** `moto`, or the error code the proxy answered with. */
  answeredBy: string;
}

export interface Ec2Fault {
  /** The EC2 Action, e.g. RunInstances. */
  readonly action: string;
  /** Only requests for which this holds (default: every request of the action). */
  readonly when?: (request: Ec2Request) => boolean;
  readonly code: string;
  /** Default: EC2's usual message for the code. */
  readonly message?: string;
  /** Default: EC2's status for the code (ec2ErrorStatus). */
  readonly status?: number;
  /** How many matching requests fail (default 1; Infinity until clear()). */
  readonly times?: number;
}

export interface Ec2FaultProxy {
  /** `http://localhost:PORT`: give it to the EC2 client as its endpoint. */
  readonly endpoint: string;
  readonly requests: Ec2Request[];
  fail(fault: Ec2Fault): void;
  /** Forgets faults and recorded requests. */
  clear(): void;
  close(): Promise<void>;
}

/**
 * EC2's HTTP status for an error code: its server errors (insufficient capacity, internal errors) are
 * 500, throttling and unavailability 503 (EC2 API reference, "Error codes": server errors come with a
 * 500-series status), everything else a client error, 400.
 */
export function ec2ErrorStatus(code: string): number {
  if (['RequestLimitExceeded', 'Unavailable', 'ServiceUnavailable'].includes(code)) return 503;
  if (code.startsWith('Insufficient') || code === 'InternalError') return 500;
  return 400;
}

const MESSAGES: Record<string, string> = {
  InsufficientInstanceCapacity:
    'We currently do not have sufficient capacity in the Availability Zone you requested. Our system will be working on provisioning additional capacity.',
  VcpuLimitExceeded:
    'You have requested more vCPU capacity than your current vCPU limit of 32 allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.',
  MaxSpotInstanceCountExceeded: 'Max spot instance count exceeded',
  RequestLimitExceeded: 'Request limit exceeded.',
};

/** EC2's error document (Query API): `<Response><Errors><Error><Code>...`. */
export function ec2ErrorDocument(code: string, message: string, requestId = randomUUID()): string {
  return `<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>${xml(code)}</Code><Message>${xml(message)}</Message></Error></Errors><RequestID>${requestId}</RequestID></Response>`;
}

function xml(text: string): string {
  return text.replace(/[<>&'"]/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** `spot` when the RunInstances request asks for the spot market. */
export function marketOf(request: Ec2Request): 'spot' | 'on-demand' {
  return request.params.get('InstanceMarketOptions.MarketType') === 'spot' ? 'spot' : 'on-demand';
}

/** The values of a list parameter (`InstanceId` -> InstanceId.1, InstanceId.2, ...). */
export function listParam(request: Ec2Request, name: string): string[] {
  const out: string[] = [];
  for (let i = 1; request.params.has(`${name}.${i}`); i++) out.push(request.params.get(`${name}.${i}`) ?? '');
  return out;
}

function hasPrefix(params: URLSearchParams, prefix: string): boolean {
  for (const key of params.keys()) if (key.startsWith(prefix)) return true;
  return false;
}

export async function startEc2FaultProxy(options: {
  /** moto's endpoint, `http://localhost:PORT`. */
  readonly target: string;
  /** The region the tests use (for the proxy's own look-ups of launch templates). */
  readonly region: string;
  readonly enforceNetworkInterfaceRules?: boolean;
}): Promise<Ec2FaultProxy> {
  const target = new URL(options.target);
  const moto = new EC2Client({
    region: options.region,
    endpoint: options.target,
    credentials: MOTO_CREDENTIALS,
    maxAttempts: 1,
  });
  let faults: { fault: Ec2Fault; remaining: number }[] = [];
  const requests: Ec2Request[] = [];

  async function templateData(params: URLSearchParams): Promise<ResponseLaunchTemplateData | undefined> {
    const id = params.get('LaunchTemplate.LaunchTemplateId');
    const name = params.get('LaunchTemplate.LaunchTemplateName');
    if (id === null && name === null) return undefined;
    const out = await moto.send(
      new DescribeLaunchTemplateVersionsCommand({
        ...(id !== null ? { LaunchTemplateId: id } : { LaunchTemplateName: name ?? '' }),
        Versions: [params.get('LaunchTemplate.Version') ?? '$Default'],
      }),
    );
    return out.LaunchTemplateVersions?.[0]?.LaunchTemplateData;
  }

  /** The InvalidParameterCombination EC2 would answer for this RunInstances request, if any. */
  async function networkRuleViolation(params: URLSearchParams): Promise<string | undefined> {
    const template = await templateData(params);
    const interfaces =
      hasPrefix(params, 'NetworkInterface.') || (template?.NetworkInterfaces?.length ?? 0) > 0;
    if (!interfaces) return undefined;
    const instanceGroups =
      hasPrefix(params, 'SecurityGroupId.') ||
      hasPrefix(params, 'SecurityGroup.') ||
      (template?.SecurityGroupIds?.length ?? 0) > 0 ||
      (template?.SecurityGroups?.length ?? 0) > 0;
    if (instanceGroups) {
      return 'Network interfaces and an instance-level security groups may not be specified on the same request';
    }
    if (params.has('SubnetId')) {
      return 'Network interfaces and an instance-level subnet ID may not be specified on the same request';
    }
    return undefined;
  }

  function answer(res: ServerResponse, status: number, code: string, message: string): void {
    const body = ec2ErrorDocument(code, message);
    res.writeHead(status, {
      'content-type': 'text/xml;charset=UTF-8',
      'content-length': Buffer.byteLength(body),
    });
    res.end(body);
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    const params = new URLSearchParams(body.toString('utf8'));
    const action = params.get('Action') ?? '';
    const seen: Ec2Request = { action, params, answeredBy: 'moto' };
    requests.push(seen);

    const rule = faults.find(
      (f) => f.remaining > 0 && f.fault.action === action && (f.fault.when?.(seen) ?? true),
    );
    if (rule) {
      rule.remaining--;
      faults = faults.filter((f) => f.remaining > 0);
      const { code } = rule.fault;
      seen.answeredBy = code;
      answer(
        res,
        rule.fault.status ?? ec2ErrorStatus(code),
        code,
        rule.fault.message ?? MESSAGES[code] ?? code,
      );
      return;
    }
    if (options.enforceNetworkInterfaceRules && action === 'RunInstances') {
      const violation = await networkRuleViolation(params);
      if (violation !== undefined) {
        seen.answeredBy = 'InvalidParameterCombination';
        answer(res, 400, 'InvalidParameterCombination', violation);
        return;
      }
    }
    await new Promise<void>((resolve, reject) => {
      const upstream = httpRequest(
        {
          host: '127.0.0.1',
          port: target.port,
          method: req.method,
          path: req.url,
          headers: { ...req.headers, host: target.host },
        },
        (motoRes) => {
          res.writeHead(motoRes.statusCode ?? 502, motoRes.headers);
          motoRes.pipe(res);
          motoRes.on('end', resolve);
          motoRes.on('error', reject);
        },
      );
      upstream.on('error', reject);
      upstream.end(body);
    });
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) answer(res, 500, 'InternalError', `ec2FaultProxy: ${String(err)}`);
      else res.destroy();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://localhost:${port}`,
    requests,
    fail(fault) {
      faults.push({ fault, remaining: fault.times ?? 1 });
    },
    clear() {
      faults = [];
      requests.length = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        moto.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import {
  DescribeImagesCommand,
  EC2Client,
  GetConsoleOutputCommand,
  RunInstancesCommand,
} from '@aws-sdk/client-ec2';
import { FileSystem } from 'aws-cdk-lib/core';
import { describe, expect, it } from 'vitest';
import { parseContext } from '../../cli/commands/rehearse.ts';
import {
  type AssemblyStack,
  choosePoolStack,
  patchTemplateForMoto,
  type Template,
  verifyAssetHashes,
} from '../../cli/rehearse/assembly.ts';
import { findCdkCli } from '../../cli/rehearse/cdkCli.ts';
import type { DeployedFunction } from '../../cli/rehearse/deployed.ts';
import { rateSeconds } from '../../cli/rehearse/deployed.ts';
import { Ec2Proxy, MADE_UP_NOTICE, translateForm } from '../../cli/rehearse/ec2Proxy.ts';
import { stateChanges } from '../../cli/rehearse/eventSources.ts';
import { FunctionPool, type FunctionProcess } from '../../cli/rehearse/lambdaRuntime.ts';
import { connectMotoServer, MOTO_CREDENTIALS, startMotoServer } from '../../cli/rehearse/motoServer.ts';
import { mapConfigText, reachabilityWarnings } from '../../cli/rehearse/network.ts';
import { Rehearsal } from '../../cli/rehearse/rehearsal.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { parseConsoleHostKeys } from '../../shared/providers/aws/consoleHostKeys.ts';
import { STACK_OUTPUTS } from '../../shared/runtime/stackOutputs.ts';
import { poolConfig } from '../../testkit/configs.ts';

/**
 * The parts of `metastatic rehearse` (cli/rehearse/) that need no moto: what it makes of an assembly, of
 * a configuration and of moto's instance states, and its errors before anything is started. The
 * rehearsal itself runs in test/aws/deploy.moto.test.ts and, installed, in test/package/package.test.ts.
 */

const poolOutputs = Object.fromEntries(Object.values(STACK_OUTPUTS).map((k) => [k, { Value: k }]));
const stack = (stackName: string, outputs: Template['Outputs'] = {}): AssemblyStack => ({
  id: stackName,
  stackName,
  templateFile: `${stackName}.template.json`,
  template: { Resources: {}, Outputs: outputs },
});

describe('the EC2 events the rehearsal publishes for a change moto shows at once', () => {
  it('goes through the states EC2 would have published', () => {
    expect(stateChanges(undefined, 'running')).toEqual(['pending', 'running']);
    expect(stateChanges(undefined, 'terminated')).toEqual([
      'pending',
      'running',
      'shutting-down',
      'terminated',
    ]);
    expect(stateChanges('running', 'terminated')).toEqual(['shutting-down', 'terminated']);
    expect(stateChanges('pending', 'running')).toEqual(['running']);
    expect(stateChanges('running', 'stopped')).toEqual(['stopping', 'stopped']);
    expect(stateChanges('stopped', 'running')).toEqual(['pending', 'running']);
    expect(stateChanges('running', 'running')).toEqual([]);
  });
});

describe('the configuration the functions run with in the rehearsal', () => {
  it("names moto's ids for the configuration's, whole ids only, comments and layout kept", () => {
    const text = [
      'subnet-ids: [subnet-1, subnet-12] # tried in order',
      'security-group-id: sg-1',
      'image-id: ami-1',
      'userdata: "echo subnet-123"',
    ].join('\n');
    const ids = new Map([
      ['subnet-1', 'subnet-aaa'],
      ['subnet-12', 'subnet-bbb'],
      ['sg-1', 'sg-ccc'],
      ['ami-1', 'ami-ddd'],
    ]);
    expect(mapConfigText(text, ids)).toBe(
      [
        'subnet-ids: [subnet-aaa, subnet-bbb] # tried in order',
        'security-group-id: sg-ccc',
        'image-id: ami-ddd',
        'userdata: "echo subnet-123"',
      ].join('\n'),
    );
  });
});

/** A stand-in for moto's EC2: records each form it is sent, answers with `answer(action)`. */
async function fakeMoto(answer: (form: URLSearchParams) => string) {
  const forms: URLSearchParams[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      expect(Number(req.headers['content-length'])).toBe(Buffer.byteLength(body));
      const form = new URLSearchParams(body);
      forms.push(form);
      res.writeHead(200, { 'content-type': 'text/xml' });
      res.end(answer(form));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const endpoint = `http://localhost:${(server.address() as AddressInfo).port}`;
  return { endpoint, forms, close: () => new Promise<void>((r) => server.close(() => r())) };
}

const EC2_NS = 'http://ec2.amazonaws.com/doc/2016-11-15/';
const consoleAnswer = (instanceId: string, text: string) =>
  `<GetConsoleOutputResponse xmlns="${EC2_NS}"><requestId>r</requestId><instanceId>${instanceId}</instanceId><timestamp>2026-01-01T00:00:00.000Z</timestamp><output>${Buffer.from(text).toString('base64')}</output></GetConsoleOutputResponse>`;

describe("the rehearsal's EC2 proxy (issue 40, defect 7)", () => {
  const ids = new Map([
    ['subnet-0a1b2c3d4e5f60718', 'subnet-moto1'],
    ['sg-0123456789abcdef0', 'sg-moto2'],
    ['ami-0c1bc246476a5572b', 'ami-moto3'],
  ]);

  it("translates request values naming the configuration's ids to moto's, whole values only", () => {
    const form = new URLSearchParams({
      Action: 'RunInstances',
      SubnetId: 'subnet-0a1b2c3d4e5f60718',
      'SecurityGroupId.1': 'sg-0123456789abcdef0',
      ImageId: 'ami-0c1bc246476a5572b',
      UserData: 'c3VibmV0LTBhMWIyYzNkNGU1ZjYwNzE4', // base64 of a subnet id: left alone
      'TagSpecification.1.Tag.1.Value': 'subnet-0a1b2c3d4e5f60718-not',
    });
    const sent = new URLSearchParams(translateForm(form, ids));
    expect(Object.fromEntries(sent)).toEqual({
      Action: 'RunInstances',
      SubnetId: 'subnet-moto1',
      'SecurityGroupId.1': 'sg-moto2',
      ImageId: 'ami-moto3',
      UserData: 'c3VibmV0LTBhMWIyYzNkNGU1ZjYwNzE4',
      'TagSpecification.1.Tag.1.Value': 'subnet-0a1b2c3d4e5f60718-not',
    });
    expect(translateForm(new URLSearchParams({ Action: 'DescribeInstances' }), ids)).toBeUndefined();
    expect(translateForm(form, new Map())).toBeUndefined();
  });

  it("gives the functions the configuration's ids both ways, and announces the host-key block it makes up", async () => {
    const moto = await fakeMoto((form) => {
      switch (form.get('Action')) {
        case 'DescribeImages':
          return `<DescribeImagesResponse xmlns="${EC2_NS}"><requestId>r</requestId><imagesSet><item><imageId>ami-moto3</imageId><name>rehearsal ami-0c1bc246476a5572b</name></item></imagesSet></DescribeImagesResponse>`;
        case 'RunInstances':
          return `<RunInstancesResponse xmlns="${EC2_NS}"><requestId>r</requestId><reservationId>r-1</reservationId><instancesSet><item><instanceId>i-0aaaabbbbccccdddd</instanceId><imageId>ami-moto3</imageId><subnetId>subnet-moto1</subnetId><vpcId>vpc-moto</vpcId></item></instancesSet></RunInstancesResponse>`;
        default:
          return consoleAnswer(form.get('InstanceId') ?? '', '[    0.000000] Linux version 6.1\r\n');
      }
    });
    const proxy = await Ec2Proxy.start({ motoEndpoint: moto.endpoint, ids });
    const ec2 = new EC2Client({
      endpoint: proxy.endpoint,
      region: 'eu-west-1',
      credentials: MOTO_CREDENTIALS,
    });
    try {
      const images = await ec2.send(new DescribeImagesCommand({ ImageIds: ['ami-0c1bc246476a5572b'] }));
      expect(moto.forms[0]?.get('ImageId.1')).toBe('ami-moto3');
      expect(images.Images?.[0]?.ImageId).toBe('ami-0c1bc246476a5572b');
      const run = await ec2.send(
        new RunInstancesCommand({
          MinCount: 1,
          MaxCount: 1,
          ImageId: 'ami-0c1bc246476a5572b',
          SubnetId: 'subnet-0a1b2c3d4e5f60718',
          SecurityGroupIds: ['sg-0123456789abcdef0'],
        }),
      );
      expect(Object.fromEntries(moto.forms[1] ?? [])).toMatchObject({
        ImageId: 'ami-moto3',
        SubnetId: 'subnet-moto1',
        'SecurityGroupId.1': 'sg-moto2',
      });
      expect(run.Instances?.[0]).toMatchObject({
        ImageId: 'ami-0c1bc246476a5572b',
        SubnetId: 'subnet-0a1b2c3d4e5f60718',
        VpcId: 'vpc-moto', // not one the configuration names
      });

      const id = 'i-0aaaabbbbccccdddd';
      const out = await ec2.send(new GetConsoleOutputCommand({ InstanceId: id, Latest: true }));
      const text = Buffer.from(out.Output ?? '', 'base64').toString('utf8');
      // moto's own output first, then the block, announced as made up, as cloud-init writes it.
      expect(text.startsWith('[    0.000000] Linux version 6.1\r\n')).toBe(true);
      expect(text).toContain(`ec2: ${MADE_UP_NOTICE}\r\nec2: -----BEGIN SSH HOST KEY KEYS-----`);
      expect(parseConsoleHostKeys(text)).toEqual({ kind: 'keys', keys: [proxy.hostKey(id)] });
    } finally {
      ec2.destroy();
      await proxy.stop();
    }

    // --no-console-keys: moto's console as it is, so host-keys: console finds nothing (as for an image
    // that prints no keys).
    const plain = await Ec2Proxy.start({ motoEndpoint: moto.endpoint, consoleHostKeys: false });
    const ec2b = new EC2Client({
      endpoint: plain.endpoint,
      region: 'eu-west-1',
      credentials: MOTO_CREDENTIALS,
    });
    try {
      const out = await ec2b.send(new GetConsoleOutputCommand({ InstanceId: 'i-0aaaabbbbccccdddd' }));
      const text = Buffer.from(out.Output ?? '', 'base64').toString('utf8');
      expect(text).toBe('[    0.000000] Linux version 6.1\r\n');
      expect(parseConsoleHostKeys(text)).toEqual({ kind: 'none' });
    } finally {
      ec2b.destroy();
      await plain.stop();
      await moto.close();
    }
  });
});

describe("the functions' code the rehearsal runs (issue 40, defect 7)", () => {
  it('is verified against its asset hash: what cdk deploy uploads, unchanged', () => {
    const dir = mkdtempSync(join(tmpdir(), 'metastatic-assets-'));
    try {
      const made = join(dir, 'bundle');
      mkdirSync(made);
      writeFileSync(join(made, 'index.js'), 'exports.handler = async () => 1;\n');
      writeFileSync(join(made, 'metastatic.yaml'), 'providers: []\n');
      // As CDK names a bundled asset hashed by its output.
      const hash = FileSystem.fingerprint(made, { exclude: ['.is_custom_resource'] });
      const asset = join(dir, `asset.${hash}`);
      mkdirSync(asset);
      writeFileSync(join(asset, 'index.js'), 'exports.handler = async () => 1;\n');
      writeFileSync(join(asset, 'metastatic.yaml'), 'providers: []\n');
      const root = resolve(import.meta.dirname, '..', '..');
      expect(verifyAssetHashes([asset, asset], [root])).toEqual({
        verified: [`asset.${hash}`],
        problems: [],
      });
      // A configuration rewritten in the asset (what the rehearsal did before): not what cdk uploads.
      writeFileSync(join(asset, 'metastatic.yaml'), 'providers: [] # subnet-moto1\n');
      expect(verifyAssetHashes([asset], [root]).problems).toEqual([
        expect.stringMatching(
          new RegExp(`^asset\\.${hash}: its content hashes to [0-9a-f]{64}, not to its name$`),
        ),
      ]);
      expect(verifyAssetHashes([made], [root]).problems).toEqual([
        'bundle: not an asset directory named by its hash',
      ]);
      expect(verifyAssetHashes([asset], ['/']).problems).toEqual([
        `asset.${hash}: not checked (no aws-cdk-lib found to compute the fingerprint)`,
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('more than one invocation of a function at once (issue 40, defect 7)', () => {
  /**
   * Containers that take `ms` per invocation, one at a time each (as FunctionProcess), counting how many
   * invocations run at once across them.
   */
  const containers = (ms: number) => {
    let running = 0;
    let most = 0;
    const made: string[] = [];
    const make = () => {
      const name = `c${made.length}`;
      made.push(name);
      let queue: Promise<unknown> = Promise.resolve();
      const run = async (event: unknown) => {
        running++;
        most = Math.max(most, running);
        await new Promise((r) => setTimeout(r, ms));
        running--;
        return `${name}:${String(event)}`;
      };
      return {
        invoke: (event: unknown) => {
          const next = queue.then(() => run(event));
          queue = next.catch(() => undefined);
          return next;
        },
        stop: async () => undefined,
      } as unknown as FunctionProcess;
    };
    return { make, made, most: () => most };
  };
  const fn = { functionName: 'request' } as DeployedFunction;

  it('runs overlapping invocations in up to `size` containers, started as needed, and queues past that', async () => {
    const c = containers(30);
    const pool = new FunctionPool(fn, 2, c.make);
    expect(await pool.invoke('a')).toBe('c0:a'); // one at a time: one container
    expect(pool.started).toBe(1);
    const results = await Promise.all(['b', 'c', 'd', 'e'].map((e) => pool.invoke<string>(e)));
    expect(results.map((r) => r.split(':')[1])).toEqual(['b', 'c', 'd', 'e']);
    expect(pool.started).toBe(2);
    expect(c.most()).toBe(2);
    expect(pool.peak).toBe(2);
    expect(() => new FunctionPool(fn, 0, c.make)).toThrow('a function has 1 container or more, not 0');
  });
});

describe('what the rehearsal warns of', () => {
  const config = (pool: string) =>
    parseConfigOrThrow(
      poolConfig({
        backing: {
          driver: 'aws',
          provider: { region: 'eu-west-1' },
          pool: { 'subnet-id': 'subnet-1', ...(pool ? { 'public-ipv4': true } : {}) },
          labels: [{ name: 'big', 'instance-type': 'm7g.2xlarge', 'image-id': 'ami-1' }],
        },
        meta: { labels: [{ name: 'small', 'backing-label': 'big' }] },
      }),
      'pool.yaml',
    );

  it("functions that would connect to moto's instances (which are no machines), and nothing otherwise", () => {
    expect(reachabilityWarnings(config(''), false)).toEqual([]);
    expect(reachabilityWarnings(config('public'), false)).toEqual([
      expect.stringMatching(
        /^the functions connect to the instances of ec2\/main\/big \(public-ipv4 or host-keys: scan\)/,
      ),
    ]);
    expect(reachabilityWarnings(config(''), true)).toEqual([
      expect.stringContaining('(the functions run in the instances’ VPC)'),
    ]);
  });
});

describe('the assembly the rehearsal deploys', () => {
  it('takes the only stack that holds a pool, or the one named, and says which there are otherwise', () => {
    const pool = stack('CiPool', poolOutputs);
    const other = stack('Network');
    expect(choosePoolStack([other, pool])).toBe(pool);
    expect(choosePoolStack([other, pool], 'CiPool')).toBe(pool);
    expect(() => choosePoolStack([other])).toThrow(
      'the app has no stack with a MetastaticPool that publishes its outputs (its stacks: Network)',
    );
    expect(() => choosePoolStack([pool, stack('Second', poolOutputs)])).toThrow(
      'the app has several pool stacks (CiPool, Second): name the one to rehearse',
    );
    expect(() => choosePoolStack([other, pool], 'Network')).toThrow(
      'stack Network holds no MetastaticPool that publishes its outputs (stacks that do: CiPool)',
    );
    expect(() => choosePoolStack([other, pool], 'Nope')).toThrow(
      'the app has no stack Nope (its stacks: Network, CiPool)',
    );
  });

  it("replaces the dashboard's references to alarms (which moto does not create) with the alarms' ARNs", () => {
    const template: Template = {
      Resources: {
        Alarm1: { Type: 'AWS::CloudWatch::Alarm', Properties: {} },
        Queue: { Type: 'AWS::SQS::Queue', Properties: {} },
        Dashboard: {
          Type: 'AWS::CloudWatch::Dashboard',
          Properties: {
            DashboardBody: {
              'Fn::Join': [
                '',
                ['{"alarms":["', { 'Fn::GetAtt': ['Alarm1', 'Arn'] }, '"],"q":"', { Ref: 'Queue' }],
              ],
            },
          },
        },
      },
      Outputs: { A: { Value: { Ref: 'Alarm1' } } },
    };
    expect(patchTemplateForMoto(template)).toBe(2);
    const dashboard = template.Resources?.Dashboard?.Properties?.DashboardBody;
    const body = (dashboard as { 'Fn::Join': [string, unknown[]] })['Fn::Join'][1];
    expect(body[1]).toEqual({
      'Fn::Join': [
        '',
        [
          'arn:',
          { Ref: 'AWS::Partition' },
          ':cloudwatch:',
          { Ref: 'AWS::Region' },
          ':',
          { Ref: 'AWS::AccountId' },
          ':alarm:Alarm1',
        ],
      ],
    });
    expect(body[3]).toEqual({ Ref: 'Queue' });
    expect(template.Outputs?.A?.Value).toBe('Alarm1');
  });

  it("reads the reaper's rate from its schedule expression", () => {
    expect(rateSeconds('rate(1 minute)')).toBe(60);
    expect(rateSeconds('rate(5 minutes)')).toBe(300);
    expect(rateSeconds('rate(2 hours)')).toBe(7200);
    expect(rateSeconds('cron(0 * * * ? *)')).toBeUndefined();
  });
});

describe('metastatic rehearse refuses, saying why', () => {
  it('a context option that is not key=value', () => {
    expect(parseContext(['config=a.yaml', 'x=1=2'])).toEqual({ config: 'a.yaml', x: '1=2' });
    expect(() => parseContext(['config'])).toThrow('--context config: give key=value');
  });

  it('a moto_server that is not installed', async () => {
    await expect(startMotoServer({ command: 'moto_server_not_installed_here' })).rejects.toThrow(
      "moto_server_not_installed_here is not installed (not found on PATH); install it with: pip install 'moto[server]'",
    );
  });

  it('a port in use, and an endpoint where no moto answers', async () => {
    // Something else on the port: an HTTP server that is not moto.
    const server: Server = createServer((_req, res) => {
      res.writeHead(404);
      res.end('not moto');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    try {
      await expect(startMotoServer({ port })).rejects.toThrow(
        `port ${port} is in use: give another --port, or leave it out for a free one`,
      );
      await expect(connectMotoServer(`http://localhost:${port}`)).rejects.toThrow(
        `no moto_server answers at http://localhost:${port}`,
      );
    } finally {
      server.close();
    }
    await expect(connectMotoServer('localhost:5000')).rejects.toThrow('give an http:// URL');
  });

  it('a directory with no CDK app, before starting anything', async () => {
    const empty = mkdtempSync(join(tmpdir(), 'metastatic-no-app-'));
    try {
      await expect(Rehearsal.start({ cwd: empty })).rejects.toThrow(
        `no CDK app in ${empty}: run this in your CDK app's directory (where its cdk.json is), or give --app`,
      );
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  });

  it('a directory with no CDK CLI installed', () => {
    expect(() => findCdkCli(['/'])).toThrow(
      'the AWS CDK CLI is not installed in /: the rehearsal deploys your app with it',
    );
  });
});

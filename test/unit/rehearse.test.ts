import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseContext } from '../../cli/commands/rehearse.ts';
import {
  type AssemblyStack,
  choosePoolStack,
  patchTemplateForMoto,
  type Template,
} from '../../cli/rehearse/assembly.ts';
import { findCdkCli } from '../../cli/rehearse/cdkCli.ts';
import { rateSeconds } from '../../cli/rehearse/deployed.ts';
import { stateChanges } from '../../cli/rehearse/eventSources.ts';
import { connectMotoServer, startMotoServer } from '../../cli/rehearse/motoServer.ts';
import { mapConfigText, reachabilityWarnings } from '../../cli/rehearse/network.ts';
import { Rehearsal } from '../../cli/rehearse/rehearsal.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
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

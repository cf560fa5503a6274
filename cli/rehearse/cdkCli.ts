import { execFile } from 'node:child_process';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { RehearsalError } from './errors.ts';

/**
 * The AWS CDK CLI (`aws-cdk`) the rehearsal synthesizes, bootstraps, deploys and destroys with: the one
 * installed in the app's project (a CDK app's own dev dependency), else the one beside this package (a
 * clone of this repository has it in its dev dependencies).
 */
export function findCdkCli(dirs: readonly string[]): string {
  for (const dir of dirs) {
    try {
      return createRequire(join(dir, 'noop.js')).resolve('aws-cdk/bin/cdk');
    } catch {
      // not installed there
    }
  }
  throw new RehearsalError(
    `the AWS CDK CLI is not installed in ${dirs[0]}: the rehearsal deploys your app with it, as \`cdk deploy\` ` +
      'would (npm i -D aws-cdk)',
  );
}

export interface CdkRun {
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

export interface CdkOptions {
  readonly cwd: string;
  readonly env: NodeJS.ProcessEnv;
  readonly timeoutMs?: number;
}

/** Runs the CDK CLI (`--no-notices --ci`); rejects with the end of its output when it fails. */
export function runCdk(cli: string, args: readonly string[], options: CdkOptions): Promise<CdkRun> {
  const started = Date.now();
  return new Promise((done, fail) => {
    execFile(
      process.execPath,
      [cli, ...args, '--no-notices', '--ci'],
      {
        cwd: options.cwd,
        env: options.env,
        timeout: options.timeoutMs ?? 600_000,
        maxBuffer: 64 * 1024 * 1024,
      },
      (err, stdout, stderr) => {
        if (!err) {
          done({ stdout, stderr, ms: Date.now() - started });
          return;
        }
        const output = `${stdout}\n${stderr}`.trim().split('\n').slice(-40).join('\n');
        const why = (err as NodeJS.ErrnoException & { killed?: boolean }).killed
          ? `timed out after ${Math.round((options.timeoutMs ?? 600_000) / 1000)} s`
          : `exit ${String((err as { code?: unknown }).code ?? err.message)}`;
        fail(new RehearsalError(`cdk ${args[0] ?? ''} failed (${why}):\n${output}`, { cause: err }));
      },
    );
  });
}

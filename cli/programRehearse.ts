/** `metastatic rehearse` (registered by program.ts; its work is in commands/rehearse.ts). */
import { type Command, Option } from 'commander';
import { positiveSeconds, whole } from './options.ts';

export function addRehearse(program: Command): void {
  program
    .command('rehearse')
    .description(
      'deploy your CDK app (one that embeds MetastaticPool) to moto_server and run its functions here, as Lambda would, until Ctrl-C',
    )
    .argument('[stack]', "the stack to rehearse (default: the app's only stack with a pool)")
    .option(
      '--app <command|dir>',
      "the CDK app, as `cdk --app` takes it: a command, or a cloud assembly directory (default: cdk.json's)",
    )
    .option(
      '-c, --context <key=value>',
      "context for `cdk synth`; repeatable (e.g. -c config=my-pool.yaml for this repository's app)",
      (v: string, all: string[] = []) => [...all, v],
    )
    .option('--endpoint <url>', 'use the moto_server running there (default: start one)')
    .option(
      '--port <n>',
      'the port of the moto_server started (default: a free one)',
      whole('--port', 'a port number (1-65535)', 1, 65535),
    )
    .option(
      '--reaper-interval <seconds>',
      "seconds between reaper runs (default: the deployed schedule's rate)",
      positiveSeconds('--reaper-interval'),
    )
    .option(
      '--concurrency <n>',
      "invocations of the request and of the fulfil function that may run at once, each in a process of its own (default 2; at most each mapping's maxConcurrency)",
      whole('--concurrency', 'a whole number from 1 to 64', 1, 64),
    )
    .option(
      '--no-console-keys',
      "leave moto's console output as it is, with no made-up SSH host-key block: rehearses an image that prints none (with host-keys: console its backing nodes fail at boot-timeout)",
    )
    .addOption(
      new Option('--log-level <level>', "the functions' log level (their logs go to stderr)")
        .choices(['debug', 'info', 'warn', 'error'])
        .default('warn'),
    )
    .option('--json', 'print progress as JSON lines on stdout (one object each)')
    .addHelpText(
      'after',
      [
        '',
        "It synthesizes the app and deploys it with the CDK CLI (the app's own aws-cdk, else this package's),",
        "into moto_server (pip install 'moto[server]'), then runs the deployed functions' code on this machine:",
        "polling the deployed queues as Lambda's event source mappings do (batches, partial batch failures,",
        'visibility timeouts), the reaper on its schedule, and the EC2 state-change events EventBridge would',
        "deliver as moto's instances change state. It prints what to type in another shell (aws sqs",
        'send-message, metastatic --stack ... status --watch, with the endpoint settings) and runs until Ctrl-C,',
        'then stops moto (or, with --endpoint, destroys the stack). The code it runs is the code cdk deploy',
        "uploads (checked against its asset hashes); moto's consoles get a made-up SSH host-key block, said",
        'to be made up (--no-console-keys: none). What it proves and what it cannot (IAM, real timing, real',
        'capacity, your image): printed when it is up, and in docs/deploy.md.',
        '',
        'Examples:',
        "  metastatic rehearse                                  in your CDK app's directory (its cdk.json)",
        '  metastatic rehearse --app "node out/app.js" CiPool   a compiled app, one of its stacks',
        "  metastatic rehearse -c config=my-pool.yaml           this repository's app (bin/cdk.ts)",
        '  metastatic rehearse --endpoint http://localhost:5000 --reaper-interval 5 --json',
        '  metastatic rehearse --no-console-keys               an image that prints no host keys',
      ].join('\n'),
    )
    .action(async (stack: string | undefined, opts) => {
      const { rehearse } = await import('./commands/rehearse.ts');
      await rehearse(stack, opts);
    });
}

/** The commands that run jobs on nodes: ssh, run and inventory (registered by program.ts). */
import type { Command } from 'commander';
import { MAX_LEASE, MIN_LEASE } from '../shared/core/leases.ts';
import type { Target } from './client.ts';
import { leaseSeconds, requestOptions, seconds } from './options.ts';

export function addJobCommands(program: Command, target: () => Promise<Target>): void {
  program
    .command('ssh')
    .description(
      "log in to a node with OpenSSH's ssh, or run COMMAND there; exits with ssh's exit status (the command's)",
    )
    .argument('<node-id>', 'the node id (<request-id>/<index>)')
    .argument('[command...]', 'after --: the remote command and its arguments (no local shell reads them)')
    .option(
      '-i, --identity <file>',
      "private key to log in with (default: the embedded pool's client key, <state-dir>/client_ed25519; required with --stack)",
    )
    .option('-l, --user <name>', "log in as this user (default: the node's username)")
    .option('--timeout <seconds>', 'wait this long for a pending node to be ready', seconds('--timeout'), 300)
    .addHelpText(
      'after',
      [
        '',
        'The host is verified: ssh runs with StrictHostKeyChecking=yes and a known_hosts written for this',
        "call from the node's recorded host keys (never your own ~/.ssh/known_hosts), IdentitiesOnly=yes,",
        'no password. A released, failed or unknown node is refused with the reason.',
        '',
        'Examples:',
        '  metastatic ssh req-1/0                    an interactive shell on the node',
        '  metastatic ssh req-1/0 -- uname -a        run a command; its exit status is this one',
        '  metastatic --stack pool ssh req-1/0 -i ~/.ssh/ci_ed25519 -- make test',
      ].join('\n'),
    )
    .action(async (nodeId: string, command: string[], opts) => {
      const { ssh } = await import('./commands/ssh.ts');
      await ssh(await target(), nodeId, command, opts);
    });

  requestOptions(
    program
      .command('run')
      .description(
        "request nodes, run COMMAND on the first over SSH, release them whatever happens; exits with the command's status",
      )
      .argument('[labels...]', 'labels to request (or a shape), then -- and the command with its arguments')
      .usage('[options] [labels...] -- command [args...]'),
    'the command will run',
  )
    .option(
      '--lease <seconds>',
      `client lease, renewed every third of it while the command runs (${MIN_LEASE} to ${MAX_LEASE}, default 60)`,
      leaseSeconds,
    )
    .option(
      '--timeout <seconds>',
      'give up waiting for the nodes after this many seconds',
      seconds('--timeout'),
      300,
    )
    .option(
      '-i, --identity <file>',
      "private key to log in with (default: the embedded pool's client key; required with --stack)",
    )
    .option('-l, --user <name>', "log in as this user (default: the node's username)")
    .option('-q, --quiet', 'no progress lines on stderr (errors are still printed)')
    .option(
      '--attach',
      'with --id: run on a request of that id already in the table, and release it after (refused otherwise)',
    )
    .addHelpText(
      'after',
      [
        '',
        'Everything after -- is the command, passed to the node as one shell-quoted command line: each',
        'argument reaches it exactly as given (no local shell reads it; spaces, quotes, $ and ; stay as they',
        'are; an argument that is not UTF-8 is refused: pass binary data on stdin or in a file). Use sh -c',
        "'...' for shell syntax. stdin, stdout and stderr are the command's, byte for byte;",
        "metastatic's own progress goes to stderr only. Logging in is as `metastatic ssh` does it (host",
        "verified from the node's record, StrictHostKeyChecking=yes, the pool's client key).",
        '',
        'The request always takes a lease (--lease, default 60 s), renewed while the command runs: if this',
        'process is killed (kill -9), the nodes are released within the lease plus one reaper interval.',
        'Whatever happens (the command exits, an error, Ctrl-C, SIGTERM, SIGHUP) the request is released.',
        'With several labels the command runs on the first node; every node is listed in',
        '$METASTATIC_NODES on the node (a line each: id host port username, the first one first), the',
        'request id is in $METASTATIC_REQUEST_ID, and the other nodes are printed on stderr.',
        '',
        'Exit status:',
        "  0-255  the command's own (128+n when a signal n killed it; 255 when ssh itself failed)",
        '  2      usage: bad options, no command after --, labels the pool does not have, an --id already',
        '         in the table (without --attach), an argument that is not UTF-8',
        '  123    the pool stopped, or ended the node (released elsewhere, lease lapsed), under the command',
        '  124    no node could be had: the request failed (its reason is printed) or --timeout passed',
        '  125    metastatic run failed before the command ran: no pool running, a key file others can read,',
        '         a node without host keys or that did not accept the login within 30 s, ssh not installed',
        '  128+n  this process got signal n (SIGINT 130, SIGTERM 143, SIGHUP 129); its nodes were released',
        '',
        'Examples:',
        "  metastatic run small-node -- sh -c 'echo hi; exit 3'        prints hi, exits 3",
        '  metastatic run --cores 2 --memory 4GiB --lease 120 -- make -j2 test',
        '  metastatic --stack pool run small-node -i ~/.ssh/ci_ed25519 -- ./ci.sh',
      ].join('\n'),
    )
    .action(async (operands: string[], opts) => {
      const { run } = await import('./commands/run.ts');
      const { labels, command } = splitCommand(operands, process.argv);
      await run(await target(), labels, command, opts);
    });

  program
    .command('inventory')
    .description(
      "print an Ansible inventory of a request's ready nodes (YAML, or JSON), and write the known_hosts it needs",
    )
    .argument('<request-id>', 'the request whose nodes to list')
    .option('--json', 'print the inventory as JSON (Ansible reads it from a file named *.json)')
    .option(
      '--known-hosts <file>',
      "write the nodes' host keys here, 0600 (default: <state-dir>/known_hosts.d/<request-id>; required with --stack)",
    )
    .option(
      '-i, --identity <file>',
      "private key the inventory logs in with (default: the embedded pool's client key; with --stack: none, ssh's own)",
    )
    .option(
      '--timeout <seconds>',
      'wait this long for a request still being served',
      seconds('--timeout'),
      300,
    )
    .option('--ready-only', 'leave released or failed nodes out (default: refuse a request that has any)')
    .addHelpText(
      'after',
      [
        '',
        'Each node is a host named after its node id (req-1/0 -> req-1-0), with ansible_host, ansible_port,',
        'ansible_user, ansible_connection, ansible_python_interpreter (python-path; auto = discovery),',
        'ansible_shell_type (shell-type, when set), ansible_ssh_private_key_file and a `metastatic` variable',
        '(node_id, request_id, label, slot, backing_node_id, attributes); one group per label (small-node ->',
        'small_node). The host is verified as `metastatic ssh` does it: ansible_ssh_common_args point ssh at',
        'the written known_hosts only (StrictHostKeyChecking=yes, never your ~/.ssh/known_hosts) and',
        'ansible_host_key_checking is true. Every string is marked !unsafe: Ansible never templates it.',
        'Progress and notes go to stderr; exit 1 for an unknown or failed request, 2 for a bad request id.',
        '',
        'Examples:',
        '  metastatic request small-node small-node --id job --wait',
        '  metastatic inventory job > inventory.yaml && ansible-playbook -i inventory.yaml site.yaml',
        '  metastatic --stack pool inventory job --known-hosts job.known_hosts -i ~/.ssh/ci_ed25519 --json > inv.json',
      ].join('\n'),
    )
    .action(async (requestId: string, opts) => {
      const { inventory } = await import('./commands/inventory.ts');
      await inventory(await target(), requestId, opts);
    });
}

/**
 * A command's operands split at the `--` that ended its options: the labels before it, the command after.
 * Commander drops that `--` from the operands; the first `--` of the command line whose rest is the
 * operands' tail is it (an earlier one was an option's value; later ones belong to the command).
 */
export function splitCommand(
  operands: readonly string[],
  argv: readonly string[],
): { labels: string[]; command: string[] } {
  for (let i = argv.indexOf('--'); i >= 0; i = argv.indexOf('--', i + 1)) {
    const rest = argv.slice(i + 1);
    const at = operands.length - rest.length;
    if (at >= 0 && rest.every((a, k) => operands[at + k] === a)) {
      return { labels: operands.slice(0, at), command: rest };
    }
  }
  return { labels: [...operands], command: [] };
}

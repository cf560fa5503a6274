#!/usr/bin/env bash
# prepare_exec of the metastatic GitLab custom executor: requests one node with a lease, waits until it
# is ready, and records in the job's state dir what run.sh and cleanup.sh need: the request id (written
# before the request is sent, so a prepare killed half-way is still released by cleanup), the node's
# address and user, and a known_hosts built from the node's recorded host keys.
#
# Then it logs in once (`true`), so that a node that does not take the login fails here, where the
# runner retries, and not in the job's first stage; each try bounded by ConnectTimeout, all of them by
# METASTATIC_CI_LOGIN_WAIT.
#
# Exit codes, as GitLab Runner reads them: BUILD_FAILURE_EXIT_CODE when the job asked for a label it may
# not have, or one the pool does not have (the job's fault: not retried); SYSTEM_FAILURE_EXIT_CODE when
# no node could be had or the configuration is wrong (the runner retries prepare, up to 3 attempts, each
# with a new TMPDIR, after running cleanup_exec for the failed one).
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh"

if ! state=$(state_dir); then
  say "TMPDIR is not the runner's job dir: run me as a GitLab custom executor's prepare_exec"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
if [ -z "${METASTATIC_STACK:-}" ] && [ -z "${METASTATIC_STATE_DIR:-}" ]; then
  say "set METASTATIC_STACK (a deployed pool) or METASTATIC_STATE_DIR (an embedded one) for the runner"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
if ! key=$(identity) || [ ! -r "$key" ]; then
  say "no readable private key for the nodes: set METASTATIC_IDENTITY for the runner"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi

label=${CUSTOM_ENV_METASTATIC_LABEL:-${METASTATIC_CI_LABEL:-small-node}}
if ! label_allowed "$label"; then
  say "$(printf 'this runner does not serve the label %q (METASTATIC_LABEL)' "$label")"
  exit "$BUILD_FAILURE_EXIT_CODE"
fi
lease=$(seconds "${METASTATIC_CI_LEASE:-}" 600)
# Unset: as long as the pool keeps the request (its request-timeout while it waits for room, launch-retries
# x (launch-timeout + boot-timeout) + 5 min once placed); a year is beyond any bound a configuration can
# give, so the pool's own deadline ends the request first, and the runner's prepare_exec_timeout anyway.
wait=$(seconds "${METASTATIC_CI_WAIT:-}" 31536000)
login_wait=$(seconds "${METASTATIC_CI_LOGIN_WAIT:-}" 60)

{ [ -d "$state" ] || mkdir -m 700 -- "$state"; } || exit "$SYSTEM_FAILURE_EXIT_CODE"
runner=$(digits "${CUSTOM_ENV_CI_RUNNER_ID:-}")
job=$(digits "${CUSTOM_ENV_CI_JOB_ID:-}")
request="gitlab-$runner-$job-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
printf '%s\n' "$request" >"$state/request" || exit "$SYSTEM_FAILURE_EXIT_CODE"

say "requesting a $label node for job $job (request $request, lease $lease s)"
# The lease runs from the request's arrival: count it from now, and renew it while the node is awaited.
date +%s >"$state/renewed"
renew_loop "$state" "$request" </dev/null >/dev/null 2>&1 &
renewer=$!
trap 'kill "$renewer" 2>/dev/null' EXIT
mst request "$label" --id "$request" --requestor "gitlab-runner/$runner/job/$job" \
  --lease "$lease" --wait --timeout "$wait" --json >"$state/request.json"
status=$?
if [ "$status" -eq 2 ]; then
  rm -f -- "$state/request" # refused before anything was sent
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
# A label the pool does not have is the job's fault, as one this runner does not serve: not retried.
if [ "$status" -ne 0 ] && node -e '
  const r = JSON.parse(require("node:fs").readFileSync(process.argv[1], "utf8"));
  process.exit(r.state === "failed" && /^unknown labels? /.test(r.reason) ? 0 : 1);
' "$state/request.json" 2>/dev/null; then
  say "$(printf 'the pool has no label %q (METASTATIC_LABEL)' "$label")"
  exit "$BUILD_FAILURE_EXIT_CODE"
fi
if [ "$status" -ne 0 ]; then
  say "no node for request $request (the reason is above); cleanup releases whatever was allocated"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi

# The node's record, checked field by field before any of it reaches a file a shell or ssh reads.
# shellcheck disable=SC2016 # JavaScript, with its own ${} templates: the shell must not expand them
if ! node -e '
  const fs = require("node:fs");
  const [state] = process.argv.slice(1);
  const r = JSON.parse(fs.readFileSync(`${state}/request.json`, "utf8"));
  const n = r.nodes && r.nodes[0];
  const fail = (why) => { process.stderr.write(`metastatic: ${why}\n`); process.exit(1); };
  if (r.state !== "fulfilled" || !n || n.state !== "ready") fail(`request ${r.id} is ${r.state}`);
  if (!/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\/(0|[1-9][0-9]{0,3})$/.test(n.id)) fail("bad node id");
  // Starting with a letter or a digit (or "::"): a host starting with "-" would be an option to ssh.
  const host = /^(?:[A-Za-z0-9][A-Za-z0-9._:-]{0,252}|::[0-9A-Fa-f:.]{0,251})$/;
  if (typeof n.host !== "string" || !host.test(n.host)) fail("bad host");
  if (!Number.isInteger(n.port) || n.port < 1 || n.port > 65535) fail("bad port");
  if (typeof n.username !== "string" || !/^[a-z_][a-z0-9_.-]{0,31}$/.test(n.username)) fail("bad username");
  const keys = Array.isArray(n.hostKeys) ? n.hostKeys : [];
  if (keys.length === 0 || !keys.every((k) => /^[a-z0-9@.-]{1,64} [A-Za-z0-9+\/=]{1,8192}$/.test(k)))
    fail(`node ${n.id} records no usable host keys: its host cannot be verified`);
  const name = n.port === 22 ? n.host : `[${n.host}]:${n.port}`;
  fs.writeFileSync(`${state}/known_hosts`, keys.map((k) => `${name} ${k}\n`).join(""), { mode: 0o600 });
  fs.writeFileSync(`${state}/node`, `${n.id}\n${n.host}\n${n.port}\n${n.username}\n`, { mode: 0o600 });
  process.stdout.write(`metastatic: node ${n.id} is ready: ${n.username}@${n.host} port ${n.port}\n`);
' "$state"; then
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi

# The first login: a node is recorded ready a moment before its host takes the login in (a local backing
# node told of its slots, an EC2 per-slot user made by cloud-init), so try until login_wait has passed.
if ! read_node "$state"; then
  say "cannot read back the node recorded in $state/node"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
deadline=$(($(date +%s) + login_wait))
while :; do
  ssh_node "$state" "$key" true </dev/null >/dev/null 2>"$state/login.log"
  [ "$?" -ne 255 ] && break # logged in (whatever `true` did)
  if [ "$(date +%s)" -ge "$deadline" ]; then
    say "node $node_id did not accept the login within $login_wait s: $(tail -n 1 -- "$state/login.log")"
    exit "$SYSTEM_FAILURE_EXIT_CODE"
  fi
  sleep 1
done

#!/usr/bin/env bash
# run_exec of the metastatic GitLab custom executor: `run.sh [run_args...] <script> <stage>`. Runs the
# script GitLab Runner generated for this stage on the node, with bash reading it from stdin over ssh
# (the generated script runs the job's commands with stdin from /dev/null, so they cannot eat it), and
# keeps the request's lease alive meanwhile.
#
# ssh is OpenSSH with what `metastatic ssh` passes (the host verified from the node's recorded keys, this
# key only, no password, the destination after `--`, a ConnectTimeout and keepalives: ssh_node in
# common.sh), but with the node read once by prepare.sh instead of once per stage: a stage costs an ssh
# handshake, not a CLI start and a store read (1-2 s each, 5 or more stages a job).
#
# Exit codes, as GitLab Runner reads them: 0; BUILD_FAILURE_EXIT_CODE when the script failed, with its
# status written to BUILD_EXIT_CODE_FILE (the job then fails with that exit code, and
# allow_failure:exit_codes works); SYSTEM_FAILURE_EXIT_CODE when ssh itself failed (255: the node is
# unreachable or gone). A script that exits 255 itself is reported as a system failure: ssh gives no way
# to tell the two apart.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh"

if [ "$#" -lt 2 ]; then
  say "usage: run.sh [args...] <script> <stage>"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
script=${*: -2:1}
stage=${*: -1}
if ! state=$(state_dir) || [ ! -f "$state/node" ] || [ ! -f "$state/request" ]; then
  say "no node was prepared for this job (stage $stage)"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
if ! read_node "$state"; then
  say "the node recorded for this job is not usable (stage $stage); ssh is not run"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
IFS= read -r request <"$state/request"
key=$(identity) || exit "$SYSTEM_FAILURE_EXIT_CODE"

# The renewer's output goes to a file: the runner reads this stage's output until every process
# holding its pipes has ended, and a sleeping renewer must not hold the stage open.
renew_loop "$state" "$request" </dev/null >/dev/null 2>&1 &
renewer=$!
stop_renewing() { kill "$renewer" 2>/dev/null; }
# Cancelled or timed out: the runner signals the whole process group (ssh too); stop, do not release:
# after_script and the failure uploads may still run on this node, and cleanup.sh releases it.
trap 'stop_renewing; exit "$SYSTEM_FAILURE_EXIT_CODE"' TERM INT

ssh_node "$state" "$key" bash <"$script"
status=$?
stop_renewing

if [ "$status" -eq 0 ]; then
  exit 0
fi
if [ "$status" -eq 255 ]; then
  say "ssh to node $node_id failed in stage $stage (see above); reported as a system failure"
  exit "$SYSTEM_FAILURE_EXIT_CODE"
fi
if [ -n "${BUILD_EXIT_CODE_FILE:-}" ]; then
  printf '%s\n' "$status" >"$BUILD_EXIT_CODE_FILE"
fi
exit "$BUILD_FAILURE_EXIT_CODE"

#!/usr/bin/env bash
# Runs a shell script on a metastatic node and releases the node whatever happens:
#
#   run-on-node.sh LABEL SCRIPT
#
# requests one LABEL node with a lease, waits for it, runs SCRIPT there with bash reading it from stdin
# (over `metastatic ssh`: the host verified from the node's record), renews the lease while it runs,
# and exits with the script's status. The EXIT trap releases the request on every way out: the script's
# end, an error, Ctrl-C, SIGTERM. If this shell is killed with SIGKILL, the lease frees the node.
# Against a deployed pool, export METASTATIC_STACK and METASTATIC_IDENTITY (the private key the nodes
# accept); against `metastatic dev`, run it where the dev's .metastatic is, or export METASTATIC_STATE_DIR.
set -u
if [ "$#" -ne 2 ]; then
  printf 'usage: %s LABEL SCRIPT\n' "$0" >&2
  exit 2
fi
label=$1
script=$2
lease=${METASTATIC_LEASE:-600}
identity=()
if [ -n "${METASTATIC_IDENTITY:-}" ]; then identity=(--identity "$METASTATIC_IDENTITY"); fi

request="shell-$(date +%s)-$$"
renewer=
finish() {
  status=$?
  trap - EXIT INT TERM
  if [ -n "$renewer" ]; then kill "$renewer" 2>/dev/null; fi
  metastatic release --request "$request" >/dev/null ||
    printf 'could not release %s: its lease (%s s) will\n' "$request" "$lease" >&2
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

metastatic request "$label" --id "$request" --lease "$lease" --wait >&2 || exit 1
# Renew at a third of the lease while the script runs; its output must not mix with the script's.
(while sleep $((lease / 3)); do metastatic renew "$request"; done) </dev/null >/dev/null 2>&1 &
renewer=$!

metastatic ssh "${identity[@]}" "$request/0" -- bash -s <"$script"

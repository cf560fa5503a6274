#!/usr/bin/env bash
# cleanup_exec of the metastatic GitLab custom executor: releases the job's whole request, whatever
# state prepare.sh left it in (waiting, pending, ready, never sent). Idempotent: run twice, or after a
# prepare that failed before requesting anything, it does nothing and exits 0. GitLab Runner ignores
# its exit status (it logs a warning); if it cannot release, the request's lease frees the node.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh"

if ! state=$(state_dir) || [ ! -f "$state/request" ]; then
  say "nothing to release"
  exit 0
fi
IFS= read -r request <"$state/request"
if ! request_id_ok "$request"; then
  say "the state file names no request; nothing released"
  exit 1
fi
# A request sent just before prepare was killed may not be recorded yet ("unknown request"): retry.
for attempt in 1 2 3; do
  if mst release --request "$request" --timeout 60; then
    rm -f -- "$state/request" "$state/node"
    exit 0
  fi
  [ "$attempt" -lt 3 ] && sleep 2
done
say "could not release request $request: its lease (${METASTATIC_CI_LEASE:-600} s) will"
exit 1

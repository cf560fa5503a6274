#!/bin/sh
# A stand-in for GitHub's actions runner, `run.sh --jitconfig ENCODED` (testkit/githubStandIn.ts): it reads
# the API's address and its name from the JIT configuration the stand-in API issued, reports that it
# started (as whom, where, with which configuration), takes its one job (waits until the test ends it)
# and exits, as a JIT runner does.
set -eu
if [ "${1:-}" != --jitconfig ] || [ -z "${2:-}" ]; then
  echo "usage: $0 --jitconfig ENCODED" >&2
  exit 2
fi
jit=$2
config=$(printf '%s' "$jit" | base64 -d)
field() { printf '%s' "$config" | sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p"; }
api=$(field api)
name=$(field name)
printf '{"user":"%s","home":"%s","cwd":"%s","jitconfig":"%s"}' "${USER:-}" "${HOME:-}" "$(pwd)" "$jit" |
  curl -sf -X POST -H 'content-type: application/json' --data-binary @- "$api/_standin/runners/$name/started"
curl -sf "$api/_standin/runners/$name/job" >/dev/null
echo "runner $name: job done"

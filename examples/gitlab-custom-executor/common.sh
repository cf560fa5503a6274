# shellcheck shell=bash
# Shared by the metastatic GitLab custom executor's drivers (config.sh, prepare.sh, run.sh, cleanup.sh).
# Sourced, never run. Settings come from the runner's own environment (the service's, not the job's):
#   METASTATIC_STACK       a deployed pool's stack name (the CLI reads it), or
#   METASTATIC_STATE_DIR   an embedded pool's state dir, absolute: the drivers run in a temporary dir
#   METASTATIC_IDENTITY    the private key the nodes accept (default with an embedded pool:
#                          $METASTATIC_STATE_DIR/client_ed25519; required with a stack)
#   METASTATIC_BIN         the metastatic command (default: metastatic on PATH)
#   METASTATIC_CI_LABEL    the label a job gets when it names none (default: small-node)
#   METASTATIC_CI_LABELS   if set, the only labels a job may name (space separated)
#   METASTATIC_CI_LEASE    seconds of lease the request takes; renewed while stages run (default: 600)
#   METASTATIC_CI_WAIT     seconds prepare waits for a node (default: as long as the pool keeps the
#                          request; the runner's prepare_exec_timeout bounds it)
#   METASTATIC_CI_CONNECT_TIMEOUT  seconds ssh may take to connect and shake hands (default: 20)
#   METASTATIC_CI_LOGIN_WAIT       seconds prepare waits for the node to accept the login (default: 60)
# What a job controls is only CUSTOM_ENV_*: here CUSTOM_ENV_METASTATIC_LABEL, checked against a pattern
# (and METASTATIC_CI_LABELS) before use, and never read by a shell as code.

set -u

# GitLab Runner sets these two for every driver call; the fallbacks are its values (command.go).
BUILD_FAILURE_EXIT_CODE=${BUILD_FAILURE_EXIT_CODE:-1}
SYSTEM_FAILURE_EXIT_CODE=${SYSTEM_FAILURE_EXIT_CODE:-2}

say() { printf 'metastatic: %s\n' "$*" >&2; }

# The metastatic CLI, as one word: the path is never split or globbed.
mst() { "${METASTATIC_BIN:-metastatic}" "$@"; }

# The job's state: a dir inside the TMPDIR the runner made for this job (mkdtemp, 0700, one per
# prepare attempt, deleted after cleanup_exec). Not keyed by CUSTOM_ENV_CI_JOB_ID: job variables can
# override predefined ones, so a job could name another job's file; TMPDIR is the runner's own.
state_dir() {
  if [ -z "${TMPDIR:-}" ] || [ ! -d "$TMPDIR" ]; then
    return 1
  fi
  printf '%s/metastatic' "$TMPDIR"
}

# Digits only, for ids that go into a request id (a job variable could set CI_JOB_ID to anything).
digits() {
  case $1 in
    '' | *[!0-9]*) printf 'x' ;;
    *) printf '%s' "$1" ;;
  esac
}

# A label a job may ask for: the configuration's name rule, and the runner's allow-list if it has one.
label_allowed() {
  local label=$1 allowed
  [[ $label =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]] || return 1
  [ -z "${METASTATIC_CI_LABELS:-}" ] && return 0
  for allowed in $METASTATIC_CI_LABELS; do
    [ "$allowed" = "$label" ] && return 0
  done
  return 1
}

# A request id as the CLI checks it (shared/core/ids.ts), so nothing else reaches `release --request`.
request_id_ok() { [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$ ]]; }

# A node's host as ssh and known_hosts take it (client/openssh.ts badHost): starting with a letter or a
# digit, or an IPv6 address starting `::`; never with `-`, which ssh would read as an option.
host_ok() { [[ $1 =~ ^([A-Za-z0-9][A-Za-z0-9._:-]{0,252}|::[0-9A-Fa-f:.]{0,251})$ ]]; }

# Reads the node prepare.sh recorded into node_id, host, port and user, and checks them again.
# shellcheck disable=SC2034 # node_id, host, port and user are the callers' (and ssh_node's)
read_node() {
  {
    IFS= read -r node_id
    IFS= read -r host
    IFS= read -r port
    IFS= read -r user
  } <"$1/node" || return 1
  host_ok "$host" && [[ $port =~ ^[1-9][0-9]{0,4}$ ]] && [[ $user =~ ^[a-z_][a-z0-9_.-]{0,31}$ ]]
}

# ssh to the node read by read_node, as `metastatic ssh` logs in: its recorded host keys the only known
# hosts, this key only, no password, no ssh configuration of the runner user's; the destination after
# `--`, so nothing in it is read as an option. ConnectTimeout bounds the connection and the SSH handshake
# (an address that never answers); ServerAlive* end a session whose node stops answering (60 s).
# Arguments: the state dir, the key, then the remote command.
ssh_node() {
  local state=$1 key=$2 connect
  shift 2
  connect=$(seconds "${METASTATIC_CI_CONNECT_TIMEOUT:-}" 20)
  [ "$connect" -gt 0 ] || connect=20
  ssh -F /dev/null -T -p "$port" -l "$user" -i "$key" \
    -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes \
    -o UserKnownHostsFile="$state/known_hosts" -o GlobalKnownHostsFile=/dev/null \
    -o UpdateHostKeys=no -o CheckHostIP=no -o PasswordAuthentication=no \
    -o KbdInteractiveAuthentication=no -o ConnectTimeout="$connect" \
    -o ServerAliveInterval=15 -o ServerAliveCountMax=4 \
    -- "$host" "$@"
}

# The private key ssh logs in with.
identity() {
  if [ -n "${METASTATIC_IDENTITY:-}" ]; then
    printf '%s' "$METASTATIC_IDENTITY"
  elif [ -z "${METASTATIC_STACK:-}" ] && [ -n "${METASTATIC_STATE_DIR:-}" ]; then
    printf '%s/client_ed25519' "$METASTATIC_STATE_DIR"
  else
    return 1
  fi
}

# A whole number of seconds from a setting, or the default.
seconds() {
  case ${1:-} in
    '' | *[!0-9]*) printf '%s' "$2" ;;
    *) printf '%s' "$1" ;;
  esac
}

# Renews the request's lease whenever a third of it has passed since the last renewal (`renewed` in the
# state dir: the time before the request was sent, then each renewal's), until killed. Run in the
# background by prepare.sh (the lease runs while a node is awaited) and run.sh (while a stage runs; a
# renewal due between stages is made at the next stage's start). It stays in the runner's process
# group, so the runner's SIGTERM/SIGKILL of a driver end it too: a dead runner renews nothing.
renew_loop() {
  local state=$1 request=$2 lease every now last nap=
  lease=$(seconds "${METASTATIC_CI_LEASE:-}" 600)
  every=$((lease / 3))
  # Stopped (SIGTERM from stop_renewing), the nap ends with it: no sleep outlives the stage.
  trap 'if [ -n "$nap" ]; then kill "$nap" 2>/dev/null; fi; exit 0' TERM
  while :; do
    now=$(date +%s)
    last=$(cat -- "$state/renewed" 2>/dev/null)
    case $last in '' | *[!0-9]*) last=0 ;; esac
    if [ $((now - last)) -ge "$every" ]; then
      if mst renew "$request" >/dev/null 2>>"$state/renew.log"; then
        printf '%s\n' "$now" >"$state/renewed"
        last=$now
      else
        last=$((now - every + (every > 3 ? every / 3 : 1))) # try again in a third of the period
      fi
    fi
    sleep $((last + every - now > 0 ? last + every - now : 1)) &
    nap=$!
    wait "$nap"
  done
}

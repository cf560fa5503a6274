/**
 * `metastatic-slot`: what a backing node runs, as root, to contain the jobs of its slots. A POSIX shell
 * program (util-linux `unshare`, `setpriv`, `mount`; Linux cgroups v2, or v1 with a v2 hierarchy beside
 * it), kept here as text so that every backing node that contains its slots runs the same lines: a
 * local backing node writes it beside its state file (shared/providers/local/slotIsolation.ts).
 *
 *   metastatic-slot setup NAME MILLICORES MEMORY_MIB PIDS    the slot's cgroup and its limits (0: none)
 *   metastatic-slot probe NAME MILLICORES MEMORY_MIB PIDS    what run needs, tried once (a backing node's start)
 *   metastatic-slot run NAME UID GID DIR TMP USER -- CMD...  CMD in the slot (below)
 *   metastatic-slot kill NAME                                every process in the slot's cgroup ends
 *   metastatic-slot remove NAME                              kill, then the cgroup goes
 *   metastatic-slot run-rootless DIR TMP USER HIDE -- CMD... CMD in the slot, without root (below)
 *   metastatic-slot boot CONF                                an EC2 instance's slots, once at its boot
 *   metastatic-slot pam CONF                                 a login's session into its slot (pam_exec)
 *
 * `run` joins the slot's cgroup, then, in new mount and PID namespaces, mounts a tmpfs on /home with the
 * slot's directory at /home/USER, binds TMP on /tmp and /var/tmp, mounts /proc for the namespace (the job
 * sees its own processes only) and execs CMD as UID:GID with no supplementary groups, no capabilities
 * and no_new_privs, in /home/USER. The namespace's first process is the session's: when it ends (the
 * session closes, the node is released), the kernel ends every process left in the namespace, `setsid`
 * or not. A job over its MEMORY_MIB is killed by the kernel's OOM killer within its own cgroup.
 *
 * On an EC2 instance (an aws label with `isolation: contain`; shared/providers/aws/slotBoot.ts writes the
 * program, CONF and the PAM and sshd lines through cloud-init) sshd is the door, not `run`: `boot` makes
 * each slot of CONF (a line `PREFIX SLOTS MILLICORES MEMORY_MIB PIDS IMDS`: users PREFIX-0 ...) a user
 * of its own with a 0700 home, in the group sshd's Match names,
 * its cgroup and limits, blocks the instance metadata service for the users whose IMDS is 0 (nftables,
 * else iptables), gives each user a /tmp, /var/tmp and /dev/shm of its own through pam_namespace
 * (namespace.d/metastatic.conf), remounts /proc with hidepid=2, and only then marks the instance booted.
 * `pam`, run by pam_exec when sshd opens a session, moves the session's sshd process (its parent) into
 * the user's slot cgroup, so that everything the session starts is held by the slot's limits; it refuses
 * a slot user's session before `boot` has finished.
 */
export const SLOT_PROGRAM = `#!/bin/sh
# metastatic-slot (shared/providers/slot/slotProgram.ts): contains the jobs of a backing node's slots.
set -eu
CGROUP_ROOT=\${METASTATIC_CGROUP_ROOT:-/sys/fs/cgroup}
RUN_DIR=\${METASTATIC_RUN_DIR:-/run/metastatic}
NAMESPACE_D=\${METASTATIC_NAMESPACE_D:-/etc/security/namespace.d}
PARENT=metastatic
die() { printf 'metastatic-slot: %s\\n' "$*" >&2; exit 125; }
word_ok() { case $1 in '' | .* | *[!A-Za-z0-9._-]*) return 1 ;; esac; }
num_ok() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }
v2() { [ -f "$CGROUP_ROOT/cgroup.controllers" ]; }
# The slot's cgroups: one with cgroup v2; with v1, one per controller used, and one in the v2 hierarchy
# of a hybrid system (its cgroup.kill ends them all at once).
slot_groups() {
  if v2; then
    echo "$CGROUP_ROOT/$PARENT/$1"
    return 0
  fi
  for c in memory cpu cpuacct pids unified; do
    if [ -d "$CGROUP_ROOT/$c" ]; then echo "$CGROUP_ROOT/$c/$PARENT/$1"; fi
  done
}
put() { printf '%s\\n' "$2" >"$1" 2>/dev/null || die "cannot write $2 to $1"; }

setup() {
  name=$1 millicores=$2 mib=$3 pids=$4
  if v2; then
    mkdir -p "$CGROUP_ROOT/$PARENT/$name" || die "cannot make $CGROUP_ROOT/$PARENT/$name"
    for c in cpu memory pids; do
      printf '+%s\\n' "$c" >"$CGROUP_ROOT/cgroup.subtree_control" 2>/dev/null || true
      printf '+%s\\n' "$c" >"$CGROUP_ROOT/$PARENT/cgroup.subtree_control" 2>/dev/null || true
    done
    d=$CGROUP_ROOT/$PARENT/$name
    if [ "$mib" -ne 0 ]; then
      put "$d/memory.max" $((mib * 1048576))
      printf '0\\n' >"$d/memory.swap.max" 2>/dev/null || true
    fi
    if [ "$millicores" -ne 0 ]; then put "$d/cpu.max" "$((millicores * 100)) 100000"; fi
    if [ "$pids" -ne 0 ]; then put "$d/pids.max" "$pids"; fi
    return 0
  fi
  found=
  for d in $(slot_groups "$name"); do
    mkdir -p "$d" || die "cannot make $d"
    found=1
  done
  [ -n "$found" ] || die "no cgroup hierarchy at $CGROUP_ROOT"
  d=$CGROUP_ROOT/memory/$PARENT/$name
  if [ "$mib" -ne 0 ] && [ -d "$d" ]; then
    put "$d/memory.limit_in_bytes" $((mib * 1048576))
    if [ -f "$d/memory.memsw.limit_in_bytes" ]; then put "$d/memory.memsw.limit_in_bytes" $((mib * 1048576)); fi
  fi
  d=$CGROUP_ROOT/cpu/$PARENT/$name
  if [ "$millicores" -ne 0 ] && [ -d "$d" ]; then
    put "$d/cpu.cfs_period_us" 100000
    put "$d/cpu.cfs_quota_us" $((millicores * 100))
  fi
  d=$CGROUP_ROOT/pids/$PARENT/$name
  if [ "$pids" -ne 0 ] && [ -d "$d" ]; then put "$d/pids.max" "$pids"; fi
}

kill_all() {
  for d in $(slot_groups "$1"); do
    if [ -f "$d/cgroup.kill" ]; then printf '1\\n' >"$d/cgroup.kill" 2>/dev/null || true; fi
  done
  # Without cgroup.kill: SIGKILL its processes until none is left (one forked meanwhile is read again).
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    left=
    for d in $(slot_groups "$1"); do
      if [ ! -f "$d/cgroup.procs" ]; then continue; fi
      while read -r pid; do
        kill -9 "$pid" 2>/dev/null || true
        left=1
      done <"$d/cgroup.procs"
    done
    if [ -z "$left" ]; then return 0; fi
    sleep 0.1
  done
}

remove() {
  kill_all "$1"
  for d in $(slot_groups "$1"); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      if [ ! -d "$d" ] || rmdir "$d" 2>/dev/null; then break; fi
      sleep 0.1
    done
    rmdir "\${d%/*}" 2>/dev/null || true # the parent too, once no slot of any backing node is left
  done
}

# What run needs, tried once with a group of its own: the cgroup and its limits, a mount namespace with
# the mounts run makes (CAP_SYS_ADMIN), another uid. Said and refused at once where one is missing.
probe() {
  setup "$@"
  if ! unshare --mount --propagation private -- /bin/sh -c \\
    'mount -t tmpfs -o size=4k metastatic-probe /home && mount -t tmpfs -o size=4k metastatic-probe /tmp &&
      mount -t proc -o hidepid=2 proc /proc'; then
    remove "$1"
    die "cannot mount in a namespace of its own (unshare and mount need CAP_SYS_ADMIN)"
  fi
  if ! setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs -- true; then
    remove "$1"
    die "cannot run as another uid (setpriv)"
  fi
  remove "$1"
}

run() {
  name=$1 uid=$2 gid=$3 dir=$4 tmp=$5 user=$6
  shift 6
  if [ "\${1:-}" = -- ]; then shift; fi
  joined=
  for d in $(slot_groups "$name"); do
    put "$d/cgroup.procs" $$
    joined=1
  done
  [ -n "$joined" ] || die "no cgroup hierarchy at $CGROUP_ROOT"
  exec unshare --mount --propagation private -- "$0" inside "$uid" "$gid" "$dir" "$tmp" "$user" -- "$@"
}

# A slot's mounts, in a mount namespace of its own: /home holding only /home/USER (DIR), TMP on /tmp and
# /var/tmp, a new /dev/shm. A path is bound by the directory itself, not its name (a process's cwd
# through /proc), since a mount may hide the name of the next.
slot_mounts() {
  dir=$1 tmp=$2 user=$3
  cd "$tmp"
  (exec sleep 60) &
  holder=$!
  cd "$dir"
  mount -t tmpfs -o mode=0755,size=1m metastatic-home /home
  mkdir "/home/$user"
  mount -c --bind /proc/self/cwd "/home/$user"
  mount -c --bind "/proc/$holder/cwd" /tmp
  if [ -d /var/tmp ]; then mount -c --bind "/proc/$holder/cwd" /var/tmp; fi
  kill "$holder"
  if [ -d /dev/shm ]; then mount -t tmpfs -o mode=1777,nosuid,nodev metastatic-shm /dev/shm; fi
}

# In the new mount namespace: the mounts, then the job as the slot's user.
inside() {
  uid=$1 gid=$2 dir=$3 tmp=$4 user=$5
  shift 5
  if [ "\${1:-}" = -- ]; then shift; fi
  slot_mounts "$dir" "$tmp" "$user"
  mount -t proc -o hidepid=2 proc /proc
  cd "/home/$user"
  exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs \\
    --inh-caps=-all --bounding-set=-all -- "$@"
}

# Without root (rootless): a user namespace whose root is the caller, with mount and PID namespaces, in
# which the same mounts are made, HIDE (the pool's state directory) is covered by an empty tmpfs, and the
# job then runs in a nested user namespace as the caller's own uid, without capabilities: the mounts it
# inherits from the outer namespace are locked there, so it cannot unmount them to see what they cover.
# No cgroup (no limits) and no uid of its own: files the caller can read outside /home, /tmp and HIDE stay
# readable.
run_rootless() {
  dir=$1 tmp=$2 user=$3 hide=$4
  shift 4
  if [ "\${1:-}" = -- ]; then shift; fi
  exec unshare --user --map-root-user --mount --pid --fork --kill-child --propagation private -- \\
    "$0" inside-rootless "$(id -u)" "$(id -g)" "$dir" "$tmp" "$user" "$hide" -- "$@"
}

inside_rootless() {
  uid=$1 gid=$2 dir=$3 tmp=$4 user=$5 hide=$6
  shift 6
  if [ "\${1:-}" = -- ]; then shift; fi
  mount -t proc proc /proc # this PID namespace's: the holder below is found by its pid in it
  slot_mounts "$dir" "$tmp" "$user"
  # Last: HIDE may hold DIR and TMP, bound above by their directories, not their names.
  if [ -d "$hide" ]; then mount -t tmpfs -o mode=0755,size=4k metastatic-hidden "$hide"; fi
  cd "/home/$user"
  exec unshare --user --map-user="$uid" --map-group="$gid" -- setpriv --no-new-privs -- "$@"
}

# CONF's slots, checked, a line each (USER MILLICORES MEMORY_MIB PIDS IMDS). CONF's lines (# comments and
# blank lines aside) are PREFIX SLOTS MILLICORES MEMORY_MIB PIDS IMDS: users PREFIX-0 ... PREFIX-<SLOTS-1>.
conf_lines() {
  [ -f "$1" ] || die "no slot file $1"
  while read -r prefix slots millicores mib pids imds rest; do
    case $prefix in '' | '#'*) continue ;; esac
    if ! { word_ok "$prefix" && num_ok "$slots" && num_ok "$millicores" && num_ok "$mib" && num_ok "$pids"; } ||
      ! { [ "$imds" = 0 ] || [ "$imds" = 1 ]; } || [ -n "$rest" ] || [ "$slots" -gt 4096 ]; then
      die "$1: not a slots line (PREFIX SLOTS MILLICORES MEMORY_MIB PIDS IMDS): $prefix $slots $millicores $mib $pids $imds $rest"
    fi
    n=0
    while [ "$n" -lt "$slots" ]; do
      printf '%s-%s %s %s %s %s\\n' "$prefix" "$n" "$millicores" "$mib" "$pids" "$imds"
      n=$((n + 1))
    done
  done <"$1"
}

# The instance metadata service (its IPv4 and IPv6 addresses) refused to these uids (comma-separated).
block_imds() {
  if command -v nft >/dev/null 2>&1; then
    {
      printf 'table inet metastatic\\ndelete table inet metastatic\\n'
      if [ -n "$1" ]; then
        printf 'table inet metastatic {\\n  chain output {\\n    type filter hook output priority 0; policy accept;\\n'
        printf '    meta skuid { %s } ip daddr 169.254.169.254 reject\\n' "$1"
        printf '    meta skuid { %s } ip6 daddr fd00:ec2::254 reject\\n  }\\n}\\n' "$1"
      fi
    } | nft -f - || die "cannot block the instance metadata service (nft)"
    return 0
  fi
  [ -n "$1" ] || return 0
  command -v iptables >/dev/null 2>&1 ||
    die "cannot block the instance metadata service for the slot users: neither nft nor iptables is installed"
  for uid in $(printf '%s' "$1" | tr ',' ' '); do
    rule="OUTPUT -m owner --uid-owner $uid -d 169.254.169.254 -j REJECT"
    # shellcheck disable=SC2086 # the rule is words
    iptables -w -C $rule 2>/dev/null || iptables -w -A $rule || die "cannot block the instance metadata service (iptables)"
    if command -v ip6tables >/dev/null 2>&1; then
      rule="OUTPUT -m owner --uid-owner $uid -d fd00:ec2::254 -j REJECT"
      # shellcheck disable=SC2086
      ip6tables -w -C $rule 2>/dev/null || ip6tables -w -A $rule || true
    fi
  done
}

boot() {
  lines=$(conf_lines "$1") || exit 125
  [ -n "$lines" ] || die "$1 names no slot"
  shell=/bin/sh
  if [ -x /bin/bash ]; then shell=/bin/bash; fi
  users='' blocked=''
  # The group sshd's Match names (the pool's keys for its members); it owns no file.
  getent group "$PARENT-slot" >/dev/null || groupadd --system "$PARENT-slot" || die "cannot add the group $PARENT-slot"
  while read -r user millicores mib pids imds; do
    if ! id -u "$user" >/dev/null 2>&1; then
      useradd --create-home --home-dir "/home/$user" --user-group --no-log-init --shell "$shell" \\
        --comment "metastatic slot" --password '*' "$user" || die "cannot add the slot user $user"
    fi
    usermod --append --groups "$PARENT-slot" "$user" || die "cannot add $user to the group $PARENT-slot"

    uid=$(id -u "$user")
    [ "$uid" -ne 0 ] || die "the slot user $user is root"
    mkdir -p "/home/$user"
    chown "$uid:$(id -g "$user")" "/home/$user"
    chmod 0700 "/home/$user"
    setup "$user" "$millicores" "$mib" "$pids"
    users=$users\${users:+,}$user
    if [ "$imds" = 0 ]; then blocked=$blocked\${blocked:+, }$uid; fi
  done <<LINES
$lines
LINES
  block_imds "$blocked"
  # sshd's PAM stack loads pam_namespace only where it is (so a missing one locks nobody else out): a slot
  # user's session waits for boot, and boot does not finish without it.
  namespace_module=''
  for m in /lib/security /lib/*/security /lib64/security /usr/lib/security /usr/lib/*/security /usr/lib64/security; do
    if [ -f "$m/pam_namespace.so" ]; then namespace_module=$m/pam_namespace.so; fi
  done
  [ -n "$namespace_module" ] || die "no pam_namespace.so: the slots cannot have a /tmp of their own"
  mkdir -p "$NAMESPACE_D"
  for d in /tmp /var/tmp; do
    mkdir -p "$d/.metastatic-inst"
    chmod 000 "$d/.metastatic-inst"
  done
  {
    printf '# metastatic-slot boot: each slot user has a /tmp, /var/tmp and /dev/shm of its own\\n'
    printf '/tmp /tmp/.metastatic-inst/ user ~%s\\n' "$users"
    printf '/var/tmp /var/tmp/.metastatic-inst/ user ~%s\\n' "$users"
    printf '/dev/shm /dev/shm/.metastatic-inst/ tmpfs:mntopts=nosuid,nodev ~%s\\n' "$users"
  } >"$NAMESPACE_D/metastatic.conf"
  mount -o remount,hidepid=2 /proc || die "cannot remount /proc with hidepid=2"
  mkdir -p "$RUN_DIR"
  : >"$RUN_DIR/booted"
}

# pam_exec, as sshd opens a session: a slot user's session into its slot. Its parent is the sshd process
# that then starts the session's command: moved into the slot's cgroups, everything it starts is there.
pam_open() {
  [ "\${PAM_TYPE:-}" = open_session ] || return 0
  lines=$(conf_lines "$1") || exit 125
  slot=''
  while read -r user _; do
    if [ "$user" = "\${PAM_USER:-}" ]; then slot=$user; fi
  done <<LINES
$lines
LINES
  [ -n "$slot" ] || return 0
  [ -f "$RUN_DIR/booted" ] || die "the slots of this instance are not set up yet (metastatic-slot boot has not finished)"
  joined=''
  for d in $(slot_groups "$slot"); do
    [ -d "$d" ] || die "no cgroup $d for the slot user $slot"
    put "$d/cgroup.procs" "$PPID"
    joined=1
  done
  [ -n "$joined" ] || die "no cgroup hierarchy at $CGROUP_ROOT"
}

command=\${1:-}
[ $# -gt 0 ] && shift
case $command in
setup)
  if ! { [ $# -eq 4 ] && word_ok "$1" && num_ok "$2" && num_ok "$3" && num_ok "$4"; }; then
    die "usage: setup NAME MILLICORES MEMORY_MIB PIDS"
  fi
  setup "$@"
  ;;
run)
  if ! { [ $# -ge 8 ] && word_ok "$1" && num_ok "$2" && num_ok "$3" && word_ok "$6"; }; then
    die "usage: run NAME UID GID DIR TMP USER -- CMD..."
  fi
  run "$@"
  ;;
probe)
  if ! { [ $# -eq 4 ] && word_ok "$1" && num_ok "$2" && num_ok "$3" && num_ok "$4"; }; then
    die "usage: probe NAME MILLICORES MEMORY_MIB PIDS"
  fi
  probe "$@"
  ;;
inside) inside "$@" ;;
kill)
  if ! { [ $# -eq 1 ] && word_ok "$1"; }; then die "usage: kill NAME"; fi
  kill_all "$1"
  ;;
remove)
  if ! { [ $# -eq 1 ] && word_ok "$1"; }; then die "usage: remove NAME"; fi
  remove "$1"
  ;;
run-rootless)
  if ! { [ $# -ge 6 ] && word_ok "$3"; }; then die "usage: run-rootless DIR TMP USER HIDE -- CMD..."; fi
  run_rootless "$@"
  ;;
inside-rootless) inside_rootless "$@" ;;
boot)
  if [ $# -ne 1 ]; then die "usage: boot CONF"; fi
  boot "$1"
  ;;
pam)
  if [ $# -ne 1 ]; then die "usage: pam CONF (run by pam_exec)"; fi
  pam_open "$1"
  ;;
*) die "usage: metastatic-slot setup|probe|run|run-rootless|kill|remove|boot|pam ..." ;;
esac
`;

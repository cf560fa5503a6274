#!/bin/sh
# An EC2 instance of an aws label with `isolation: contain`, as far as this machine can be one: run by
# test/embedded/instanceContainment.test.ts as root inside `unshare --mount --net --pid --fork
# --mount-proc`, so that nothing it does reaches the host: /etc is an overlay, /home, /run, /tmp,
# /var/tmp, /var/lib and /usr/local are empty tmpfs, the network is a namespace of its own with the
# instance metadata service's address on lo. Then, as on an instance:
#   1. the real cloud-init applies the label's user data (write_files), then the per-boot script it
#      wrote runs as cloud-init's last stage would run it: `metastatic-slot boot`, twice (a reboot);
#   2. Debian's sshd, with its stock sshd_config and PAM stack (plus what the user data added), serves
#      the slot users on 127.0.0.1:2222;
#   3. each check logs in with OpenSSH's client and prints `name=value` lines for the test to judge.
# Not like an instance: no systemd (sshd is started by hand), IMDS is a stand-in on 169.254.169.254:80.
# The slot cgroups are the host's (cgroupfs is not namespaced here): removed before it exits.
set -u
IN=$1        # a directory with user-data.yaml and id_ed25519 (the pool's key)
USER0=$2     # the slot users
USER1=$3
S=/mnt
mount -t tmpfs metastatic-instance "$S"
cp "$IN/user-data.yaml" "$IN/id_ed25519" "$S/"
if [ -f "$IN/runner.sh" ]; then cp "$IN/runner.sh" "$S/"; fi
chmod 600 "$S/id_ed25519"
mkdir -p "$S/etc-up" "$S/etc-work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$S/etc-up,workdir=$S/etc-work" /etc
for d in /usr/local /home /run /tmp /var/tmp /var/lib; do mount -t tmpfs none "$d"; done
mkdir -p /usr/local/sbin /run/sshd /var/lib/cloud
ip link set lo up
ip addr add 169.254.169.254/32 dev lo

say() { printf '%s=%s\n' "$1" "$2"; }
slot() { # slot USER COMMAND: the command run by a login of USER; its output, and its status as a line
  u=$1
  shift
  ssh -n -i "$S/id_ed25519" -p 2222 -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=10 "$u@127.0.0.1" "$@" 2>&1
}

cloud-init --file "$S/user-data.yaml" single --name write_files --frequency always >/dev/null 2>&1
n=0
for f in /usr/local/sbin/metastatic-slot /etc/metastatic/slots /etc/metastatic/authorized_keys; do
  if [ -f "$f" ]; then n=$((n + 1)); fi
done
say written "$n"
PAM_TYPE=open_session PAM_USER=$USER0 /usr/local/sbin/metastatic-slot pam /etc/metastatic/slots 2>/dev/null
say pam_before_boot "$?"
# An image without pam_namespace: boot refuses to finish (so every slot session is refused), saying why.
security=$(dirname "$(find /lib /usr/lib -name pam_namespace.so 2>/dev/null | head -n1)")
mount -t tmpfs none "$security"
out=$(/var/lib/cloud/scripts/per-boot/metastatic-slot 2>&1)
say boot_without_namespace "$out (status $?)"
umount "$security"
say booted_without_namespace "$(test -f /run/metastatic/booted && echo yes || echo no)"
# cloud-init's scripts-per-boot runs it in the last stage of every boot, which `single` does not do
# without a datasource: run here as it would, twice (the second as after a reboot: nothing fails).
/var/lib/cloud/scripts/per-boot/metastatic-slot >"$S/boot.log" 2>&1
say boot_again "$(/var/lib/cloud/scripts/per-boot/metastatic-slot >>"$S/boot.log" 2>&1; echo "$?")"
say booted "$(test -f /run/metastatic/booted && echo yes || echo no)"
sed 's/^/boot: /' "$S/boot.log" | grep -i 'metastatic-slot' || true

/usr/sbin/sshd -D -e -o Port=2222 -o ListenAddress=127.0.0.1 2>"$S/sshd.log" &
sshd=$!
(cd /run && exec python3 -m http.server --bind 169.254.169.254 80 >/dev/null 2>&1) &
imds=$!
for _ in $(seq 50); do
  if slot "$USER0" true >/dev/null 2>&1; then break; fi
  sleep 0.2
done

say uid0 "$(slot "$USER0" id -u)"
say uid_host "$(id -u "$USER0")"
say cgroup0 "$(slot "$USER0" "grep metastatic/$USER0\$ /proc/self/cgroup | cut -d: -f2 | sort | tr '\n' ' '")"
say cpu_quota "$(cat "/sys/fs/cgroup/cpu/metastatic/$USER0/cpu.cfs_quota_us" 2>/dev/null || cat "/sys/fs/cgroup/metastatic/$USER0/cpu.max" 2>/dev/null)"
say env0 "$(slot "$USER0" "env | cut -d= -f1 | sort | tr '\n' ' '")"
slot "$USER0" 'echo secret0 >/tmp/secret && echo home0 >~/file && chmod 644 ~/file /tmp/secret' >/dev/null
say tmp_own "$(slot "$USER0" cat /tmp/secret)"
say tmp_other "$(slot "$USER1" 'cat /tmp/secret 2>/dev/null || echo refused')"
say tmp_on_host "$(cat /tmp/.metastatic-inst/"$USER0"/secret 2>/dev/null || echo missing)"
say home_other "$(slot "$USER1" "cat /home/$USER0/file 2>/dev/null || echo refused")"
slot "$USER0" 'setsid sleep 300 </dev/null >/dev/null 2>&1 &' >/dev/null
pid=$(pgrep -u "$USER0" -x sleep | head -n1)
say leftover "$(test -n "$pid" && echo running || echo none)"
say ps_own "$(slot "$USER0" "ps -eo user= | grep -c $USER0")"
say ps_other "$(slot "$USER1" "ps -eo user= | grep -c $USER0")"
say kill_other "$(slot "$USER1" "kill $pid 2>/dev/null && echo killed || echo refused")"
say imds_root "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://169.254.169.254/)"
say imds_slot "$(slot "$USER0" "curl -s -o /dev/null --max-time 5 http://169.254.169.254/ && echo reached || echo refused")"
slot "$USER1" 'python3 -c "import time; time.sleep(3); print(\"neighbour done\")"' >"$S/neighbour" &
neighbour=$!
say oom "$(slot "$USER0" 'python3 -c "bytearray(600 * 1024 * 1024)" 2>/dev/null; echo "status $?"' | grep status)"
wait "$neighbour"
say neighbour "$(cat "$S/neighbour")"
ssh-keygen -q -t ed25519 -N '' -f "$S/own" >/dev/null
slot "$USER0" "mkdir -p ~/.ssh && echo '$(cat "$S/own.pub")' >>~/.ssh/authorized_keys" >/dev/null
say own_key "$(ssh -n -i "$S/own" -p 2222 -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
  -o LogLevel=ERROR "$USER0@127.0.0.1" echo in 2>/dev/null || echo refused)"
# A GitHub job's runner, started as SSM Run Command would start it (the github function's script, as
# root): the AWS CLI here is a stand-in (no network) that hands out the JIT configuration and records
# that the parameter was deleted; the runner command prints what the runner would see.
if [ -f "$S/runner.sh" ]; then
  mkdir -p "$S/bin"
  cat >"$S/bin/aws" <<'AWS'
#!/bin/sh
case "$2" in
get-parameter) echo "jit-for-$METASTATIC_TEST_USER" ;;
delete-parameter) : >/run/parameter-deleted ;;
esac
AWS
  chmod 755 "$S/bin/aws"
  METASTATIC_TEST_USER=$USER0 PATH="$S/bin:$PATH" sh "$S/runner.sh" 2>&1 | sed 's/^/runner_/'
  say runner_parameter_deleted "$(test -f /run/parameter-deleted && echo yes || echo no)"
fi
/usr/local/sbin/metastatic-slot kill "$USER0"
say after_kill "$(pgrep -u "$USER0" >/dev/null && echo running || echo none)"

kill "$sshd" "$imds" 2>/dev/null
/usr/local/sbin/metastatic-slot remove "$USER0"
/usr/local/sbin/metastatic-slot remove "$USER1"
say sshd_log "$(grep -c -i -e error -e fatal "$S/sshd.log")"
grep -i -e error -e fatal "$S/sshd.log" | head -n 5 | sed 's/^/sshd: /'

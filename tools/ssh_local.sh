#!/usr/bin/env bash
# An sshd on this machine for the tests and CI of `%neuron ranks start N --engines ssh`: the current user's key
# (made if missing) authorized for itself, sshd listening on localhost:PORT (default 2222, unprivileged, so a
# developer's own sshd on 22 stays as it is), and known_hosts entries for `localhost` and `127.0.0.1` on that port,
# so `ssh -p PORT localhost true` answers without a question. Installs nothing (`apt-get install -y openssh-server
# openssh-client`; .ci/run does). Idempotent: an sshd already answering on PORT is left as it is.
set -euo pipefail
port="${1:-2222}"
dir="${NEURON_LAB_SSHD_DIR:-$HOME/.neuron-lab-sshd}"  # its host key, configuration, pid and log
sshd="$(command -v sshd || echo /usr/sbin/sshd)"
[ -x "$sshd" ] || { echo "ssh_local: no sshd (apt-get install -y openssh-server)" >&2; exit 1; }

mkdir -p "$HOME/.ssh" "$dir"
chmod 700 "$HOME/.ssh" "$dir"
key="$HOME/.ssh/id_ed25519"
[ -f "$key" ] || ssh-keygen -q -t ed25519 -N "" -C "neuron-lab tests" -f "$key"
touch "$HOME/.ssh/authorized_keys" && chmod 600 "$HOME/.ssh/authorized_keys"
grep -qxF "$(cat "$key.pub")" "$HOME/.ssh/authorized_keys" || cat "$key.pub" >>"$HOME/.ssh/authorized_keys"
[ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$dir/host_ed25519"
mkdir -p /run/sshd 2>/dev/null || true  # privilege separation directory (root's sshd needs it)
cat >"$dir/sshd_config" <<CONF
# written by tools/ssh_local.sh
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
PidFile $dir/sshd.pid
AuthorizedKeysFile $HOME/.ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
MaxStartups 64:30:128
MaxSessions 64
Subsystem sftp internal-sftp
CONF

opts=(-p "$port" -o BatchMode=yes -o ConnectTimeout=5)
if ! ssh "${opts[@]}" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null localhost true 2>/dev/null; then
  "$sshd" -f "$dir/sshd_config" -E "$dir/sshd.log"
fi
until=$((SECONDS + 20))
until ssh-keyscan -p "$port" -t ed25519 127.0.0.1 >/dev/null 2>&1; do
  if ((SECONDS >= until)); then echo "ssh_local: sshd did not listen on port $port within 20 s ($dir/sshd.log)" >&2; exit 1; fi
  sleep 0.5
done
touch "$HOME/.ssh/known_hosts"
for host in localhost 127.0.0.1; do
  ssh-keygen -q -R "[$host]:$port" -f "$HOME/.ssh/known_hosts" >/dev/null 2>&1 || true
  ssh-keyscan -p "$port" -t ed25519 127.0.0.1 2>/dev/null | sed "s/^\[127.0.0.1\]:$port/[$host]:$port/" \
    >>"$HOME/.ssh/known_hosts"
done
for host in localhost 127.0.0.1; do
  ssh "${opts[@]}" "$host" true || { echo "ssh_local: ssh -p $port $host true failed" >&2; exit 1; }
done
echo "ssh_local: sshd up on localhost:$port and 127.0.0.1:$port for $(id -un)"

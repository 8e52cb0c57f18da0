#!/usr/bin/env bash
# An sshd on this machine for the tests and CI of `%neuron ranks start N --engines ssh`: the current user's key
# (made if missing) authorized for itself, sshd listening on PORT (default 2222, unprivileged, so a developer's own
# sshd on 22 stays as it is) at 127.0.0.1 and at this machine's non-loopback addresses, and known_hosts entries for
# `localhost` and each address on that port, so `ssh -p PORT localhost true` answers without a question. Installs
# nothing (`apt-get install -y openssh-server openssh-client`; .ci/run does). Idempotent: an sshd already answering
# on PORT is left as it is (one more is started for the addresses it does not listen on).
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
# 127.0.0.1 and this machine's own non-loopback IPv4 addresses (an ssh host given by one of those exercises the
# ranks' non-loopback address: `%neuron ranks start N --engines ssh --ssh-hosts 192.0.2.2:2222`)
addrs=(127.0.0.1 $(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9.]+$' | grep -v '^127\.' || true))
missing=()  # the addresses no sshd answers on yet: an sshd of an older run may listen on loopback only
for a in "${addrs[@]}"; do
  ssh-keyscan -T 3 -p "$port" -t ed25519 "$a" >/dev/null 2>&1 || missing+=("$a")
done
if ((${#missing[@]})); then
  name=sshd; [ ${#missing[@]} -eq ${#addrs[@]} ] || name=sshd_more  # another sshd beside the one that runs
  {
    echo "# written by tools/ssh_local.sh"
    echo "Port $port"
    printf 'ListenAddress %s\n' "${missing[@]}"
    cat <<CONF
HostKey $dir/host_ed25519
PidFile $dir/$name.pid
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
  } >"$dir/${name}_config"
  "$sshd" -f "$dir/${name}_config" -E "$dir/$name.log"
fi
opts=(-p "$port" -o BatchMode=yes -o ConnectTimeout=5)
until=$((SECONDS + 20))
for a in "${addrs[@]}"; do
  until ssh-keyscan -p "$port" -t ed25519 "$a" >/dev/null 2>&1; do
    if ((SECONDS >= until)); then echo "ssh_local: sshd did not listen on $a:$port within 20 s ($dir)" >&2; exit 1; fi
    sleep 0.5
  done
done
touch "$HOME/.ssh/known_hosts"
for host in localhost "${addrs[@]}"; do  # entries that answer already stay (other runs may be using them)
  ssh "${opts[@]}" "$host" true 2>/dev/null && continue
  ssh-keygen -q -R "[$host]:$port" -f "$HOME/.ssh/known_hosts" >/dev/null 2>&1 || true
  ssh-keyscan -p "$port" -t ed25519 127.0.0.1 2>/dev/null | sed "s/^\[127.0.0.1\]:$port/[$host]:$port/" \
    >>"$HOME/.ssh/known_hosts"
done
for host in localhost "${addrs[@]}"; do
  ssh "${opts[@]}" "$host" true || { echo "ssh_local: ssh -p $port $host true failed" >&2; exit 1; }
done
echo "ssh_local: sshd up on localhost:$port and ${addrs[*]/%/:$port} for $(id -un)"

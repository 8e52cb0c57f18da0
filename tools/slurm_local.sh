#!/usr/bin/env bash
# A one-machine Slurm for the tests and CI: munge, slurmctld and slurmd on this host, one node that takes 8 tasks
# (oversubscribed: `%neuron ranks start 4 --engines slurm` fits on a 2-CPU runner). Run as root, after
# `apt-get install -y slurm-wlm munge`; installs nothing. Idempotent: daemons already answering are left as they are.
# No cgroups (a container has none to give): processes are tracked by /proc, tasks are not bound.
set -euo pipefail
host="$(hostname -s)"
conf=/etc/slurm/slurm.conf
state=/var/spool/slurm-local

deadline() {  # deadline SECONDS WHAT COMMAND...: run COMMAND until it succeeds, or fail saying WHAT did not happen
  local secs="$1" what="$2"; local until=$((SECONDS + secs)); shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= until)); then echo "slurm_local: $what within $secs s" >&2; return 1; fi
    sleep 0.5
  done
}

mkdir -p /etc/slurm "$state/ctld" "$state/d" /var/log/slurm /run/munge /var/log/munge /var/lib/munge
cat >"$conf.new" <<EOF
# written by tools/slurm_local.sh: one node, this host
ClusterName=neuron-lab
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=300
KillWait=5
NodeName=$host CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
if ! cmp -s "$conf.new" "$conf"; then  # a changed configuration: the daemons restart with it
  mv "$conf.new" "$conf"
  [ -f /run/slurmctld.pid ] && kill "$(cat /run/slurmctld.pid)" 2>/dev/null || true
  [ -f /run/slurmd.pid ] && kill "$(cat /run/slurmd.pid)" 2>/dev/null || true
  sleep 1
else
  rm "$conf.new"
fi

[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 || {
  runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
  deadline 10 "munged did not answer" sh -c 'munge -n </dev/null | unmunge'
}
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
deadline 20 "slurmctld did not answer" scontrol ping
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
deadline 20 "node $host did not come up" sh -c "sinfo -h -n $host -o %T | grep -Eq '^(idle|mixed|allocated)'"
echo "slurm_local: node $host up ($(sinfo -h -o '%P %D %C'))"

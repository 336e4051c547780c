#!/bin/bash
# A one-node SLURM cluster (munge, slurmctld, slurmd) on this machine, for `nox -s slurm`.
#   slurm_cluster.sh start DIR   writes DIR/slurm.conf, starts the daemons, waits for the node
#   slurm_cluster.sh stop DIR    stops what start started
# Needs root and Debian's slurm-wlm and munge packages. Ports 16817/16818 keep clear of a
# system slurm.
set -euo pipefail
action=$1
dir=$(realpath -m "$2")
conf=$dir/slurm.conf

if [ "$action" = stop ]; then
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    exit 0
fi

mkdir -p "$dir/ctld" "$dir/spool" "$dir/munge"
chown munge:munge "$dir/munge"
host=$(hostname)
cpus=$(nproc)
cat > "$conf" <<CONF
ClusterName=accel
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

[ -f /etc/munge/munge.key ] || /usr/sbin/mungekey --create
runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed"
# SLURM's munge plugin talks to the default socket unless told otherwise.
sed -i "s|^AuthType=auth/munge|AuthType=auth/munge\nAuthInfo=socket=$dir/munge/munge.socket|" "$conf"
export SLURM_CONF=$conf
/usr/sbin/slurmctld -f "$conf"
/usr/sbin/slurmd -f "$conf"
for _ in $(seq 60); do
    if sinfo -h -o %t 2>/dev/null | grep -q idle; then
        echo "slurm: one node up ($host, $cpus CPUs), SLURM_CONF=$conf"
        exit 0
    fi
    sleep 0.5
done
echo "slurm: the node did not come up; logs in $dir" >&2
exit 1

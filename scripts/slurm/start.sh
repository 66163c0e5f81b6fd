#!/usr/bin/env bash
# scripts/slurm/start.sh - single-node SLURM "cluster" on localhost for the tests (tests/test_slurm.py)
# and CI; profiles/slurm-localhost submits to it.
#
# Target: Debian bookworm (Slurm 22.05.8, munge 0.5.15), running as root, no systemd.
# Idempotent: installs missing packages, (re)writes config, starts only daemons that are
# not already running, restarts slurmctld/slurmd if the config changed, then waits until
# the node is idle and (unless --no-check) runs one tiny batch job.
#
# Usage:  start.sh [--accounting none|dbd] [--nodes N] [--no-check]
#   --accounting none  (default) no slurmdbd: `sacct` does NOT work; use squeue polling
#                      (snakemake: --slurm-status-command squeue; MinJobAge=600 here).
#   --accounting dbd   MariaDB + slurmdbd: `sacct`/`sacctmgr` work; the snakemake slurm
#                      plugin works with its defaults. Adds ~300 MB of packages, ~5 s.
#   --nodes N          N nodes on this one machine (default 1, NodeName=localhost): node1..nodeN,
#                      one slurmd each on ports 6818.. (Debian's Slurm is built with
#                      --enable-multiple-slurmd: `scontrol show config` says MULTIPLE_SLURMD=Yes),
#                      each with all CPUs and the memory below (they share them).
# Env overrides: SLURM_LOCAL_DIR (default /tmp/emb-slurm), SLURM_LOCAL_ACCOUNTING, SLURM_LOCAL_NODES,
#                SLURM_LOCAL_CPUS (default nproc --all), SLURM_LOCAL_MEM_MB (default 85% of RAM),
#                SLURM_LOCAL_ETC_LINK=0 to NOT symlink /etc/slurm/slurm.conf (then every
#                client needs SLURM_CONF, and the snakemake slurm-jobstep plugin breaks
#                because it strips SLURM_* env vars, SLURM_CONF included, before `srun`).
# Stop with: scripts/slurm/stop.sh [--purge] (by PID file)
set -euo pipefail

BASE=${SLURM_LOCAL_DIR:-/tmp/emb-slurm}
ACCT=${SLURM_LOCAL_ACCOUNTING:-none}
NODES=${SLURM_LOCAL_NODES:-1}
CHECK=1
while [ $# -gt 0 ]; do
  case "$1" in
    --accounting) ACCT=$2; shift 2 ;;
    --accounting=*) ACCT=${1#*=}; shift ;;
    --nodes) NODES=$2; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --no-check) CHECK=0; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$ACCT" in none|dbd) ;; *) echo "--accounting must be none or dbd" >&2; exit 2 ;; esac
case "$NODES" in ''|*[!0-9]*|0) echo "--nodes must be a positive integer, found '$NODES'" >&2; exit 2 ;; esac

CLUSTER=local
NODE=localhost
PART=debug
CPUS=${SLURM_LOCAL_CPUS:-$(nproc --all)}  # all CPUs, as os.cpu_count(); nproc honours OMP_NUM_THREADS
MEM_MB=${SLURM_LOCAL_MEM_MB:-$(awk '/MemTotal/{printf "%d", $2/1024*0.85}' /proc/meminfo)}
MUNGE_SOCK=$BASE/munge-run/munge.socket.2
DB_PORT=3307
DB_SOCK=$BASE/mysql/run/mysqld.sock
CONF=$BASE/etc/slurm.conf
export SLURM_CONF=$CONF
if [ "$NODES" = 1 ]; then
  NAMES=("$NODE")
  NODE_LINES="NodeName=$NODE CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  SLURMD_FILES="SlurmdSpoolDir=$BASE/spool
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmdLogFile=$BASE/log/slurmd.log"
else  # several slurmd on this host: each its own name, port, spool, pid and log (%n)
  NAMES=(); NODE_LINES=""
  for i in $(seq "$NODES"); do
    NAMES+=("node$i")
    NODE_LINES+="NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((6817 + i)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"$'\n'
  done
  NODE_LINES=${NODE_LINES%$'\n'}
  SLURMD_FILES="SlurmdSpoolDir=$BASE/spool/%n
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmdLogFile=$BASE/log/slurmd-%n.log"
fi
slurmd_pidfile() { [ "$NODES" = 1 ] && echo "$BASE/run/slurmd.pid" || echo "$BASE/run/slurmd-$1.pid"; }   # daemons + commands in this script; slurmdbd reads $BASE/etc/slurmdbd.conf
T0=$(date +%s)
log() { printf '[start-local-slurm %3ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

# is_running PIDFILE COMM -> true if the pid in PIDFILE is alive and is COMM
is_running() {
  local pf=$1 comm=$2 pid
  [ -s "$pf" ] || return 1
  pid=$(cat "$pf" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$comm" ]
}
stop_pidfile() {  # stop_pidfile PIDFILE COMM
  local pf=$1 comm=$2 pid
  is_running "$pf" "$comm" || return 0
  pid=$(cat "$pf"); kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
}
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs=$1 what=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out after ${secs}s waiting for: $what" >&2; return 1
}

# ---------------------------------------------------------------- packages
pkgs=(slurm-wlm munge)
[ "$ACCT" = dbd ] && pkgs+=(slurmdbd mariadb-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi

# ---------------------------------------------------------------- dirs, munge
mkdir -p "$BASE"/{etc,state,spool,log,run,munge,munge-run}
chmod 700 "$BASE/munge"; chmod 755 "$BASE" "$BASE/munge-run"   # munged: socket dir needs o+x
if [ ! -s "$BASE/munge/munge.key" ]; then
  dd if=/dev/urandom of="$BASE/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$BASE/munge/munge.key"
fi
if ! is_running "$BASE/munge-run/munged.pid" munged; then
  log "starting munged"
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
  munged --socket="$MUNGE_SOCK" --key-file="$BASE/munge/munge.key" \
    --log-file="$BASE/log/munged.log" --pid-file="$BASE/munge-run/munged.pid" \
    --seed-file="$BASE/munge/munged.seed" --num-threads=4
fi
wait_for 10 munged bash -c "munge -n -S '$MUNGE_SOCK' | unmunge -S '$MUNGE_SOCK'"

# ---------------------------------------------------------------- slurm.conf
if [ "$ACCT" = dbd ]; then
  ACCT_CONF="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
# munge socket for the slurmdbd connection (AuthInfo is NOT used for it):
AccountingStoragePass=$MUNGE_SOCK"
else
  ACCT_CONF="AccountingStorageType=accounting_storage/none"
fi
NEW_CONF=$(cat <<EOF
# generated by scripts/slurm/start.sh - single node, Slurm 22.05
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$BASE/state
$SLURMD_FILES
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmctldPort=6817
SlurmdPort=6818
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
$ACCT_CONF
JobCompType=jobcomp/none
# keep finished jobs visible to squeue for 10 min (snakemake squeue polling needs >= 120 s)
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
$NODE_LINES
PartitionName=$PART Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
CONF_CHANGED=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
  printf '%s\n' "$NEW_CONF" > "$CONF.tmp" && mv "$CONF.tmp" "$CONF"
  CONF_CHANGED=1
fi
if [ "${SLURM_LOCAL_ETC_LINK:-1}" = 1 ]; then
  mkdir -p /etc/slurm
  if [ -e /etc/slurm/slurm.conf ] && [ ! -L /etc/slurm/slurm.conf ]; then
    mv /etc/slurm/slurm.conf "/etc/slurm/slurm.conf.bak.$(date +%s)"
  fi
  [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$CONF" ] || ln -sfn "$CONF" /etc/slurm/slurm.conf
fi

# ---------------------------------------------------------------- accounting (dbd)
if [ "$ACCT" = dbd ]; then
  mkdir -p "$BASE/mysql/run"
  if [ ! -d "$BASE/mysql/data/mysql" ]; then
    log "initialising MariaDB datadir"
    mariadb-install-db --user=root --datadir="$BASE/mysql/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$BASE/log/mariadb-install.log" 2>&1
  fi
  if ! is_running "$BASE/mysql/run/mysqld.pid" mariadbd; then
    log "starting mariadbd (127.0.0.1:$DB_PORT)"
    setsid nohup /usr/sbin/mariadbd --user=root --datadir="$BASE/mysql/data" \
      --socket="$DB_SOCK" --pid-file="$BASE/mysql/run/mysqld.pid" \
      --port=$DB_PORT --bind-address=127.0.0.1 --skip-name-resolve \
      --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
      --log-error="$BASE/log/mariadb.err" </dev/null >/dev/null 2>&1 &
  fi
  wait_for 30 mariadbd mariadb -S "$DB_SOCK" -e 'select 1'
  wait_for 10 mariadbd-pidfile test -s "$BASE/mysql/run/mysqld.pid"
  mariadb -S "$DB_SOCK" -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  DBD_CONF="AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db"
  if [ ! -f "$BASE/etc/slurmdbd.conf" ] || [ "$(cat "$BASE/etc/slurmdbd.conf")" != "$DBD_CONF" ]; then
    printf '%s\n' "$DBD_CONF" > "$BASE/etc/slurmdbd.conf"
    stop_pidfile "$BASE/run/slurmdbd.pid" slurmdbd
  fi
  chmod 600 "$BASE/etc/slurmdbd.conf"          # slurmdbd refuses a world-readable config
  if ! is_running "$BASE/run/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd"
    slurmdbd
  fi
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  sacctmgr -n -P list account format=account | grep -qx ci \
    || sacctmgr -i add account ci Description=ci Organization=ci >/dev/null
  sacctmgr -n -P list assoc format=account,user | grep -qx 'ci|root' \
    || sacctmgr -i add user root Account=ci DefaultAccount=ci >/dev/null
else
  # switching dbd -> none: stop the accounting daemons if they are running
  stop_pidfile "$BASE/run/slurmdbd.pid" slurmdbd
  stop_pidfile "$BASE/mysql/run/mysqld.pid" mariadbd
fi

# ---------------------------------------------------------------- slurmctld, slurmd
if [ "$CONF_CHANGED" = 1 ]; then
  for pf in "$BASE"/run/slurmd*.pid; do stop_pidfile "$pf" slurmd; done  # any node count before
  stop_pidfile "$BASE/run/slurmctld.pid" slurmctld
fi
if ! is_running "$BASE/run/slurmctld.pid" slurmctld; then
  log "starting slurmctld"
  slurmctld -i          # -i: ignore unreadable state files instead of refusing to start
fi
wait_for 30 slurmctld scontrol ping
for name in "${NAMES[@]}"; do
  mkdir -p "$BASE/spool/$name"
  if ! is_running "$(slurmd_pidfile "$name")" slurmd; then
    log "starting slurmd $name"
    slurmd -N "$name"   # hostname is not 'localhost' (nor node1..): name the node explicitly
  fi
done
for name in "${NAMES[@]}"; do
  node_ok() { sinfo -h -n "$name" -o %t | grep -qE '^(idle|mix|alloc|comp)'; }
  if ! wait_for 30 "node $name idle" node_ok; then
    scontrol update NodeName="$name" State=RESUME || true
    wait_for 15 "node $name idle after resume" node_ok
  fi
done

if [ "$CHECK" = 1 ]; then
  out=$(cd "$BASE" && timeout 120 srun -p "$PART" -t 1 --mem 50 -N"$NODES" -n"$NODES" hostname 2>&1) \
    || { echo "check job (srun hostname) failed: $out" >&2; exit 1; }
  log "check job ran on: $out"
fi

log "SLURM up (accounting=$ACCT) in $(( $(date +%s) - T0 ))s"
for d in munged:"$BASE/munge-run/munged.pid" mariadbd:"$BASE/mysql/run/mysqld.pid" \
         slurmdbd:"$BASE/run/slurmdbd.pid" slurmctld:"$BASE/run/slurmctld.pid" \
         $(for name in "${NAMES[@]}"; do echo "slurmd:$(slurmd_pidfile "$name")"; done); do
  is_running "${d#*:}" "${d%%:*}" && echo "  ${d%%:*} pid $(cat "${d#*:}")"
done
sinfo
cat <<EOF
config: $CONF (symlinked from /etc/slurm/slurm.conf)   logs: $BASE/log
snakemake: --executor slurm --default-resources slurm_partition=$PART$( [ "$ACCT" = none ] && echo " --slurm-status-command squeue" )
stop:   $(cd "$(dirname "$0")" && pwd)/stop.sh   (add --purge to also delete state + /etc symlink)
EOF

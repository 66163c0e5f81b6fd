#!/usr/bin/env bash
# scripts/slurm/stop.sh - stop the daemons started by scripts/slurm/start.sh (by PID file only).
# Usage: stop.sh [--purge]   --purge also deletes $SLURM_LOCAL_DIR state/db/logs
#                                         and the /etc/slurm/slurm.conf symlink.
set -uo pipefail
BASE=${SLURM_LOCAL_DIR:-/tmp/emb-slurm}
PURGE=0; [ "${1:-}" = --purge ] && PURGE=1
export SLURM_CONF=$BASE/etc/slurm.conf

stop_pidfile() {  # stop_pidfile PIDFILE COMM
  local pf=$1 comm=$2 pid
  [ -s "$pf" ] || return 0
  pid=$(cat "$pf" 2>/dev/null)
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || [ "$(cat /proc/"$pid"/comm 2>/dev/null)" != "$comm" ]; then
    rm -f "$pf"; return 0     # stale pid file
  fi
  echo "stopping $comm (pid $pid)"
  kill "$pid" 2>/dev/null
  for _ in $(seq 75); do kill -0 "$pid" 2>/dev/null || { rm -f "$pf"; return 0; }; sleep 0.2; done
  echo "  $comm did not exit in 15 s, sending SIGKILL"; kill -9 "$pid" 2>/dev/null; rm -f "$pf"
}

# cancel leftover jobs first so slurmd does not leave orphans behind
command -v scancel >/dev/null && [ -f "$SLURM_CONF" ] && timeout 10 scancel --quiet --user=root 2>/dev/null
for pf in "$BASE"/run/slurmd*.pid; do stop_pidfile "$pf" slurmd; done  # one per node
stop_pidfile "$BASE/run/slurmctld.pid" slurmctld      # its child slurmscriptd exits with it
stop_pidfile "$BASE/run/slurmdbd.pid" slurmdbd
stop_pidfile "$BASE/mysql/run/mysqld.pid" mariadbd
stop_pidfile "$BASE/munge-run/munged.pid" munged

if [ "$PURGE" = 1 ]; then
  [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$BASE/etc/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
  rm -rf "$BASE"
  echo "purged $BASE"
fi
echo "local SLURM stopped"

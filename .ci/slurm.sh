#!/usr/bin/env bash
# A single-node Slurm cluster on this host, with accounting, for the reclamation and budget
# enforcement integration tests.
#
#   bash .ci/slurm.sh          install if missing, configure, start MariaDB, munge, slurmdbd,
#                              slurmctld, slurmd as root, and wait until `sinfo` shows the node
#                              idle (idempotent: a cluster that already answers with accounting
#                              enforced is left as it is)
#   bash .ci/slurm.sh stop     stop the daemons this script started
#
# Accounting: slurmdbd keeps associations in MariaDB (both from Debian), and slurm.conf sets
# AccountingStorageEnforce=associations,limits,qos, so account limits and QOS keep jobs
# pending. Adding the cluster gives root an association, so root's jobs run as before.
#
# The node is this host with its real CPU count and memory. Processes are tracked without
# cgroups (proctrack/linuxproc, task/none) so it also runs inside a container. The partition
# over-subscribes CPUs, so a two-CPU runner still holds the handful of `sleep` jobs the tests
# submit at once. A slurm.conf that this script did not write is never overwritten.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
MARK="# written by costline .ci/slurm.sh"
RUN_DIR=/run/costline-slurm
SPOOL=/var/spool/costline-slurm
LOGS=/var/log/costline-slurm
WAIT_S="${SLURM_WAIT_S:-60}"
DBD_CONF="$CONF_DIR/slurmdbd.conf"
DB_SOCKET=/run/mysqld/mysqld.sock
DB_PID=/run/mysqld/mysqld.pid
DB_PASS=costline-slurmdbd

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo -n"; fi

say() { printf 'slurm.sh: %s\n' "$*"; }

node_idle() {
    # The node answers and can take a job: idle, or already running some (mixed/allocated).
    local state
    state=$(sinfo -h -N -o '%t' 2>/dev/null | head -n 1) || return 1
    case "$state" in idle | mix | alloc) return 0 ;; *) return 1 ;; esac
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v munged >/dev/null || missing+=(munge)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v mariadbd >/dev/null || missing+=(mariadb-server)
    if [ "${#missing[@]}" -gt 0 ]; then
        say "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        $sudo apt-get update -qq
        $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
    fi
}

write_config() {
    if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        say "$CONF exists and was not written here: using it as it is"
        return
    fi
    local host node
    host=$(hostname -s)
    # `slurmd -C` prints this host as a NodeName line: real CPUs, sockets, cores, memory.
    node=$(slurmd -C | head -n 1)
    $sudo mkdir -p "$CONF_DIR" "$SPOOL/ctld" "$SPOOL/d" "$LOGS" "$RUN_DIR"
    $sudo tee "$CONF" >/dev/null <<EOF
$MARK
ClusterName=costline
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations,limits,qos
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
SchedulerType=sched/backfill
# Jobs a lifted limit lets run start within seconds, not at the next 30 s backfill round.
SchedulerParameters=bf_interval=2
$node State=UNKNOWN
PartitionName=costline Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
EOF
    $sudo tee "$DBD_CONF" >/dev/null <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    $sudo chmod 0600 "$DBD_CONF"
}

accounting_enforced() {
    scontrol show config 2>/dev/null | grep -E '^AccountingStorageEnforce' | grep -q associations
}

start_mariadb() {
    if [ -S "$DB_SOCKET" ] && mariadb -uroot -e 'select 1' >/dev/null 2>&1; then return; fi
    $sudo mkdir -p /run/mysqld "$LOGS" && $sudo chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || $sudo mariadb-install-db --user=mysql >/dev/null
    say "starting MariaDB"
    # No TCP port: slurmdbd reaches it through the socket, and nothing else can clash.
    $sudo runuser -u mysql -- /usr/sbin/mariadbd --skip-networking --socket="$DB_SOCKET" \
        --pid-file="$DB_PID" --datadir=/var/lib/mysql </dev/null >>"$LOGS/mariadb.log" 2>&1 &
    for _ in $(seq 150); do
        mariadb -uroot -e 'select 1' >/dev/null 2>&1 && break
        sleep 0.2
    done
    $sudo mariadb -uroot -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
        || { say "MariaDB did not start"; tail -n 20 "$LOGS/mariadb.log" >&2; exit 1; }
}

start_slurmdbd() {
    if ! running slurmdbd; then
        say "starting slurmdbd"
        $sudo /usr/sbin/slurmdbd || { tail -n 20 "$LOGS/slurmdbd.log" >&2; exit 1; }
    fi
    for _ in $(seq 150); do
        sacctmgr -n list cluster >/dev/null 2>&1 && break
        sleep 0.2
    done
    # The cluster (and with it root's association) exists before slurmctld registers.
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx costline; then
        $sudo sacctmgr -i add cluster costline >/dev/null
    fi
}

alive() { [ -n "$1" ] && ps -o stat= -p "$1" 2>/dev/null | grep -qv '^Z'; }

pid_of() { cat "$RUN_DIR/$1.pid" 2>/dev/null || true; }

running() { alive "$(pid_of "$1")"; }

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    [ -s /etc/munge/munge.key ] || $sudo /usr/sbin/mungekey --create --force 2>/dev/null \
        || $sudo dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 status=none
    $sudo chown munge:munge /etc/munge/munge.key && $sudo chmod 0400 /etc/munge/munge.key
    $sudo mkdir -p /run/munge /var/log/munge /var/lib/munge
    $sudo chown munge:munge /run/munge /var/log/munge /var/lib/munge
    say "starting munged"
    $sudo runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    say "munged did not start"; exit 1
}

start_daemons() {
    $sudo mkdir -p "$SPOOL/ctld" "$SPOOL/d" "$LOGS" "$RUN_DIR"
    if ! running slurmctld; then
        say "starting slurmctld"
        $sudo /usr/sbin/slurmctld || { tail -n 20 "$LOGS/slurmctld.log" >&2; exit 1; }
    fi
    if ! running slurmd; then
        say "starting slurmd"
        $sudo /usr/sbin/slurmd || { tail -n 20 "$LOGS/slurmd.log" >&2; exit 1; }
    fi
}

wait_idle() {
    local host
    host=$(hostname -s)
    for _ in $(seq $((WAIT_S * 2))); do
        node_idle && return
        # A node left down by an earlier run (e.g. killed daemons) is brought back.
        if sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(down|drain|drng|unk)'; then
            $sudo scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
        fi
        sleep 0.5
    done
    say "the node did not become idle within ${WAIT_S}s:"
    sinfo -N -l || true
    tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" 2>/dev/null || true
    exit 1
}

stop_controller() {
    local daemon pid
    for daemon in slurmd slurmctld; do
        pid=$(pid_of "$daemon")
        if alive "$pid"; then
            say "restarting $daemon with accounting"
            $sudo kill "$pid"
            for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
        fi
    done
}

stop() {
    local daemon pid
    for daemon in slurmd slurmctld slurmdbd; do
        pid=$(pid_of "$daemon")
        if alive "$pid"; then
            say "stopping $daemon"
            $sudo kill "$pid"
            for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
        fi
    done
    pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
    if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && alive "$pid"; then
        say "stopping munged"
        $sudo kill "$pid" 2>/dev/null || true
    fi
    pid=$(cat "$DB_PID" 2>/dev/null || true)
    if [ -f "$DBD_CONF" ] && grep -qF "$MARK" "$DBD_CONF" && alive "$pid"; then
        say "stopping MariaDB"
        $sudo kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
    fi
}

case "${1:-start}" in
    start)
        # A cluster this script configured whose controller is down needs no probe (sinfo
        # would wait for its message timeout); any other cluster is used if it answers.
        if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && ! running slurmctld; then
            :
        elif command -v sinfo >/dev/null && node_idle && accounting_enforced; then
            say "Slurm is up: $(sinfo -h -N -o '%N %t %c CPUs %m MB')"
            exit 0
        elif command -v sinfo >/dev/null && node_idle && [ -f "$CONF" ] \
                && ! grep -qF "$MARK" "$CONF"; then
            say "Slurm is up without accounting, configured elsewhere: left as it is"
            exit 0
        fi
        install_packages
        write_config
        start_munge
        start_mariadb
        start_slurmdbd
        # A controller started by an earlier version of this script runs without accounting.
        if running slurmctld && ! accounting_enforced; then stop_controller; fi
        start_daemons
        wait_idle
        say "Slurm is up: $(sinfo -h -N -o '%N %t %c CPUs %m MB')"
        ;;
    stop) stop ;;
    *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Run one replica group on this host under torchrun, and start it again whenever it fails.
#
#   deploy/run_group.sh REPLICA_ID LIGHTHOUSE_HOST:PORT SCRIPT [SCRIPT_ARGS...]
#
# This is the orchestrator's part of a replicaft job, for hosts that have none (plain
# machines, or inside a Slurm step): a group that exits non-zero (a crash, a SIGKILLed rank,
# a lost quorum) is started again under the same replica id after RESTART_DELAY seconds and
# heals from its peers; a group that exits 0 has trained all its steps and stays down; a
# SIGTERM to this script (preemption, Ctrl-C) is passed on, the group saves if it is the
# checkpoint writer and leaves at its next step boundary, and nothing is restarted.
#
# Environment (all optional):
#   NPROC              ranks of this group on this host, W (default 1; GPUs per host for FSDP/TP)
#   PYTHON             interpreter with replicaft installed (default: python3)
#   RESTART_DELAY      seconds before a restart (default 2)
#   MAX_RESTARTS       give up after this many restarts (default 100)
#   REPLICAFT_HOST     the address peers use to reach this host's ranks (their TCPStore and
#                      state server). Default: this host's source address on the route to
#                      the lighthouse, i.e. the address the lighthouse sees.
#   GLOO_SOCKET_IFNAME the interface Gloo binds for the cross-group all-reduce. Default: the
#                      interface holding REPLICAFT_HOST. Without it Gloo binds the address the
#                      hostname resolves to, often 127.0.x.x, and cross-host all-reduces fail.
#   NCCL_SOCKET_IFNAME likewise for NCCL's bootstrap (default: the same interface).
#   Any other REPLICAFT_* variable (REPLICAFT_TOKEN, REPLICAFT_EVENTS_DIR, timeouts, ...) is
#   passed through to every rank.
set -uo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: $0 REPLICA_ID LIGHTHOUSE_HOST:PORT SCRIPT [SCRIPT_ARGS...]" >&2
    exit 2
fi
replica_id=$1
lighthouse=$2
shift 2
python=${PYTHON:-python3}
nproc=${NPROC:-1}
restart_delay=${RESTART_DELAY:-2}
max_restarts=${MAX_RESTARTS:-100}

# A replicated lighthouse is a comma-separated list: the first one tells this host's route.
first_lighthouse=${lighthouse%%,*}
lighthouse_host=${first_lighthouse%:*}
lighthouse_ip=$(getent ahostsv4 "$lighthouse_host" | awk 'NR == 1 { print $1 }')
if [[ -z $lighthouse_ip ]]; then
    echo "$0: cannot resolve the lighthouse host '$lighthouse_host' (from '$lighthouse')" >&2
    exit 2
fi
if [[ -z ${REPLICAFT_HOST:-} ]]; then
    REPLICAFT_HOST=$(ip -o route get "$lighthouse_ip" | awk '{ for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1) }')
fi
if [[ -z ${GLOO_SOCKET_IFNAME:-} ]]; then
    # The interface that holds the address, not the route's device: when the lighthouse runs
    # on this host too, the route goes through lo.
    GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v a="$REPLICAFT_HOST" '{ split($4, p, "/"); if (p[1] == a) print $2 }' | head -n 1)
fi
if [[ -z $REPLICAFT_HOST || -z $GLOO_SOCKET_IFNAME ]]; then
    echo "$0: cannot tell this host's address toward $lighthouse_ip; set REPLICAFT_HOST and GLOO_SOCKET_IFNAME" >&2
    exit 2
fi
export REPLICAFT_HOST GLOO_SOCKET_IFNAME
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$GLOO_SOCKET_IFNAME}
export REPLICAFT_LIGHTHOUSE=$lighthouse REPLICAFT_REPLICA_ID=$replica_id

child=""
stopping=0
on_term() {
    stopping=1
    [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
}
trap on_term TERM INT

restarts=0
while :; do
    echo "[run_group] $replica_id: starting $nproc rank(s) at $REPLICAFT_HOST ($GLOO_SOCKET_IFNAME), lighthouse $lighthouse" >&2
    # One torchrun per group and host; --standalone gives it a private rendezvous on a free
    # port, so several groups can share a host. --max-restarts 0: the whole group restarts
    # here, as one failure domain, never a single rank.
    "$python" -m torch.distributed.run --standalone --nproc-per-node "$nproc" --max-restarts 0 "$@" &
    child=$!
    wait "$child"
    status=$?
    # A trapped signal interrupts `wait`; wait again for the group's real exit status.
    while kill -0 "$child" 2>/dev/null; do
        wait "$child"
        status=$?
    done
    child=""
    if [[ $stopping == 1 ]]; then
        echo "[run_group] $replica_id: stopped by signal (exit $status)" >&2
        exit "$status"
    fi
    if [[ $status == 0 ]]; then
        echo "[run_group] $replica_id: finished" >&2
        exit 0
    fi
    if (( restarts >= max_restarts )); then
        echo "[run_group] $replica_id: exit $status after $restarts restarts (MAX_RESTARTS=$max_restarts); giving up" >&2
        exit "$status"
    fi
    restarts=$((restarts + 1))
    echo "[run_group] $replica_id: exit $status; restart $restarts in ${restart_delay}s" >&2
    sleep "$restart_delay"
    if [[ $stopping == 1 ]]; then
        exit 143
    fi
done

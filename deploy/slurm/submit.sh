#!/bin/bash
# Submit a replicaft job to Slurm: the lighthouse job, then the replica groups as an array
# job that starts once the lighthouse has started.
#
#   RUN_DIR=/shared/runs/gpt1 deploy/slurm/submit.sh [--groups R] SCRIPT [SCRIPT_ARGS...]
#
# Run it from the repository root: the jobs run there (so SCRIPT may be a relative path) and
# find deploy/ and .venv there (or set REPLICAFT_REPO and PYTHON). Logs go to RUN_DIR, where
# the lighthouse also leaves its address for the groups. Lighthouse flags: LIGHTHOUSE_ARGS
# (e.g. "--min-replicas 2 --progress-timeout 60"); LIGHTHOUSE_SBATCH=lighthouse-replicated.sbatch for the
# replicated lighthouse on etcd. Extra sbatch options: LIGHTHOUSE_SBATCH_ARGS and
# GROUPS_SBATCH_ARGS (e.g. "--partition=gpu --gpus-per-node=4").
set -euo pipefail
: "${RUN_DIR:?set RUN_DIR to a directory on storage shared by every node}"
groups=3
if [[ ${1:-} == --groups ]]; then
    groups=$2
    shift 2
fi
if [[ $# -lt 1 ]]; then
    echo "usage: RUN_DIR=DIR $0 [--groups R] SCRIPT [SCRIPT_ARGS...]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$RUN_DIR"
export RUN_DIR
# shellcheck disable=SC2086  # the *_SBATCH_ARGS are lists of options
lighthouse_job=$(sbatch --parsable --output="$RUN_DIR/replicaft-lighthouse-%j.out" \
    --export="ALL,REPLICAFT_REPO=${REPLICAFT_REPO:-$PWD}" ${LIGHTHOUSE_SBATCH_ARGS:-} "$here/${LIGHTHOUSE_SBATCH:-lighthouse.sbatch}" ${LIGHTHOUSE_ARGS:-})
# shellcheck disable=SC2086
groups_job=$(sbatch --parsable --output="$RUN_DIR/replicaft-%A_g%a.out" --array="0-$((groups - 1))" --dependency="after:$lighthouse_job" \
    --export="ALL,LIGHTHOUSE_JOB=$lighthouse_job,REPLICAFT_REPO=${REPLICAFT_REPO:-$PWD}" \
    ${GROUPS_SBATCH_ARGS:-} "$here/replicaft.sbatch" "$@")
echo "lighthouse job $lighthouse_job, replica groups job $groups_job (array 0-$((groups - 1))); logs in $RUN_DIR"
echo "stop: scancel $groups_job $lighthouse_job"

#!/bin/sh
# A user's MXNet parameter-server job on one machine: a scheduler, one server and two workers
# of mxnet_gluon.py (or $MXNET_SCRIPT, such as mxnet_module_loop.py) with the DMLC environment
# (MXNet's own way; the scheduler and the server run inside `import mxnet`).
# Usage: DMLC_PS_ROOT_PORT=9091 sh mxnet_ps.sh --steps 20
set -u
here=$(dirname "$0")
py=${PYTHON:-python}
train="$here/${MXNET_SCRIPT:-mxnet_gluon.py}"
export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="${DMLC_PS_ROOT_PORT:-9091}"
export DMLC_NODE_HOST=127.0.0.1
export DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=2
DMLC_ROLE=scheduler "$py" "$train" "$@" & scheduler=$!
DMLC_ROLE=server "$py" "$train" "$@" & server=$!
DMLC_ROLE=worker "$py" "$train" --kvstore dist_sync "$@" & w0=$!
DMLC_ROLE=worker "$py" "$train" --kvstore dist_sync "$@" & w1=$!
status=0
for pid in $w0 $w1 $server $scheduler; do wait "$pid" || status=$?; done
exit "$status"

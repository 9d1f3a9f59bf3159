#!/bin/bash
# after the last part: unpack the parts in $STAGE (default /tmp/stage), install the staged
# wheels and speccompat's into $SITE (default /tmp/site; a second staging of another vLLM
# goes to a folder of its own, e.g. STAGE=/tmp/stage22 SITE=/tmp/site22)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STAGE=${STAGE:-/tmp/stage} SITE=${SITE:-/tmp/site}
t0=$(date +%s)
rm -rf $STAGE/x && mkdir -p $STAGE/x
cat $STAGE/part_* | tar xf - -C $STAGE/x || { echo "UNPACK FAILED"; ls -la $STAGE; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $SITE $STAGE/x/wheels/*.whl 2>&1 | grep -v 'already exists' | tail -5
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $SITE "$here"/speccompat-*.whl 2>&1 | grep -v 'already exists' | tail -3
rm -rf $STAGE/x $STAGE/part_*
if [ -d $SITE/vllm/models/minimax_m3 ] && [ ! -d $SITE/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir ]; then
    echo "STAGING INCOMPLETE: this vLLM's CUDA servers import the CUTLASS DSL at warm-up and"
    echo "its libraries were not staged; stage again with tools/gpu/README's --keep flags"
    exit 4
fi
echo "installed in $(( $(date +%s) - t0 )) s"; du -sh $SITE; df -h /tmp | tail -1

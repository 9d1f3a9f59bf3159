#!/bin/bash
# after the last part: unpack, install the staged wheels and speccompat's into /tmp/site
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
t0=$(date +%s)
rm -rf /tmp/stage/x && mkdir -p /tmp/stage/x
cat /tmp/stage/part_* | tar xf - -C /tmp/stage/x || { echo "UNPACK FAILED"; ls -la /tmp/stage; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site /tmp/stage/x/wheels/*.whl 2>&1 | grep -v 'already exists' | tail -5
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$here"/speccompat-*.whl 2>&1 | grep -v 'already exists' | tail -3
rm -rf /tmp/stage/x /tmp/stage/part_*
echo "installed in $(( $(date +%s) - t0 )) s"; du -sh /tmp/site; df -h /tmp | tail -1

#!/bin/bash
# Issue #37 on one machine and one start (copy this file to .gpu/c2/job.sh): the vLLM 0.34.0
# benches of job_example.sh (items 1 and 2, staged into /tmp/site as usual), then item 3's
# three runs on vLLM 0.22.0 + speculators 0.3.0 (job_gpu_extract.sh). The 0.22.0 staging's
# parts travel while the benches run, each call doubling as the keep-alive poll:
#   mkdir -p /tmp/stage22 && cp .gpu/qNN/part_* /tmp/stage22/     carry [".gpu/qNN"]
# and after the last part `touch /tmp/stage22/ready`. This job installs them into
# /tmp/site22 only once the benches have ended, so the install takes no CPU from them.
set -u
bash /tmp/repo/tools/gpu/job_example.sh
echo "$(date -u +%T) waiting for /tmp/stage22/ready"
for _ in $(seq 1 ${PARTS_WAIT_S:-600}); do [ -e /tmp/stage22/ready ] && break; sleep 1; done
STAGE=/tmp/stage22 SITE=/tmp/site22 bash /tmp/repo/.gpu/c2/install.sh > /tmp/gpulogs/install22.log 2>&1
rc=$?  # before any $(...) below, which would set it anew
echo "$(date -u +%T) 0.22.0 install rc $rc: $(tail -3 /tmp/gpulogs/install22.log | head -1)"
# Item 3's three runs were measured on 2026-12-06 (H100: 0.960, 0.955, 0.958 of plain);
# what is left is where (b)'s seconds go: one profiled run unless RUNS/EXTRACT_ARGS say more.
RUNS=${RUNS:-1} EXTRACT_ARGS=${EXTRACT_ARGS---profile} SITE=/tmp/site22 \
    bash /tmp/repo/tools/gpu/job_gpu_extract.sh

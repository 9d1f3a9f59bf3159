#!/bin/bash
# Issue #37 on one machine and one start (copy this file to .gpu/c2/job.sh): the vLLM 0.34.0
# interleaved bench of job_example.sh (staged into /tmp/site as usual), then the old path's
# runs on vLLM 0.22.0 + speculators 0.3.0 (job_gpu_extract.sh). The 0.22.0 staging's parts
# travel while the bench runs, each call doubling as the keep-alive poll:
#   mkdir -p /tmp/stage22 && cp .gpu/qNN/part_* /tmp/stage22/     carry [".gpu/qNN"]
# and after the last part `touch /tmp/stage22/ready`. This job installs them into
# /tmp/site22 only once the bench has ended, so the install takes no CPU from it.
set -u
# Items 1 and 2 were measured compiled on 2026-12-06 (H100, docs/results/benchmarks.md);
# what is left there is item 1 as `--enforce-eager` servers run it (EAGER=1, ten rounds:
# four compiled ones gave speccompat / stock 0.993 +- 0.023, too wide for 1%)
# and no CLI bench (CLI_S=0). Set EAGER= CLI_S=330 for the compiled run with the CLI.
EAGER=${EAGER-1} ROUNDS=${ROUNDS:-10} SHM_S=${SHM_S:-660} CLI_S=${CLI_S:-0} bash /tmp/repo/tools/gpu/job_example.sh
echo "$(date -u +%T) waiting for /tmp/stage22/ready"
for _ in $(seq 1 ${PARTS_WAIT_S:-600}); do [ -e /tmp/stage22/ready ] && break; sleep 1; done
STAGE=/tmp/stage22 SITE=/tmp/site22 bash /tmp/repo/.gpu/c2/install.sh > /tmp/gpulogs/install22.log 2>&1
rc=$?  # before any $(...) below, which would set it anew
echo "$(date -u +%T) 0.22.0 install rc $rc: $(tail -3 /tmp/gpulogs/install22.log | head -1)"
# Item 3: five H100 runs gave 0.955-0.967 of (a) (2026-12-06). (a') splits that gap into the
# generator's engine settings (eager, 32 sequences, one generate per batch) and the capture:
# three runs of (a), (a') and (b) (RUNS, ONLY and EXTRACT_ARGS say otherwise).
SITE=/tmp/site22 bash /tmp/repo/tools/gpu/job_gpu_extract.sh

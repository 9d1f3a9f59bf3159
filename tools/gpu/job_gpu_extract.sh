#!/bin/bash
# A detached job for the H200 (issue #37 item 3): the old path's bench, three runs in a row
# on one host, each in fresh processes. Staging: ../shared/gpu/stage.py --vllm 0.22.0 --pkg
# speculators==0.3.0 --pkg "transformers<5" --keep transformers --keep tokenizers --keep
# huggingface-hub (7 parts, the host's torch); copy this file to .gpu/c2/job.sh.
set -u
source /tmp/repo/tools/gpu/job_start.sh
export VLLM_WORKER_MULTIPROC_METHOD=spawn  # the generator builds its executor after CUDA is up
# RUNS (default 3) runs; EXTRACT_ARGS adds to each (--profile: where (b)'s seconds go on
# the host; --trace /tmp/trace: one traced batch each of (a), (a') and (b), summed up in
# the log, and the allocator's counters);
# ONLY the kinds (default: (a), (a') the generator's engine settings without capture,
# (a'') the generator's own loop without capture, (b)); about 100 s a kind, 100 s more for
# the model's build in the first run.
for run in $(seq 1 ${RUNS:-3}); do
    timeout ${RUN_S:-480} python3 bench/gpu_extract.py --prompts 512 \
        --only ${ONLY:-vllm vllm-as-generator speculators-no-capture speculators} \
        ${EXTRACT_ARGS:-} --json /tmp/gpulogs/extract-$run.json > /tmp/gpulogs/extract-$run.log 2>&1
    step "run $run rc $?"
done
step end

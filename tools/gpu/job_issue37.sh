#!/bin/bash
# Issue #37 on one machine and one start (copy this file to .gpu/c2/job.sh; the 25-part
# vLLM 0.34.0 staging of tools/gpu/README.md installed into /tmp/site as usual, and for item
# 3 the 7-part 0.22.0 staging of job_gpu_extract.sh installed into /tmp/site22).
# Measured so far (docs/results/benchmarks.md): item 1 compiled on two hosts, 4 and 3 rounds
# (speccompat / stock 0.980 +- 0.027 over the 7; the second host's steady rates lower with
# speccompat in all 3 of its rounds, the first's not); eager 7 rounds (1.004 +- 0.038);
# item 2 done; item 3 eight H100 runs, (b)/(a) 0.951-0.967, and a GPU trace of (b).
# The plan, most wanted first (a job cut off by device time keeps what finished):
# 1. item 1 compiled, as many of COMPILED_ROUNDS (default 12) rounds as COMPILED_S allows
#    (--stop-after keeps the summary and the profiles). Three compiled servers took 200 s to
#    5.5 minutes to be up and warm (2026-12-06: 338 s on a fresh machine), a round 37-40 s:
#    COMPILED_S 1000 leaves about 12 rounds. The servers' logs come back
#    (bench_compiled-server-*.log: the adapters each applied).
# 2. item 3 only with ITEM3=1 and /tmp/site22 installed: ITEM3_RUNS (default 1) runs of (a),
#    (a') and (b) without --trace (figures; about 330 s with the model's build, 230 s after),
#    then with ITEM3_TRACE=1 one of (a') and (b) under --trace --profile, the traces kept
#    in the logs (bench/vllm_traces.py reads them).
# 3. item 1 eager only with EAGER_S set (three eager servers took 5.5 minutes to start;
#    rounds spread about 4%, too wide to resolve 1%: its steady state and its profile).
# ITEM3_FIRST=1 runs item 3 before item 1 (on an H200, where item 3's goal was met once:
# its three runs in a row come first, ITEM3_RUNS=3, ONLY="vllm speculators" for (a) and (b)).
set -u
item1_compiled() {
    SHM_LOG=bench_compiled EAGER= ROUNDS=${COMPILED_ROUNDS:-12} SHM_S=${COMPILED_S:-1000} CLI_S=0 \
        bash /tmp/repo/tools/gpu/job_example.sh
}
item3() {
    if [ "${ITEM3:-0}" = 1 ] && [ -d /tmp/site22/vllm ]; then
        SITE=/tmp/site22 RUNS=${ITEM3_RUNS:-1} ONLY="${ITEM3_ONLY:-vllm vllm-as-generator speculators}" \
            bash /tmp/repo/tools/gpu/job_gpu_extract.sh
        if [ "${ITEM3_TRACE:-0}" = 1 ]; then
            for f in /tmp/gpulogs/extract-[0-9]*; do mv "$f" "${f/extract-/extract-run}"; done
            SITE=/tmp/site22 RUNS=1 RUN_S=${TRACE_S:-300} ONLY="vllm-as-generator speculators" \
                EXTRACT_ARGS="--trace /tmp/trace --profile" bash /tmp/repo/tools/gpu/job_gpu_extract.sh
            for f in /tmp/gpulogs/extract-1.*; do mv "$f" "${f/extract-1/extract-trace}"; done
            for kind in vllm-as-generator speculators; do
                for f in /tmp/trace/$kind/*.pt.trace.json.gz; do
                    [ -f "$f" ] && cp "$f" "/tmp/gpulogs/trace-$kind-$(basename "$f")"
                done
            done
        fi
    fi
}
if [ "${ITEM3_FIRST:-0}" = 1 ]; then item3; item1_compiled; else item1_compiled; item3; fi
if [ -n "${EAGER_S:-}" ]; then
    SHM_LOG=bench_eager EAGER=1 ROUNDS=${EAGER_ROUNDS:-3} SHM_S=$EAGER_S CLI_S=0 \
        bash /tmp/repo/tools/gpu/job_example.sh
fi

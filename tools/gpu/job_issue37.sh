#!/bin/bash
# Issue #37 on one machine and one start (copy this file to .gpu/c2/job.sh; the 25-part
# vLLM 0.34.0 staging of tools/gpu/README.md installed into /tmp/site as usual, and for item
# 3 the 7-part 0.22.0 staging of job_gpu_extract.sh installed into /tmp/site22).
# Measured so far (docs/results/benchmarks.md): item 1 compiled, 26 rounds on one host
# (speccompat / stock median 1.002, 95% interval 0.997-1.019) and 7 on two others; eager 16
# rounds on two hosts (median 0.995, 0.960-1.060: rounds spread 6%, so 1% needs about 135
# rounds, more than a session's device time) and its profile; item 2 done; item 3 on an
# H200 three runs in a row, (b)/(a) 0.971, 0.975, 0.974 (goal met), two more 0.970 and
# 0.963 (2026-12-07); eleven H100 runs 0.951-0.967, the last three with (a''): the capture
# alone 1.0-1.2%, the generator without it 0.961-0.969 of (a); traces of (b) and (a'')
# (2026-12-07), of (a') earlier.
# Steps, in this order (a job cut off by device time keeps what finished):
# 1. item 1 compiled unless COMPILED_S=0: as many of COMPILED_ROUNDS (default 12) rounds as
#    COMPILED_S (default 1000) allows (--stop-after keeps the summary and the profiles).
#    Three compiled servers took 200-345 s to be up and warm, a round 37-40 s. The servers'
#    logs come back (bench_compiled-server-*.log: the adapters each applied).
# 2. item 3 only with ITEM3=1 and /tmp/site22 installed: ITEM3_RUNS (default 1) runs of
#    ITEM3_ONLY (default job_gpu_extract.sh's: (a), (a'), (a'') and (b)) without --trace (figures; about 100 s a
#    kind and 100 s for the model's build), then with ITEM3_TRACE=1 one of (a'), (a'') and
#    (b) under --trace --profile, the traces kept in the logs (bench/vllm_traces.py reads
#    them). (a'') is speculators' generator with the capture taken out: (b)/(a'') is the
#    capture alone, (a'')/(a') the generator's synchronous loop.
#    ITEM3_FIRST=1 runs it before step 1.
# 3. item 1 eager only with EAGER_S set: EAGER_ROUNDS (default 30) rounds, as many as
#    EAGER_S allows (three eager servers took 5.5-6.5 minutes to start, then 38-41 s a
#    round; paired rounds spread about 6%, so 16 rounds give +-3%), its steady state and
#    its profile.
#    With CONCURRENCY=64 (2026-12-07, 7 rounds) eager extraction ran at 0.97 x plain once
#    steady (0.88-0.91 at 32) and the profiled passes had no GPU gap of 20 ms or more; on
#    2026-12-08 (18 rounds, PROFILE=0, EAGER_S=940) 0.98-0.99 steady, speccompat / stock
#    median 0.994 (95% 0.989-1.001), the rounds' spread 2.5%; speculators' CLI against an
#    eager server at 64 (EAGER_CLI_S=480, which runs first) 0.91-0.92 of plain's steady rate.
#    Next start's plan (the 0.34.0 parts only): CONCURRENCY=64 PROFILE=0 with
#    SHM_CONFIGS="stock speccompat no-guard" (whether the zero-row check in the writer
#    thread is the 0.6% between speccompat and stock), or the default three configurations
#    for about 25 more rounds (+-1% at 2026-12-08's spread).
#    Item 3 on an H200 took 379 s for its first run of four kinds (the model's build 29 s),
#    287 s a run after; (a) and (b) alone 148-158 s a run.
set -u
item1_compiled() {
    [ "${COMPILED_S:-1000}" = 0 ] && return
    SHM_LOG=bench_compiled EAGER= ROUNDS=${COMPILED_ROUNDS:-12} SHM_S=${COMPILED_S:-1000} CLI_S=0 \
        bash /tmp/repo/tools/gpu/job_example.sh
}
item3() {
    if [ "${ITEM3:-0}" = 1 ] && [ -d /tmp/site22/vllm ]; then
        SITE=/tmp/site22 RUNS=${ITEM3_RUNS:-1} ONLY="${ITEM3_ONLY:-}" \
            bash /tmp/repo/tools/gpu/job_gpu_extract.sh
        if [ "${ITEM3_TRACE:-0}" = 1 ]; then
            for f in /tmp/gpulogs/extract-[0-9]*; do [ -f "$f" ] && mv "$f" "${f/extract-/extract-run}"; done
            traced="vllm-as-generator speculators-no-capture speculators"
            SITE=/tmp/site22 RUNS=1 RUN_S=${TRACE_S:-420} ONLY="$traced" \
                EXTRACT_ARGS="--trace /tmp/trace --profile" bash /tmp/repo/tools/gpu/job_gpu_extract.sh
            for f in /tmp/gpulogs/extract-1.*; do mv "$f" "${f/extract-1/extract-trace}"; done
            for kind in $traced; do
                for f in /tmp/trace/$kind/*.pt.trace.json.gz; do
                    [ -f "$f" ] && cp "$f" "/tmp/gpulogs/trace-$kind-$(basename "$f")"
                done
            done
        fi
    fi
}
if [ "${ITEM3_FIRST:-0}" = 1 ]; then item3; item1_compiled; else item1_compiled; item3; fi
# speculators' CLI against an eager server (EAGER_CLI_S seconds, a round of plain on the same
# settings first) runs before the eager rounds: the README's advice for eager servers rests on it.
if [ "${EAGER_CLI_S:-0}" != 0 ]; then
    EAGER=1 SHM_S=0 CLI_S=$EAGER_CLI_S CLI_CONFIGS="plain cli" bash /tmp/repo/tools/gpu/job_example.sh
fi
if [ -n "${EAGER_S:-}" ]; then
    SHM_LOG=bench_eager EAGER=1 ROUNDS=${EAGER_ROUNDS:-30} SHM_S=$EAGER_S CLI_S=0 \
        bash /tmp/repo/tools/gpu/job_example.sh
fi

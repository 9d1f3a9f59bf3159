#!/bin/bash
# A detached job for the H200 (launch.sh starts it from /tmp/repo; logs go to /tmp/gpulogs).
# The plan, most wanted first (a job cut off by device time keeps what finished): issue #37's
# benches: plain / stock / speccompat interleaved with the connector on /dev/shm, then the CLI
# at steady state on disk. The hybrid test (issue #35, passed on 0.34.0 on 2026-12-05) runs
# first only with HYBRID_S set (seconds, e.g. 420).
# Each step has its own limit; poll.sh brings back what is there whenever it is called.
set -u
source /tmp/repo/tools/gpu/job_start.sh
# (bench/cli_ceiling.py, the CLI's CPU ceiling on this host, ran on 2026-12-05: 9.49 ms per
# 1000-token request; beside the hybrid servers it only added noise to both.)
# Issue #35's last item: the hybrid servers with speccompat, one at a time, alone on the GPU
# (HYBRID_K="" adds vLLM alone, which passed on 0.34.0 on 2026-12-04).
if [ -n "${HYBRID_S:-}" ]; then
    timeout $HYBRID_S python3 -m pytest -p no:cacheprovider -v -rs \
        tests/gpu/test_hybrid_zero_rows.py -k "${HYBRID_K-not without_speccompat}" \
        > /tmp/gpulogs/hybrid.log 2>&1; step "hybrid rc $?"
fi
# Issue #37 item 1: plain / stock / speccompat, their servers up together and the rounds in
# turn, the connector writing to /dev/shm (the disk out of the figures); then one profiled
# pass each (where the time goes; vLLM's op tables come back, the traces stay in /tmp/prof).
# EAGER=1: the servers as `--enforce-eager` runs them (users' CUDA servers often do).
# SHM_CONFIGS: other configurations (bench/server_extract.py CONFIG_ENV), e.g. "stock
# speccompat no-guard" for speccompat without its per-file zero-row check (four servers
# do not fit the GPU at the 0.3 share each; three do).
# PROFILE_STACK=1: the profiled passes with the host's Python frames (what each thread ran
# while the GPU idled; the tracer slows the host, so those passes' figures are not rounds').
# CONCURRENCY (default 32): the clients' requests in flight.
# No round starts that would end within PROFILE_S of the step's limit: the summary and the
# profiled passes come back even where the servers start slowly (three eager ones took
# 5.5 minutes on 2026-12-06, and the limit cut that bench off after 7 rounds).
# PROFILE=0: no profiled passes (all the step's time for rounds). SHM_S=0 skips this step.
MODE=--no-eager; [ -n "${EAGER:-}" ] && MODE=""
SHM_S=${SHM_S:-560}
if [ "${PROFILE:-1}" = 0 ]; then
    PROFILE_ARGS=""; PROFILE_S=${PROFILE_S:-30}  # the summary's time only
else
    PROFILE_ARGS="--profile /tmp/prof --profile-prompts 128 ${PROFILE_STACK:+--profile-with-stack}"
    PROFILE_S=${PROFILE_S:-150}
fi
if [ "$SHM_S" != 0 ]; then
    timeout $SHM_S python3 bench/server_extract.py --llama-8b-shapes --prompts 512 \
        --prompt-len 1000 --concurrency ${CONCURRENCY:-32} $MODE --rounds ${ROUNDS:-4} --interleave \
        --configs ${SHM_CONFIGS:-plain stock speccompat} --storage /dev/shm/hs --workdir /tmp/bench-shm \
        $PROFILE_ARGS --stop-after $(( SHM_S - PROFILE_S )) \
        -- --gpu-memory-utilization 0.3 > /tmp/gpulogs/${SHM_LOG:-bench_shm}.log 2>&1
    step "bench shm rc $? (${SHM_LOG:-bench_shm}.log)"
    # Each server's log, shortened (one line per request otherwise): speccompat's lines (the
    # adapters it applied), warnings and errors, then its last 200 lines (the bench prints each
    # server's KV-cache size on its "server up" line).
    for f in /tmp/bench-shm/*/server.log; do
        [ -f "$f" ] && { grep -a -m 100 "speccompat\|WARNING\|ERROR" "$f"; echo "[...]"; tail -200 "$f"; } \
            > "/tmp/gpulogs/${SHM_LOG:-bench_shm}-server-$(basename "$(dirname "$f")").log"
    done
    rm -rf /dev/shm/hs /tmp/bench-shm
    for f in /tmp/prof/*/*profiler_out*.txt; do
        [ -f "$f" ] && cp "$f" "/tmp/gpulogs/${SHM_LOG:-bench_shm}-prof-$(basename "$(dirname "$f")")-$(basename "$f")"
    done
    rm -rf /tmp/prof  # a second bench in the same job profiles afresh
fi
# Issue #37 item 2: speculators' CLI at steady state (storage on the host's disk, as users
# have it), with and without --validate-outputs, and its output on another filesystem; the
# plain prefill to compare with is the interleaved run's, or with CLI_CONFIGS="plain cli" a
# round of plain on this step's own settings first. CLI_S=0 skips it; EAGER and CONCURRENCY
# apply here too (the CLI's --concurrency).
if [ "${CLI_S:-330}" != 0 ]; then
    timeout ${CLI_S:-330} python3 bench/server_extract.py --llama-8b-shapes --prompts 512 \
        --prompt-len 1000 --concurrency ${CONCURRENCY:-32} $MODE --configs ${CLI_CONFIGS:-cli} \
        --cli-prompts 16 512 --cli-variants validate no-validate validate-other-fs \
        --disk-probe 4 --workdir /tmp/bench-cli > /tmp/gpulogs/bench_cli.log 2>&1
    step "bench cli rc $?"
fi
rm -rf /tmp/bench-cli /dev/shm/cli-out-*
step end

#!/bin/bash
# A detached job for the H200 (launch.sh starts it from /tmp/repo; logs go to /tmp/gpulogs).
# The plan: the hybrid test alone (it never finished beside other servers), the GPU tests,
# vLLM's extraction tests, then issue #37's benches.
# Each step has its own limit; poll.sh brings back what is there whenever it is called.
set -u
cd /tmp/repo && source .gpu/c2/env.sh /tmp/repo
mkdir -p /tmp/gpulogs
step() { echo "$(date -u +%T) $*"; }
step start
python3 -c "import vllm, torch, speculators; print(vllm.__version__, torch.__version__, speculators.__version__)" \
    > /tmp/gpulogs/facts.txt 2>&1
# Issue #35's last item first: the hybrid servers, one at a time, alone on the GPU.
timeout ${HYBRID_S:-360} python3 -m pytest -p no:cacheprovider -v -rs \
    tests/gpu/test_hybrid_zero_rows.py > /tmp/gpulogs/hybrid.log 2>&1; step "hybrid rc $?"
# The server adapters' contract tests on the CUDA wheel, beside the GPU tests.
(timeout 150 python3 -m pytest -p no:cacheprovider -q -rs tests/contract/server \
    > /tmp/gpulogs/contract.log 2>&1; step "contract rc $?") &
# The other GPU tests, three at a time.
timeout ${TESTS_S:-480} python3 -m pytest -p no:cacheprovider -v -rs -n 3 --dist loadgroup \
    tests/gpu/test_gpu_server_path.py tests/gpu/test_gpu_layer_ids.py \
    tests/gpu/test_gpu_new_architectures.py > /tmp/gpulogs/tests.log 2>&1
step "tests rc $?"; wait
# vLLM's own extraction tests (carried to 0.34.0) with speccompat installed.
PYTHONPATH=$PYTHONPATH:/tmp/repo/tests/upstream:/tmp/repo/tests/upstream/vllm_v0.34.0 \
    timeout ${UP_S:-300} python3 -m pytest -p no:cacheprovider -v -rs tests/upstream/vllm_v0.34.0 \
    > /tmp/gpulogs/upstream.log 2>&1; step "upstream rc $?"
# Issue #37: speculators' CLI at steady state (storage on the host's disk, as users have it).
timeout ${CLI_S:-400} python3 bench/server_extract.py --llama-8b-shapes --prompts 512 \
    --prompt-len 1000 --concurrency 32 --no-eager --rounds 3 --configs plain cli \
    --cli-prompts 16 512 --cli-variants validate no-validate validate-other-fs --disk-probe 4 \
    --workdir /tmp/bench-cli > /tmp/gpulogs/bench_cli.log 2>&1; step "bench cli rc $?"
rm -rf /tmp/bench-cli /dev/shm/cli-out-*
# Issue #37: plain / stock / speccompat with the connector writing to /dev/shm.
timeout ${SHM_S:-480} python3 bench/server_extract.py --llama-8b-shapes --prompts 512 \
    --prompt-len 1000 --concurrency 32 --no-eager --rounds 5 --configs plain stock speccompat \
    --storage /dev/shm/hs --workdir /tmp/bench-shm > /tmp/gpulogs/bench_shm.log 2>&1
step "bench shm rc $?"; rm -rf /dev/shm/hs /tmp/bench-shm
step end

#!/bin/bash
# Issue #37 item 1 on one machine and one start (copy this file to .gpu/c2/job.sh; the
# 25-part vLLM 0.34.0 staging of tools/gpu/README.md, installed into /tmp/site as usual).
# Measured so far (docs/results/benchmarks.md): compiled, 4 rounds (speccompat / stock
# 0.993 +- 0.023, too wide for 1%); eager, 7 rounds cut off by the step's limit before the
# summary and the profiles (1.004 +- 0.038). Item 2 is done (CLI_S=0) and item 3 has seven
# H100 runs, the last two split into the generator's settings and the capture
# (tools/gpu/job_gpu_extract.sh runs it again).
# Device time: about 260 s to start and stage, then the two benches below, each as many
# rounds as its limit allows (--stop-after keeps the summary and the profiles); three servers
# took about 3 minutes to start compiled and 5.5 minutes eager (2026-12-06); about 1,700 s.
# Compiled: ten rounds, which resolve 1% at the 1.4% per-round spread seen. Eager rounds
# spread about 4%, too wide for 1% in any round count a session holds: three rounds, for its
# steady state and its profile (where eager extraction's extra 4% of plain goes).
set -u
SHM_LOG=bench_compiled EAGER= ROUNDS=${COMPILED_ROUNDS:-10} SHM_S=${COMPILED_S:-800} CLI_S=0 \
    bash /tmp/repo/tools/gpu/job_example.sh
SHM_LOG=bench_eager EAGER=1 ROUNDS=${EAGER_ROUNDS:-3} SHM_S=${EAGER_S:-640} CLI_S=0 \
    bash /tmp/repo/tools/gpu/job_example.sh

# source with the repo root as $1: the environment every step on the H200 runs in, with the
# staged packages of $SITE (default /tmp/site, where install.sh puts them)
REPO=$1
SITE=${SITE:-/tmp/site}
SP=$(env -u PYTHONPATH python3 -c "import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))")
NVLIBS=$(ls -d $SP/nvidia/*/lib $SP/nvidia/cu13/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=$SITE/nvidia/nccl/lib:${NVLIBS}${LD_LIBRARY_PATH:-}
# The CUTLASS DSL's packages only where its libraries were staged (the --keep flags): a
# `cutlass` without `_mlir` on the path breaks every vLLM 0.34.0 server at warm-up, whose
# kernel_warmup imports MiniMax-M3's CuTe ops for any model (seen on 2026-12-05).
DSL=$SITE/nvidia_cutlass_dsl/dsl_packages
[ -d $DSL/cutlass/_mlir ] || DSL=
export PYTHONPATH=$SITE${DSL:+:$DSL}:$REPO/tests
export VLLM_USE_FLASHINFER_SAMPLER=0 SPECCOMPAT_GPU_LOGS=/tmp/gpulogs PYTHONUNBUFFERED=1
export PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

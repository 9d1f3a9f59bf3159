# source with the repo root as $1: the environment every step on the H200 runs in, with the
# staged packages of $SITE (default /tmp/site, where install.sh puts them)
REPO=$1
SITE=${SITE:-/tmp/site}
SP=$(env -u PYTHONPATH python3 -c "import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))")
NVLIBS=$(ls -d $SP/nvidia/*/lib $SP/nvidia/cu13/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=$SITE/nvidia/nccl/lib:${NVLIBS}${LD_LIBRARY_PATH:-}
# The CUTLASS DSL's packages, which pth files would put on the path but PYTHONPATH does not
# reach. vLLM 0.34.0's kernel_warmup imports MiniMax-M3's CuTe ops for any model on CUDA, so
# its servers need the DSL whole (the --keep flags; install.sh refuses a staging without
# them): without `_mlir` the import fails ("No module named 'cutlass._mlir'", 2026-12-05),
# and without the path too ("No module named 'cutlass'", 2026-12-06).
DSL=$SITE/nvidia_cutlass_dsl/dsl_packages
[ -d $DSL/cutlass/_mlir ] || DSL=
export PYTHONPATH=$SITE${DSL:+:$DSL}:$REPO/tests
export VLLM_USE_FLASHINFER_SAMPLER=0 SPECCOMPAT_GPU_LOGS=/tmp/gpulogs PYTHONUNBUFFERED=1
export PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

# Sourced by each job.sh (launch.sh copies tools/ to /tmp/repo): the environment, the log
# folder, step() for the job log, and the facts of this host's install.
cd /tmp/repo && source .gpu/c2/env.sh /tmp/repo
mkdir -p /tmp/gpulogs
step() { echo "$(date -u +%T) $*"; }
step start
echo "== packages of ${SITE:-/tmp/site}, $(date -u +%T)" >> /tmp/gpulogs/facts.txt  # a second job adds its own
python3 -c "from importlib.metadata import version as v; print(*(f'{d} {v(d)}' for d in ('vllm', 'torch', 'speculators', 'transformers', 'speccompat')))" \
    >> /tmp/gpulogs/facts.txt 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; df -h /tmp /dev/shm; } \
    >> /tmp/gpulogs/facts.txt 2>&1

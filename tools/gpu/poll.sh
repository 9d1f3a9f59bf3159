#!/bin/bash
# one short look at the job: its log's tail; the logs into $OUT (at most 8 files)
sleep ${1:-20}
tail -${2:-6} /tmp/job.log
ls /tmp/gpulogs 2>/dev/null | wc -l
if [ -n "${OUT:-}" ]; then
  cp /tmp/job.log "$OUT"/ 2>/dev/null
  cd /tmp/gpulogs 2>/dev/null && tar czf "$OUT"/gpulogs.tgz . 2>/dev/null
  for f in hybrid.log bench_shm.log bench_compiled.log bench_eager.log bench_cli.log tests.log; do [ -f /tmp/gpulogs/$f ] && cp /tmp/gpulogs/$f "$OUT"/; done
fi
true

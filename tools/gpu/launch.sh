#!/bin/bash
# copy the repo's parts the job needs to /tmp/repo and start the job detached
rm -rf /tmp/repo && mkdir -p /tmp/repo/.gpu && cp -r src tests bench tools pyproject.toml /tmp/repo/ && cp -r .gpu/c2 /tmp/repo/.gpu/
cd /tmp/repo && setsid nohup bash .gpu/c2/job.sh > /tmp/job.log 2>&1 < /dev/null &
sleep 2; echo launched; cat /tmp/job.log

#!/bin/sh
# to-start.sh BUNDLE VER: unpack vLLM VER, copy the tree to /tmp/job, start to-job.sh VER there in the background
set -u
mkdir -p /tmp/site$2 && tar -xJf "$1"/vllm-*-sm90.tar.xz -C /tmp/site$2 || exit 3
rm -rf /tmp/job && mkdir /tmp/job && tar --exclude='./.bundle*' -cf - . | tar -xf - -C /tmp/job || exit 4
mkdir -p /tmp/to
cd /tmp/job && setsid nohup sh .devjob/to-job.sh $2 > /tmp/to/job-$2.log 2>&1 < /dev/null &
echo started

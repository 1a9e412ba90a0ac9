#!/bin/sh
# The issue's ratio: `opprof report TRACE --format html` vs `--format json`, 3 runs each, with
# the load average beside each run.   sh benchmarks/bench_html_vs_json.sh [TRACE]
T=${1:-/tmp/opprof-bench/nccl-x5.json.gz}
for fmt in json html; do
  for i in 1 2 3; do
    s=$(date +%s.%N)
    python -m opprof report "$T" --format $fmt -o /tmp/h.$fmt 2>/dev/null
    e=$(date +%s.%N)
    echo "$fmt run $i: $(echo "$e - $s" | bc) s  (load $(cut -d' ' -f1-3 /proc/loadavg))"
  done
done

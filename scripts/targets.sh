#!/usr/bin/env bash
# Runs, one after the other in one session, every benchmark that a
# performance target of the brief or of issues 9 and 11 is read from, and
# prints each benchmark's median (criterion's middle estimate). The rows of
# docs/benchmarks.md measured at `ea0e381`, and "Targets, one run" in
# docs/benchmarks-history.md, come from this output.
#
# Usage: bash scripts/targets.sh [--no-candle] > targets.txt
# Builds candle (benches/peers) unless --no-candle is given.
set -euo pipefail
cd "$(dirname "$0")/.."

short=(--warm-up-time 1 --measurement-time 3)

medians() {
  # criterion prints an id, then "time: [lo median hi]" on the same line or
  # the next; a "time:" line after "change:" is a change, not a time.
  awk '/^[a-z_]+\// { id = $1 }
       /time:/ && !/\(p =/ && id != "" { sub(/^.*time: *\[/, ""); split($0, t, " ");
                                          printf "%-58s %s %s\n", id, t[3], t[4]; id = "" }'
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
cargo bench --bench lookup -- 'find_var_root_hit/(scopetree_sym|scopetree_str|paddle_style|index_chase_floor)/(8|64|256)$' "${short[@]}" 2>&1 | medians
cargo bench --bench handles -- handle_read "${short[@]}" 2>&1 | medians
cargo bench --bench churn -- step_churn "${short[@]}" 2>&1 | medians
cargo bench --bench sharing -- "${short[@]}" 2>&1 | medians
cargo bench --bench scaling 2>&1 | medians
echo "# shared_name_scopes with transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1)"
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 cargo bench --bench scaling -- shared_name_scopes 2>&1 | medians
if [ "${1:-}" != "--no-candle" ]; then
  cargo bench -p scopetree-peers --bench peers -- peers_full_name "${short[@]}" 2>&1 | medians
  cargo bench -p scopetree-peers --bench candle_store -- \
    'candle_(re)?build_interleaved|candle_step_interleaved' --warm-up-time 1 --measurement-time 4 2>&1 | medians
fi
echo "# train_rnn, 10 epochs x 100 updates, steps/s with 1 and 2 workers, three pairs"
cargo build --release --example train_rnn 2>/dev/null
for _ in 1 2 3; do
  for w in 1 2; do
    printf 'workers %s: ' "$w"
    ./target/release/examples/train_rnn --workers "$w" --updates 100 | tail -1
  done
done
echo "# $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Instructions per request for each case of benches/cost.rs, counted by callgrind (stable on a
# noisy machine). Each case runs N and 2N requests; the difference over N removes set-up costs.
# valgrind hides the CPU's SHA extensions, so SHA-256 runs in software there: the last column
# leaves `sha2::sha256::compress256` out (on hardware with SHA-NI it costs a small fraction).
# Usage: bash benches/callgrind.sh [N] [CASE...]   (every case by default; needs valgrind:
# apt-get install valgrind). BENCH=step counts benches/step.rs's cases instead (name them).
# FEATURES=worker builds the bench with those features.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
shift || true
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(bare fresh replay no_retry tower_retry resilience_retry once_retry tower_timeout once_timeout
  echo resilience_breaker once_breaker once_breaker_consecutive once_breaker_keyed
  tower_hedge once_hedge tower_hedge_unarmed once_hedge_percentile)
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
bench=${BENCH:-cost}
bin=$(cargo bench --bench "$bench" ${FEATURES:+--features "$FEATURES"} --no-run --message-format=json 2>/dev/null \
  | sed -n "s/.*\"executable\":\"\([^\"]*$bench-[^\"]*\)\".*/\1/p" | tail -n 1)
[ -x "$bin" ] || { echo "could not build benches/$bench.rs"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # case requests -> "total sha256"
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" "$1" "$2" >/dev/null 2>&1
  total=$(callgrind_annotate "$out/cg" | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
  sha=$(callgrind_annotate "$out/cg" | sed -n 's/^ *\([0-9,]*\) .*sha256::compress256.*/\1/p' | head -n 1 | tr -d ,)
  echo "$total ${sha:-0}"
}
printf '%-26s %16s %22s\n' case instructions/request "without SHA-256 blocks"
for case in "${cases[@]}"; do
  read -r a asha <<<"$(count "$case" "$n")"
  read -r b bsha <<<"$(count "$case" $((2 * n)))"
  printf '%-26s %16d %22d\n' "$case" $(( (b - a) / n )) $(( (b - a - (bsha - asha)) / n ))
done

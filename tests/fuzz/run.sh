#!/usr/bin/env bash
# Build tests/fuzz/fuzz_container.c with clang's libFuzzer, AddressSanitizer
# and UBSan, replay the committed corpus, then fuzz for SECONDS (default 60)
# from a scratch copy of it (the committed corpus is left as it is; pass
# --merge to fold new coverage back into tests/fuzz/corpus).
#   tests/fuzz/run.sh [SECONDS] [--merge]
# A crash leaves its input in $KD_FUZZ_OUT (default /tmp/kd-fuzz) and fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
out=${KD_FUZZ_OUT:-/tmp/kd-fuzz}
cc=${FUZZ_CC:-clang}
mkdir -p "$out"
exe="$out/fuzz_container"
"$cc" -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Icsrc \
    csrc/*.c tests/fuzz/fuzz_container.c -lpthread -lm -o "$exe"
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
common=(-max_len=16384 -timeout=20 -rss_limit_mb=2048 -dict=tests/fuzz/container.dict
        -artifact_prefix="$out/")
echo "replaying tests/fuzz/corpus"
"$exe" "${common[@]}" -runs=0 tests/fuzz/corpus
if [ "$secs" -gt 0 ]; then
    rm -rf "$out/corpus"
    cp -r tests/fuzz/corpus "$out/corpus"
    echo "fuzzing for $secs s"
    "$exe" "${common[@]}" -max_total_time="$secs" -print_final_stats=1 "$out/corpus"
fi
if [ "${2:-}" = "--merge" ]; then
    "$exe" "${common[@]}" -merge=1 tests/fuzz/corpus "$out/corpus"
fi

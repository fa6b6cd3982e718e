#!/usr/bin/env bash
# Test the repaired wheels (tools/build_wheels.sh) where liburing is not
# installed: for each CPython, in a mount namespace where every liburing file
# (liburing.so*, liburing.a, the headers) is covered by an empty bind mount,
# install the wheel with its test extras into a fresh venv, then check that
# knndirect imports from the venv with io_uring compiled in, run the demo with
# --io-backend io_uring and `doctor`, and run the test suite against the
# installed wheel (tests/ and examples/ copied out of the source tree).
#
#   tools/test_wheels.sh                  # every wheel in dist/wheelhouse for 3.9-3.13
#   tools/test_wheels.sh 3.12 3.13        # only these
#   tools/test_wheels.sh --sdist [3.11]   # install dist/knndirect-*.tar.gz instead (built
#                                         # here, liburing hidden: it must build the
#                                         # thread backend and say so)
#
#   KEEP_LIBURING=1     do not hide liburing (no namespace, no root needed)
#   PYTEST_ARGS="..."   extra pytest arguments, shell-quoted (e.g. "-k 'doctor or cli'")
#   WORK=DIR            where venvs and logs go (default build/wheel-test)
#
# Hiding liburing needs root (unshare -m, mount --bind); nothing outside the
# namespace is changed. Prints a table: interpreter, tests passed / skipped /
# failed, io_uring, demo backend.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
SUPPORTED="3.9 3.10 3.11 3.12 3.13"
WORK=${WORK:-$root/build/wheel-test}
export WORK

mode=wheel
if [ "${1:-}" = "--sdist" ]; then
    mode=sdist
    shift
fi

if [ "${KEEP_LIBURING:-0}" != 1 ] && [ -z "${KD_LIBURING_HIDDEN:-}" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "hiding liburing needs root (unshare -m); run as root or with KEEP_LIBURING=1" >&2
        exit 2
    fi
    # Re-run this script in a private mount namespace.
    exec unshare --mount --propagation private env KD_LIBURING_HIDDEN=1 \
        "$root/tools/test_wheels.sh" \
        $([ $mode = sdist ] && echo --sdist) "$@"
fi

find_python() {
    local v=$1 p
    for p in "$PYENV_ROOT"/versions/"$v".*/bin/python"$v"; do
        [ -x "$p" ] && { echo "$p"; return; }
    done
    command -v "python$v" || true
}

hide_liburing() {
    local f real
    empty=$(mktemp -d /tmp/kd-hidden.XXXXXX)
    trap 'rm -rf "$empty"' EXIT
    : >"$empty/file"
    mkdir "$empty/dir"
    {
        ldconfig -p 2>/dev/null | awk '/liburing/ {print $NF}'
        ls -d /usr/lib/*/liburing* /usr/lib/liburing* /usr/lib64/liburing* \
              /usr/local/lib/liburing* /usr/local/lib64/liburing* /lib/*/liburing* \
              /usr/include/liburing.h /usr/include/liburing \
              /usr/local/include/liburing.h /usr/local/include/liburing 2>/dev/null || true
    } | while read -r f; do readlink -f "$f"; done | sort -u | while read -r real; do
        if [ -d "$real" ]; then
            mount --bind "$empty/dir" "$real"
        else
            mount --bind "$empty/file" "$real"
        fi
        echo "   hidden: $real"
    done
    # The proof: the dynamic loader cannot load it, the compiler cannot find it.
    if python3 -c 'import ctypes; ctypes.CDLL("liburing.so.2")' 2>/dev/null; then
        echo "liburing.so.2 still loads: not hidden" >&2
        exit 1
    fi
    echo "   liburing.so.2: $(python3 -c 'import ctypes
try:
    ctypes.CDLL("liburing.so.2")
except OSError as e:
    print("cannot be loaded:", e)' 2>&1)"
    if printf '#include <liburing.h>\nint main(void){struct io_uring r; return io_uring_queue_init(1, &r, 0);}\n' \
            | cc -x c - -o /dev/null -luring 2>/dev/null; then
        echo "liburing still links: not hidden" >&2
        exit 1
    fi
    echo "   liburing.h / -luring: not found by the compiler"
}

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
mkdir -p "$WORK"
summary=$WORK/summary-$mode.txt
: >"$summary"
if [ -n "${KD_LIBURING_HIDDEN:-}" ]; then
    echo "== liburing hidden (mount namespace of pid $$)"
    hide_liburing
    hidden=yes
else
    hidden=no
fi

# extras_of VENV_PYTHON: the test extra's requirements of the installed knndirect.
extras_of() {
    "$1" - <<'EOF'
import importlib.metadata as md, re
for r in md.requires("knndirect") or ():
    if re.search(r"""extra\s*==\s*["']test["']""", r):
        print(r.split(";")[0].strip().replace(" ", ""))
EOF
}

run_one() {
    local v=$1 tag=cp${1/./} py d vpy target rc=0 missing=() req
    py=$(find_python "$v")
    d=$WORK/$mode-$tag
    if [ -z "$py" ]; then
        printf '%-8s %-7s %7s %7s %7s %-9s %-9s %s\n' "$v" "-" - - - - - "no interpreter" >>"$summary"
        return
    fi
    if [ $mode = wheel ]; then
        target=$(ls "$root"/dist/wheelhouse/knndirect-"$version"-"$tag"-"$tag"-*.whl 2>/dev/null | head -1)
        if [ -z "$target" ]; then
            printf '%-8s %-7s %7s %7s %7s %-9s %-9s %s\n' "$v" "-" - - - - - "no wheel (tools/build_wheels.sh $v)" >>"$summary"
            return
        fi
    else
        target=$root/dist/knndirect-$version.tar.gz
    fi
    echo "== CPython $v: $(basename "$target") -> fresh venv $d/venv"
    rm -rf "$d"
    mkdir -p "$d"
    "$py" -m venv "$d/venv"
    vpy=$d/venv/bin/python
    # pip -v shows setup.py's "knndirect: building ..." line for the sdist.
    "$vpy" -m pip install -v "$target" >"$d/install.log" 2>&1 \
        || { tail -30 "$d/install.log"; echo "   install FAILED"; return 1; }
    grep -h "knndirect: building" "$d/install.log" | sed 's/^ *//; s/^/   build: /' | head -1 || true
    # The test extras, all at once; where one has no wheel for this Python,
    # one by one (the tests that need a missing one skip, saying why).
    mapfile -t reqs < <(extras_of "$vpy")
    if ! "$vpy" -m pip install -q --only-binary :all: "${reqs[@]}" >>"$d/install.log" 2>&1; then
        for req in "${reqs[@]}"; do
            "$vpy" -m pip install -q --only-binary :all: "$req" >>"$d/install.log" 2>&1 \
                || missing+=("$req")
        done
    fi
    [ ${#missing[@]} -eq 0 ] || echo "   extras without a wheel for $v (their tests skip): ${missing[*]}"

    rm -rf "$d/src"
    mkdir -p "$d/src"
    cp -r tests examples "$d/src/"
    # The C harnesses (tests/c, tests/fuzz) compile csrc/, the source and not
    # the wheel: left out, their tests skip as in an installed-package run.
    rm -rf "$d/src/tests/c" "$d/src/tests/fuzz"
    find "$d/src" -name __pycache__ -prune -exec rm -rf {} +
    cd "$d/src"
    local where feats uring demo_backend
    where=$(env -u PYTHONPATH "$vpy" -c 'import sys, knndirect
assert knndirect.__file__.startswith(sys.prefix), knndirect.__file__
maps = open("/proc/self/maps").read()
print(knndirect.__file__, "| liburing mapped:", "yes" if "liburing" in maps else "no")')
    echo "   imports $where"
    feats=$(env -u PYTHONPATH "$vpy" -c 'import knndirect as kd; print(kd.features())')
    echo "   features $feats"
    uring=$(env -u PYTHONPATH "$vpy" -c 'import knndirect as kd; print(kd.features()["io_uring"])')

    local backend_arg=io_uring
    [ "$uring" = True ] || backend_arg=auto
    env -u PYTHONPATH "$vpy" -m knndirect demo --io-backend $backend_arg --n 5000 --dim 32 \
        --queries 100 --dir "$d" >"$d/demo.log" 2>&1 || { cat "$d/demo.log"; rc=1; }
    demo_backend=$(sed -n 's/^opened: io_backend=\([a-z_]*\).*/\1/p' "$d/demo.log")
    grep -h "^opened:" "$d/demo.log" | sed 's/^/   demo: /' || true
    env -u PYTHONPATH "$vpy" -m knndirect doctor "$d" --probe-seconds 1 >"$d/doctor.txt" 2>&1 \
        || { cat "$d/doctor.txt"; rc=1; }
    sed -n 's/^  backend  *\(.*\)/   doctor: backend \1/p' "$d/doctor.txt"

    local t0=$SECONDS prc=0 extra=()
    eval "extra=(${PYTEST_ARGS:-})"   # shell quoting: PYTEST_ARGS="-k 'a or b'"
    env -u PYTHONPATH "$vpy" -m pytest -q -rs -p no:cacheprovider --rootdir "$d/src" \
        --basetemp "$d/pytest-tmp" "$d/src/tests" "${extra[@]}" >"$d/pytest.log" 2>&1 || prc=$?
    cd "$root"
    rm -rf "$d/pytest-tmp"
    local last passed skipped failed
    last=$(grep -E "[0-9]+ (passed|failed|error)" "$d/pytest.log" | tail -1)
    passed=$(grep -oE "[0-9]+ passed" <<<"$last" | cut -d' ' -f1)
    skipped=$(grep -oE "[0-9]+ skipped" <<<"$last" | cut -d' ' -f1)
    failed=$(( $(grep -oE "[0-9]+ failed" <<<"$last" | cut -d' ' -f1 || echo 0) + 0 ))
    failed=$(( failed + $(grep -oE "[0-9]+ errors?" <<<"$last" | cut -d' ' -f1 || echo 0) + 0 ))
    echo "   pytest: $last ($((SECONDS - t0)) s; log $d/pytest.log)"
    # Skip reasons, with how many tests each.
    grep -E "^SKIPPED" "$d/pytest.log" | sed -E 's/^SKIPPED \[([0-9]+)\] [^ ]+: /\1\t/' \
        | awk -F'\t' '{n[$2] += $1} END {for (r in n) printf "   skip: %4d  %s\n", n[r], r}' \
        | sort -t: -k2 -rn || true
    local result=ok
    { [ $prc -ne 0 ] || [ $rc -ne 0 ]; } && result=FAIL
    [ $mode = wheel ] && [ "$uring" != True ] && result=FAIL
    [ $mode = wheel ] && [ "$demo_backend" != io_uring ] && result=FAIL
    # Built where liburing is hidden, the sdist must have the thread backend
    # and say why.
    if [ $mode = sdist ] && [ $hidden = yes ]; then
        [ "$uring" = False ] || result=FAIL
        [ "$demo_backend" = threads ] || result=FAIL
        grep -q "compiled without liburing" "$d/doctor.txt" || result=FAIL
        grep -q "knndirect: building without io_uring" "$d/install.log" || result=FAIL
    fi
    printf '%-8s %-7s %7s %7s %7s %-9s %-9s %s\n' "$("$vpy" -c 'import platform; print(platform.python_version())')" \
        "$tag" "${passed:-0}" "${skipped:-0}" "$failed" "$uring" "${demo_backend:-?}" \
        "$result${missing:+ (no wheel: ${missing[*]})}" >>"$summary"
    [ $result = ok ]
}

status=0
for v in ${*:-$SUPPORTED}; do
    run_one "$v" || status=1
done
echo
echo "== $mode of knndirect $version, liburing hidden: $hidden"
printf '%-8s %-7s %7s %7s %7s %-9s %-9s %s\n' python tag passed skipped failed io_uring demo result
cat "$summary"
exit $status

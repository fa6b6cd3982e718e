#!/usr/bin/env bash
# Build liburing as a position-independent static library (liburing.a, no
# liburing.so) and install it with its headers, so that setup.py links it into
# knndirect._core and the wheel needs no liburing at run time. cibuildwheel runs
# this as before-all inside the manylinux container (see [tool.cibuildwheel] in
# pyproject.toml); it works on any Linux with a C compiler and make.
#
#   LIBURING_VERSION  release to build (default 2.7)
#   LIBURING_SRC      build this source tree instead of downloading the release
#   PREFIX            install prefix (default /usr/local: headers in
#                     $PREFIX/include, the library in $PREFIX/lib/liburing.a)
#
# Then build with KNNDIRECT_URING_STATIC=1 KNNDIRECT_LIBURING_A=$PREFIX/lib/liburing.a
# (and CPATH=$PREFIX/include when $PREFIX/include is not on the compiler's path).
set -euo pipefail
version=${LIBURING_VERSION:-2.7}
prefix=${PREFIX:-/usr/local}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${LIBURING_SRC:-}" ]; then
    cp -a "$LIBURING_SRC/." "$work/"
else
    url="https://github.com/axboe/liburing/archive/refs/tags/liburing-$version.tar.gz"
    echo "install_liburing: downloading $url"
    curl -fsSL --retry 3 "$url" | tar -xz -C "$work" --strip-components=1
fi
cd "$work"
./configure --prefix="$prefix" --libdir="$prefix/lib" --libdevdir="$prefix/lib" >/dev/null
# liburing compiles its static objects without -fPIC; the extension is a shared
# object, so they must be position-independent. No shared library is built.
make -C src -j"$(nproc 2>/dev/null || echo 2)" ENABLE_SHARED=0 CFLAGS="-O2 -fPIC" \
    prefix="$prefix" includedir="$prefix/include" libdir="$prefix/lib" \
    libdevdir="$prefix/lib" install >/dev/null
rm -f "$prefix/lib/liburing-ffi.a"
# Every object must link into a shared object, as the extension is one.
${CC:-cc} -shared -o "$work/check.so" -Wl,--whole-archive "$prefix/lib/liburing.a" \
    -Wl,--no-whole-archive -Wl,-z,defs
echo "install_liburing: $prefix/lib/liburing.a (position-independent, $(wc -c \
    < "$prefix/lib/liburing.a") bytes) and $prefix/include/liburing.h"

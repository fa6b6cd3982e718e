"""`python -m knndirect doctor [PATH]`: what knndirect will do on PATH's
filesystem, and why.

Reports the backend that ``io_backend="auto"`` takes there (io_uring or the
thread pool) with the reason, whether O_DIRECT works and the alignment reads
are rounded to, the SIMD kernels in use, and a short device probe: QD1
latency and batch IOPS of 4 KiB reads through the engine, on a temporary
index written next to PATH and deleted afterwards.

Only the public API, NumPy and the standard library are used (ctypes for the
io_uring_setup system call); nothing optional is imported.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

# float32 records of this dimension are 4096 bytes: one 4 KiB read each.
PROBE_DIM = 1024
PROBE_RECORD = PROBE_DIM * 4
# Reads in flight in the batch phase, and the batch size.
PROBE_DEPTH = 32
# io_uring_setup(2): the same number on every architecture that has it
# (x86_64, aarch64, ...; the numbering was unified in Linux 5.1).
SYS_IO_URING_SETUP = 425
# struct io_uring_params is 120 bytes; the kernel fills it in.
IO_URING_PARAMS_SIZE = 120
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs", "devtmpfs")


def _env_set(name):
    """The core's test of a KNNDIRECT_DISABLE_* switch: set, non-empty, not "0"."""
    value = os.environ.get(name)
    return bool(value) and value != "0"


def _read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def probe_io_uring():
    """Ask the kernel for a one-entry ring with io_uring_setup(2), directly.

    Returns a dict: ok (bool or None when it could not be tried), errno and
    error (the refusal, e.g. "EPERM"), sysctl (the value of
    /proc/sys/kernel/io_uring_disabled, None when the kernel has no such
    switch)."""
    out = {"ok": None, "errno": None, "error": None,
           "sysctl": _read_int("/proc/sys/kernel/io_uring_disabled")}
    if not sys.platform.startswith("linux"):
        out["error"] = "not Linux"
        return out
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError) as e:
        out["error"] = f"cannot call syscall(): {e}"
        return out
    syscall.restype = ctypes.c_long
    params = ctypes.create_string_buffer(IO_URING_PARAMS_SIZE)
    fd = syscall(ctypes.c_long(SYS_IO_URING_SETUP), ctypes.c_uint(1), params)
    if fd >= 0:
        os.close(fd)
        out["ok"] = True
    else:
        e = ctypes.get_errno()
        out.update(ok=False, errno=e, error=errno.errorcode.get(e, str(e)))
    return out


def filesystem_of(path):
    """The mount holding path, from /proc/self/mountinfo: mount_point,
    fstype, source (the device), or None values when unknown."""
    out = {"mount_point": None, "fstype": None, "source": None}
    try:
        st = os.stat(path)
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    real = os.path.realpath(path)
    best = None
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        post = line.split(" - ", 1)[1].split()
        mount_point = fields[4].replace("\\040", " ")
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if fields[2] != dev or not inside:
            continue
        # The deepest mount point wins; among equals, the later (top) mount.
        if best is None or len(mount_point) >= len(best[0]):
            best = (mount_point, post[0] if post else None,
                    post[1] if len(post) > 1 else None)
    if best:
        out.update(mount_point=best[0], fstype=best[1], source=best[2])
    return out


def _backend_reason(backend, compiled, uring):
    if backend == "io_uring":
        return "io_uring is compiled in and io_uring_setup works here"
    if backend == "mmap":
        return "mmap was asked for"
    if not compiled:
        return ("this build has no io_uring (it was compiled without liburing): reads go "
                "through the thread pool of pread. The manylinux wheels have it built in; "
                "a source build needs liburing (e.g. apt-get install liburing-dev)")
    if _env_set("KNNDIRECT_DISABLE_IO_URING"):
        return "KNNDIRECT_DISABLE_IO_URING is set in the environment"
    sysctl = uring["sysctl"]
    why = "io_uring is compiled in, but "
    if uring["ok"] is False:
        if uring["error"] == "EPERM":
            if sysctl == 2:
                why += ("io_uring is disabled system-wide (/proc/sys/kernel/io_uring_disabled "
                        "= 2)")
            elif sysctl == 1:
                why += ("io_uring is restricted to privileged processes and the "
                        "kernel.io_uring_group (/proc/sys/kernel/io_uring_disabled = 1)")
            else:
                why += ("io_uring_setup was refused with EPERM: a seccomp filter blocks it "
                        "(usually the default profile of a container runtime: Docker, "
                        "Podman, containerd, Kubernetes)")
        elif uring["error"] == "ENOSYS":
            why += ("io_uring_setup does not exist (ENOSYS): a kernel older than 5.1 or "
                    "built without CONFIG_IO_URING, or a seccomp filter answering ENOSYS")
        elif uring["error"] == "ENOMEM":
            why += ("io_uring_setup failed with ENOMEM: kernels before 5.12 charge rings to "
                    "RLIMIT_MEMLOCK (raise `ulimit -l`)")
        else:
            why += f"io_uring_setup failed with {uring['error']}"
    elif uring["ok"]:
        why += ("a one-entry ring works while the engine's ring failed (memory limits? "
                "RLIMIT_MEMLOCK on kernels before 5.12)")
    else:
        why += f"io_uring could not be probed ({uring['error']})"
    return why + "; reads go through the thread pool of pread"


def _direct_reason(direct_io, fstype, alignment):
    fs = fstype or "this filesystem"
    if direct_io:
        return f"O_DIRECT works on {fs}: reads bypass the page cache, aligned to {alignment} B"
    if _env_set("KNNDIRECT_DISABLE_DIRECT_IO"):
        return "O_DIRECT fell back to buffered reads: KNNDIRECT_DISABLE_DIRECT_IO is set"
    if fstype in MEMORY_FILESYSTEMS:
        return (f"O_DIRECT fell back to buffered reads: {fs} is memory-backed (the page cache "
                f"is the storage; O_DIRECT would save nothing)")
    return (f"O_DIRECT fell back to buffered reads: {fs} refused O_DIRECT (EINVAL at open "
            f"or at the first read); read-ahead is off")


def _open_quiet(kd, path, **kw):
    """kd.open with its fallback RuntimeWarnings collected, not shown."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        index = kd.open(path, **kw)
    return index, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _write_probe_index(kd, path, count, seed):
    """An index of count random 4 KiB records, built as cheaply as the
    engine allows (the graph is never searched)."""
    rng = np.random.default_rng(seed)
    index = kd.Index(PROBE_DIM, "l2", m=2, ef_construction=2, seed=seed)
    chunk = 1024
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        index.add(rng.standard_normal((n, PROBE_DIM), dtype=np.float32))
    index.save(path)
    index.close()


def device_probe(index, count, seconds, seed=0):
    """QD1: get_vectors of one random id at a time for half the time; then
    batches of PROBE_DEPTH distinct random ids for the other half."""
    rng = np.random.default_rng(seed)
    index.get_vectors(np.arange(min(count, PROBE_DEPTH), dtype=np.int64))  # warm up
    index.stats(reset=True)
    half = max(seconds, 0.01) / 2
    lat = []
    ids = rng.integers(0, count, size=4096, dtype=np.int64)
    end = time.perf_counter() + half
    i = 0
    while True:
        one = ids[i % len(ids):i % len(ids) + 1]
        t = time.perf_counter()
        index.get_vectors(one)
        now = time.perf_counter()
        lat.append(now - t)
        i += 1
        if now >= end:
            break
    qd1 = index.stats(reset=True)
    depth = min(PROBE_DEPTH, count)
    # Batches of distinct ids: consecutive slices of a shuffled order.
    order = rng.permutation(count).astype(np.int64)
    batches = len(order) // depth
    reads = 0
    t0 = time.perf_counter()
    end = t0 + half
    j = 0
    while True:
        k = j % batches
        index.get_vectors(order[k * depth:(k + 1) * depth])
        reads += depth
        j += 1
        now = time.perf_counter()
        if now >= end:
            break
    elapsed = now - t0
    batch = index.stats(reset=True)
    lat_us = np.asarray(lat) * 1e6
    return {
        "seconds": round(half * 2, 3),
        "qd1_reads": len(lat),
        "qd1_p50_us": round(float(np.median(lat_us)), 1),
        "qd1_p99_us": round(float(np.percentile(lat_us, 99)), 1),
        "batch_depth": depth,
        "batch_reads": reads,
        "batch_iops": round(reads / elapsed),
        "batch_mib_s": round(batch["read_bytes"] / elapsed / 2**20, 1),
        "bytes_per_read": round((qd1["read_bytes"] + batch["read_bytes"])
                                / max(1, qd1["read_ops"] + batch["read_ops"])),
    }


def diagnose(path=".", probe_seconds=2.0, probe_mib=16, probe=True):
    """Everything `doctor` reports, as a dict (what --json prints)."""
    import knndirect as kd

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist")
    directory = path if os.path.isdir(path) else (os.path.dirname(os.path.abspath(path)))
    feats = kd.features()
    uring = probe_io_uring()
    fs = filesystem_of(directory)
    report = {
        "knndirect": kd.__version__,
        "module": os.path.dirname(os.path.abspath(kd.__file__)),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "path": os.path.abspath(path),
        "directory": os.path.abspath(directory),
        "filesystem": fs,
        "features": feats,
        "simd": feats["simd"],
        "io_uring": {"compiled": feats["io_uring"], "setup": uring,
                     "env_disabled": _env_set("KNNDIRECT_DISABLE_IO_URING")},
        "backend": None, "backend_reason": None,
        "direct_io": None, "direct_io_reason": None,
        "alignment": None, "record_size": None, "fallbacks": None, "warnings": [],
        "index": None, "probe": None, "probe_skipped": None,
    }

    if os.path.isfile(path):
        # PATH is (perhaps) an index: how it opens, as it is.
        try:
            opened, caught = _open_quiet(kd, path)
            with opened:
                info = opened.info()
            report["index"] = {k: info[k] for k in ("io_backend", "direct_io", "alignment",
                                                    "record_size", "fallbacks", "count", "dim")}
            report["index"]["warnings"] = caught
        except (ValueError, OSError, KeyError) as e:
            report["index"] = {"error": f"not an index knndirect can open: {e}"}

    # A temporary index next to PATH: the backend and alignment auto gets
    # there, and the device probe.
    count = max(PROBE_DEPTH, int(probe_mib * 2**20) // PROBE_RECORD)
    workdir = None
    try:
        try:
            workdir = tempfile.mkdtemp(prefix=".knndirect-doctor-", dir=directory)
            probe_path = os.path.join(workdir, "probe.kdx")
            _write_probe_index(kd, probe_path, count, seed=0)
        except (OSError, ValueError) as e:
            report["probe_skipped"] = (f"cannot write a temporary index in {directory}: {e}")
            probe_path = None
        index = None
        if probe_path:
            try:
                index, caught = _open_quiet(kd, probe_path, direct_io=True, io_backend="auto",
                                            io_depth=PROBE_DEPTH)
            except (OSError, ValueError) as e:
                report["probe_skipped"] = (f"kd.open of a temporary index in {directory} "
                                           f"failed: {e}")
        if index is not None:
            with index:
                info = index.info()
                report.update(backend=info["io_backend"], direct_io=info["direct_io"],
                              alignment=info["alignment"], record_size=info["record_size"],
                              fallbacks=list(info["fallbacks"]), warnings=caught)
                if probe and probe_seconds > 0:
                    report["probe"] = device_probe(index, count, probe_seconds)
                    report["probe"]["file_mib"] = round(count * PROBE_RECORD / 2**20, 1)
                elif not report["probe_skipped"]:
                    report["probe_skipped"] = "not asked for"
    finally:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    ix = report["index"]
    if report["backend"] is None and ix and "io_backend" in ix:
        # No temporary index could be written: PATH's own index tells.
        report.update(backend=ix["io_backend"], direct_io=ix["direct_io"],
                      alignment=ix["alignment"], record_size=ix["record_size"],
                      fallbacks=list(ix["fallbacks"]))
    if report["backend"]:
        report["backend_reason"] = _backend_reason(report["backend"], feats["io_uring"], uring)
        report["direct_io_reason"] = _direct_reason(report["direct_io"], fs["fstype"],
                                                    report["alignment"])
    return report


def _yes(b):
    return "yes" if b else "no"


def format_report(r):
    """The human-readable report."""
    fs = r["filesystem"]
    where = fs["fstype"] or "unknown filesystem"
    if fs["source"] and fs["source"] != fs["fstype"]:
        where += f" on {fs['source']}"
    if fs["mount_point"]:
        where += f", mounted at {fs['mount_point']}"
    rows = [f"knndirect {r['knndirect']} doctor: {r['path']}",
            f"  filesystem    {where}",
            f"  platform      Python {r['python']}, Linux {r['kernel']}, {r['machine']}",
            f"  module        {r['module']}"]
    u = r["io_uring"]
    setup = u["setup"]
    state = ("works" if setup["ok"] else f"refused ({setup['error']})" if setup["ok"] is False
             else f"not tried ({setup['error']})")
    sysctl = "absent" if setup["sysctl"] is None else str(setup["sysctl"])
    rows.append(f"  io_uring      compiled in: {_yes(u['compiled'])}; io_uring_setup: {state}; "
                f"kernel.io_uring_disabled: {sysctl}")
    if r["backend"]:
        rows.append(f"  backend       {r['backend']} (what io_backend=\"auto\" uses here)")
        rows.append(f"    why         {r['backend_reason']}")
        direct = (f"yes, alignment {r['alignment']} B" if r["direct_io"]
                  else "no (buffered reads)")
        rows.append(f"  direct I/O    {direct}")
        rows.append(f"    why         {r['direct_io_reason']}")
        if r["fallbacks"]:
            rows.append(f"  fallbacks     {', '.join(r['fallbacks'])}")
    f = r["features"]
    rows.append(f"  SIMD          {r['simd']} (CPU: avx2 {_yes(f.get('avx2'))}, "
                f"avx512 {_yes(f.get('avx512'))}); 1-bit estimate {f.get('estimate')}")
    ix = r["index"]
    if ix:
        if "error" in ix:
            rows.append(f"  PATH          {ix['error']}")
        else:
            rows.append(f"  PATH index    {ix['count']:,} x {ix['dim']}: backend "
                        f"{ix['io_backend']}, direct I/O {_yes(ix['direct_io'])}, alignment "
                        f"{ix['alignment']} B, record {ix['record_size']} B"
                        + (f", fallbacks {', '.join(ix['fallbacks'])}" if ix["fallbacks"]
                           else ""))
    p = r["probe"]
    if p:
        kind = "O_DIRECT" if r["direct_io"] else "buffered (page cache, not the device)"
        rows.append(f"  device probe  {PROBE_RECORD // 1024} KiB {kind} reads through "
                    f"{r['backend']}, temporary {p['file_mib']:g} MiB file, {p['seconds']:g} s")
        rows.append(f"    QD1         p50 {p['qd1_p50_us']:,.1f} us, "
                    f"p99 {p['qd1_p99_us']:,.1f} us ({p['qd1_reads']:,} reads)")
        rows.append(f"    QD{p['batch_depth']:<10d}{p['batch_iops']:,} IOPS, "
                    f"{p['batch_mib_s']:,.1f} MiB/s ({p['batch_reads']:,} reads in batches "
                    f"of {p['batch_depth']})")
    elif r["probe_skipped"]:
        rows.append(f"  device probe  skipped: {r['probe_skipped']}")
    return "\n".join(rows)


def run(args):
    """The `doctor` command: args has path, json, probe_seconds, probe_mib."""
    report = diagnose(args.path, probe_seconds=args.probe_seconds, probe_mib=args.probe_mib,
                      probe=args.probe_seconds > 0)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(format_report(report))
    return 0

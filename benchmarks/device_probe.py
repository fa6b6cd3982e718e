"""The device's own limits, measured with fio: random 4 KiB O_DIRECT reads
over a byte range of a file (an index's vector section), so that a search's
figures can be put against what the device does without knndirect."""
import json
import os
import shutil
import subprocess


def busy_cpu_seconds():
    """CPU seconds spent so far, all cores, outside idle, iowait and steal
    (/proc/stat; user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:8]]
    return (t[0] + t[1] + t[2] + t[5] + t[6]) / os.sysconf("SC_CLK_TCK")


def fio_randread(path, offset, length, depth, seconds, batch=False):
    """Random 4 KiB O_DIRECT reads over [offset, offset + length) of path at
    queue depth `depth` for `seconds`, with io_uring, else libaio, else (at
    depth 1) psync. batch=True: `depth` reads submitted together and all
    awaited before the next `depth` go out, i.e. what one shortlist's batch
    costs the device (batch_ms = depth / IOPS).

    Returns {"engine", "depth", "seconds", "batch", "cpu_us_per_read",
    "batch_ms", "iops", "lat_mean_us", "clat_p50_us", "clat_p99_us"}, or
    {"error": ...} when fio is missing or every engine fails."""
    if shutil.which("fio") is None:
        return {"error": "fio not installed"}
    last = ""
    for engine in ("io_uring", "libaio", "psync"):
        if engine == "psync" and depth > 1:
            continue
        cmd = ["fio", "--name=probe", f"--filename={path}", "--readonly", "--rw=randread",
               "--bs=4k", "--direct=1", f"--ioengine={engine}", f"--iodepth={depth}",
               f"--offset={offset}", f"--size={length // 4096 * 4096}",
               f"--runtime={seconds}", "--time_based", "--norandommap", "--randrepeat=0",
               "--group_reporting", "--output-format=json"]
        if batch:
            cmd += [f"--iodepth_batch_submit={depth}", f"--iodepth_batch_complete_min={depth}"]
        cpu0 = busy_cpu_seconds()
        r = subprocess.run(cmd, capture_output=True, text=True)
        cpu = busy_cpu_seconds() - cpu0
        if r.returncode == 0:
            text = r.stdout[r.stdout.index("{"):]
            job = json.loads(text)["jobs"][0]["read"]
            clat = job["clat_ns"].get("percentile", {})
            ios = job.get("total_ios") or job["iops"] * seconds
            return {"engine": engine, "depth": depth, "seconds": seconds, "batch": batch,
                    # what issuing and completing a read costs the CPU (fio's
                    # own share included), the machine otherwise idle
                    "cpu_us_per_read": cpu * 1e6 / ios if ios else None,
                    "batch_ms": depth / job["iops"] * 1e3 if batch and job["iops"] else None,
                    "iops": job["iops"], "lat_mean_us": job["lat_ns"]["mean"] / 1e3,
                    "clat_p50_us": clat.get("50.000000", float("nan")) / 1e3,
                    "clat_p99_us": clat.get("99.000000", float("nan")) / 1e3}
        last = r.stderr.strip()[-300:]
    return {"error": "fio failed: " + last}

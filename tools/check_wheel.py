#!/usr/bin/env python3
"""Check built knndirect wheels: each is tagged manylinux (or musllinux), and
no extension module in it needs liburing (DT_NEEDED): liburing is linked in
statically, so the wheel imports where liburing is not installed.

    python tools/check_wheel.py WHEEL_OR_DIR...

Prints one line per wheel (its tags and what its extension needs); exit
status 1 when a wheel fails. Standard library only (it runs in cibuildwheel's
repair step): the ELF dynamic section is read here.
"""
import os
import struct
import sys
import zipfile

DT_NEEDED = 1
SHT_DYNAMIC = 6


def needed(elf):
    """DT_NEEDED names of a 64- or 32-bit, little- or big-endian ELF image."""
    if elf[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    is64 = elf[4] == 2
    end = "<" if elf[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", elf, 0x3A)
        shdr = end + "IIQQQQIIQQ"
        dyn, dynsize = end + "qQ", 16
    else:
        shoff, = struct.unpack_from(end + "I", elf, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", elf, 0x2E)
        shdr = end + "IIIIIIIIII"
        dyn, dynsize = end + "iI", 8
    sections = [struct.unpack_from(shdr, elf, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for sh in sections:
        if sh[1] != SHT_DYNAMIC:
            continue
        offset, size, link = sh[4], sh[5], sh[6]
        strtab = sections[link][4]
        for pos in range(offset, offset + size, dynsize):
            tag, val = struct.unpack_from(dyn, elf, pos)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                stop = elf.index(b"\0", strtab + val)
                names.append(elf[strtab + val:stop].decode())
    return names


def check(path):
    """(ok, line) for one wheel."""
    name = os.path.basename(path)
    problems = []
    platform = name[:-4].split("-")[-1]
    if not any(tag.startswith(("manylinux", "musllinux")) for tag in platform.split(".")):
        problems.append(f"platform tag {platform} is not manylinux/musllinux")
    report = []
    with zipfile.ZipFile(path) as zf:
        libs = [n for n in zf.namelist() if n.endswith(".so") or ".so." in n]
        for lib in libs:
            deps = needed(zf.read(lib))
            report.append(f"{lib} needs {', '.join(deps) or 'nothing'}")
            if lib.startswith("knndirect/_core") and any("liburing" in d for d in deps):
                problems.append(f"{lib} needs {[d for d in deps if 'liburing' in d]}")
        if not any(n.startswith("knndirect/_core") for n in libs):
            problems.append("no knndirect/_core extension in the wheel")
    line = f"{'ok  ' if not problems else 'FAIL'} {name}: " + "; ".join(report + problems)
    return not problems, line


def main(argv):
    wheels = []
    for arg in argv:
        if os.path.isdir(arg):
            wheels += sorted(os.path.join(arg, f) for f in os.listdir(arg)
                             if f.startswith("knndirect-") and f.endswith(".whl"))
        else:
            wheels.append(arg)
    if not wheels:
        print("check_wheel: no knndirect wheel given", file=sys.stderr)
        return 2
    status = 0
    for wheel in wheels:
        ok, line = check(wheel)
        print(line)
        status |= not ok
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Lists the GPU code in built files, as `cuobjdump --list-elf --list-ptx` does, and checks it.

usage: gpu_code.py [--expect LIST] [--cuobjdump PATH | --no-cuobjdump] FILE...

FILE: an executable, a shared library, an object or a static library (ar archive). The GPU code
sits in their .nv_fatbin sections: one container per translation unit with device code, each
holding SASS (ELF cubins, listed as sm_80, sm_90a, ...) and PTX (listed as compute_80, ...).
This script reads those containers itself, so it needs no CUDA tool; where cuobjdump is found
(PATH or /usr/local/cuda/bin) its --list-elf / --list-ptx answers must name the same code.

--expect sm_80,sm_89,sm_90a,compute_80,compute_90: every container of every FILE must hold each
of these (a translation unit built for fewer GPUs fails), and every FILE must hold GPU code.
Exit status: 0 when every check passes, 1 otherwise, 2 on a usage error.
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
FLAG_ARCH_SPECIFIC = 0x100000  # the 'a' of sm_90a (arch-specific features)


def elf_section(data, name):
    """The bytes of section `name` of a 64-bit little-endian ELF image, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0:
        return None

    def header(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)

    strtab = header(shstrndx)
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for i in range(shnum):
        sh_name, sh_type, _, _, off, size = header(i)
        end = names.find(b"\0", sh_name)
        if names[sh_name:end].decode(errors="replace") == name and sh_type != 8:  # 8: NOBITS
            return data[off:off + size]
    return None


def ar_members(data):
    """(name, bytes) of each member of an ar archive."""
    pos, longnames = 8, b""
    while pos + 60 <= len(data):
        head = data[pos:pos + 60]
        name = head[:16].decode(errors="replace").strip()
        size = int(head[48:58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name == "//":
            longnames = body
            continue
        if name in ("/", "/SYM64/"):
            continue
        if name.startswith("/") and name[1:].isdigit():
            start = int(name[1:])
            name = longnames[start:longnames.find(b"\n", start)].decode(errors="replace")
        yield name.rstrip("/"), body


def containers(fatbin):
    """Per fatbin container: the sorted list of its entries ('sm_90a', 'compute_80', ...)."""
    out, pos = [], 0
    while pos + 16 <= len(fatbin):
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", fatbin, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; padding in between
            continue
        entries, p, end = set(), pos + header_size, pos + header_size + fat_size
        while p + 64 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, p)
            if entry_header == 0:
                break
            arch = struct.unpack_from("<I", fatbin, p + 28)[0]
            flags = struct.unpack_from("<Q", fatbin, p + 40)[0]
            suffix = "a" if flags & FLAG_ARCH_SPECIFIC else ""
            if kind == KIND_ELF:
                entries.add(f"sm_{arch}{suffix}")
            elif kind == KIND_PTX:
                entries.add(f"compute_{arch}{suffix}")
            p += entry_header + payload
        out.append(sorted(entries))
        pos = end
    return out


def gpu_code(path):
    """[(where, entries)] for every fatbin container of the file."""
    data = open(path, "rb").read()
    found = []
    members = ar_members(data) if data[:8] == b"!<arch>\n" else [(os.path.basename(path), data)]
    for name, body in members:
        section = elf_section(body, ".nv_fatbin")
        if section:
            for i, entries in enumerate(containers(section)):
                found.append((f"{name}#{i}", entries))
    return found


def cuobjdump_names(tool, path):
    """The set of code cuobjdump lists (sm_XX for cubins, compute_XX for PTX)."""
    names = set()
    for flag, kind in (("--list-elf", "cubin"), ("--list-ptx", "ptx")):
        res = subprocess.run([tool, flag, path], capture_output=True, text=True)
        if res.returncode != 0 and "does not contain" not in (res.stdout + res.stderr):
            raise RuntimeError(f"{tool} {flag} {path}: {res.stderr.strip()}")
        for m in re.finditer(r"\.(sm_\d+[af]?)\." + kind + r"\b", res.stdout):
            names.add(m.group(1) if kind == "cubin" else m.group(1).replace("sm_", "compute_"))
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--expect", default="", help="comma-separated code every container must hold")
    ap.add_argument("--cuobjdump", default="", help="cuobjdump to cross-check with (default: found)")
    ap.add_argument("--no-cuobjdump", action="store_true")
    args = ap.parse_args()
    expect = [e for e in args.expect.split(",") if e]
    tool = None
    if not args.no_cuobjdump:
        tool = args.cuobjdump or shutil.which("cuobjdump")
        if not tool and os.access("/usr/local/cuda/bin/cuobjdump", os.X_OK):
            tool = "/usr/local/cuda/bin/cuobjdump"
    ok = True
    for path in args.files:
        found = gpu_code(path)
        union = sorted({e for _, entries in found for e in entries})
        print(f"{path}: {len(found)} containers; code: {' '.join(union) or 'none'}")
        if expect and not found:
            print(f"  FAIL: no GPU code (expected {','.join(expect)})")
            ok = False
        for where, entries in found:
            missing = [e for e in expect if e not in entries]
            if missing:
                print(f"  FAIL: {where} has {' '.join(entries)}; missing {' '.join(missing)}")
                ok = False
        if tool:
            theirs = cuobjdump_names(tool, path)
            if theirs != set(union):
                print(f"  FAIL: cuobjdump lists {' '.join(sorted(theirs))}")
                ok = False
            else:
                print(f"  cuobjdump ({tool}) lists the same")
    if not tool and not args.no_cuobjdump:
        print("(cuobjdump not found: the listing is this script's own reading of the fatbins)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

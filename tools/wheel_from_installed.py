"""Packs installed distributions back into wheels (for tools/device_install_check.sh).

    python3 tools/wheel_from_installed.py OUTDIR NAME... [--deps] [--exclude NAME,...]

Each named distribution's files, as its RECORD lists them, go into OUTDIR/NAME-VERSION-TAG.whl
under the tag its WHEEL file names, with a fresh RECORD; installer-written files (INSTALLER,
REQUESTED, direct_url.json) and bytecode are left out, and so are files outside site-packages
(console scripts, which pip regenerates from entry_points.txt). Used where a wheel is too large to
carry to a machine that already has the package installed: the same files, installed by pip into
a fresh environment. `--deps` also packs what they require (markers evaluated, extras not
followed), except the names given to `--exclude` (those the caller brings as wheels of its own).
Exits 1 naming any distribution it cannot pack.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import sys
import zipfile
from pathlib import Path

_SKIP = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def _tag(dist: md.Distribution) -> str:
    text = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Tag:")]
    if not tags:
        raise ValueError("no WHEEL file with a Tag (not installed from a wheel)")
    # py2-none-any and py3-none-any -> the compressed py2.py3-none-any of the file name
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    return "-".join(".".join(x) for x in parts)


def pack(name: str, out: Path) -> Path:
    dist = md.distribution(name)
    root = Path(dist.locate_file(""))
    norm = dist.metadata["Name"].replace("-", "_").replace(".", "_")
    whl = out / f"{norm}-{dist.version}-{_tag(dist)}.whl"
    info = None
    record = []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files or ():
            rel = f.as_posix()
            parts = f.parts
            if rel.startswith("..") or "__pycache__" in parts or rel.endswith(".pyc"):
                continue
            if parts[0].endswith(".dist-info"):
                info = parts[0]
                if parts[-1] in _SKIP:
                    continue
            src = root / f
            if not src.is_file():
                continue
            data = src.read_bytes()
            z.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        if info is None:
            raise ValueError("its RECORD lists no .dist-info directory")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return whl


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _closure(names: list[str], exclude: set[str]) -> list[str]:
    """`names` and, transitively, the installed distributions they require."""
    from pip._vendor.packaging.requirements import Requirement  # pip's vendored copy: always there

    seen: list[str] = []
    todo = list(names)
    while todo:
        n = _canon(todo.pop(0))
        if n in seen or n in exclude:
            continue
        seen.append(n)
        try:
            reqs = md.distribution(n).requires or []
        except md.PackageNotFoundError:
            continue  # reported by pack()
        for r in map(Requirement, reqs):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return seen


def main(argv: list[str]) -> int:
    deps = "--deps" in argv
    exclude: set[str] = set()
    args = []
    it = iter(argv)
    for a in it:
        if a == "--deps":
            continue
        if a == "--exclude":
            exclude |= {_canon(x) for x in next(it, "").split(",") if x}
            continue
        args.append(a)
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    names = _closure(args[1:], exclude) if deps else args[1:]
    bad = 0
    for name in names:
        try:
            print(pack(name, out))
        except (md.PackageNotFoundError, ValueError, OSError) as e:
            print(f"wheel_from_installed: {name}: {e}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

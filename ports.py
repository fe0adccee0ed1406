"""Which TCP ports this host's servers may bind: is an address free, who holds it, a free block.

    python ports.py check HOST PORT...                # exit 1, naming each holder, if any PORT is taken
    python ports.py free-base HOST START OFFSET...    # print the first base whose base + OFFSETs are free

launch.sh asks before it starts any role, so a second run on one host never binds another run's
ports: with PORT unset it takes the next free block (free-base), with PORT given a taken port stops
the start and names its holder (check). The standard library only (no zmq, no numpy), so the check
costs launch.sh an interpreter's start and nothing more. The servers' sockets are wire.py's.
"""
import argparse
import os
import socket


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind host:port now (with SO_REUSEADDR, as ZeroMQ binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0" if host in ("*", "0.0.0.0") else host, port))
            return True
        except OSError:
            return False


def port_holder(port: int) -> str:
    """Who listens on TCP `port` on this machine: "pid N: its command line", from /proc (Linux; what
    this user may see), or "" when that cannot be told."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(cols[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes} for fd in fds):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f"pid {pid}: " + " ".join(f.read().decode(errors="replace").replace("\0", " ").split())[:300]
        except OSError:
            continue
    return ""


def free_base(host: str, start: int, offsets: list[int], tries: int = 200) -> int | None:
    """The first base port from `start` (in steps of max(offsets) + 1) whose base + each offset is free."""
    step = max(offsets) + 1
    for base in range(start, min(start + tries * step, 65536 - step), step):
        if all(port_free(host, base + o) for o in offsets):
            return base
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Which TCP ports this host's servers may bind.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check", help="exit 1 and say who holds them if any of PORTs is taken on HOST")
    check.add_argument("host")
    check.add_argument("port", type=int, nargs="+")
    base = sub.add_parser("free-base", help="print the first base port from START whose base+OFFSET are all free")
    base.add_argument("host")
    base.add_argument("start", type=int)
    base.add_argument("offset", type=int, nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "check":
        taken = [p for p in args.port if not port_free(args.host, p)]
        for p in taken:
            print(f"port {p} is taken" + (f" by {who}" if (who := port_holder(p)) else ""))
        return 1 if taken else 0
    found = free_base(args.host, args.start, args.offset)
    if found is None:
        raise SystemExit(f"no free ports from {args.start}")
    print(found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

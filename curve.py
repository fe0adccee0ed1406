"""CURVE keys for the wire: key files, the allowlist a server admits, and `keygen`.

wire.py's servers and clients call these. Servers bind to loopback by default; binding any other
address requires CURVE keys (`python curve.py keygen DIR [--name NAME]` writes the pair DIR/NAME.key
and its public half DIR/NAME.pub). Traffic is then encrypted, and a server admits only the client public keys on its
allowlist; every other client is refused at the handshake (checked by a ZAP handler), so none of its
requests ever reaches a handler and its calls time out. Environment (each also a constructor argument):

    RLAX_CURVE_KEY         this process's own key pair (DIR/NAME.key), as server and as client
    RLAX_CURVE_CLIENTS     servers: the allowed client public keys, a directory of *.pub files or one
                           file of Z85 public keys, one a line (`# ` comments); default: own public key
    RLAX_CURVE_SERVER_KEY  clients: the server's public key (a .pub or .key file); default: own public key

With only RLAX_CURVE_KEY set, every role shares one pair: that pair's public key is the one allowed
client, so the shared-key setup needs nothing more. Per-role keys: one pair for the servers, one per
client; the servers get RLAX_CURVE_CLIENTS, the clients RLAX_CURVE_SERVER_KEY.
"""
from __future__ import annotations

import os
import threading

import zmq
from zmq.utils import z85


def load_key(path: str, secret: bool) -> bytes:
    """Keys are stored as the two Z85 lines (public, secret) written by `python curve.py keygen DIR`."""
    with open(path) as f:
        lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    if len(lines) < 2:
        raise ValueError(f"{path}: not a CURVE key pair (two Z85 lines written by `python curve.py keygen`)")
    return _z85_key(lines[1] if secret else lines[0], path)


def _z85_key(text: str | bytes, where: str) -> bytes:
    key = text.encode() if isinstance(text, str) else bytes(text)
    try:
        if len(key) != 40 or len(z85.decode(key)) != 32:
            raise ValueError
    except Exception:
        raise ValueError(f"{where}: {key[:48]!r} is not a Z85 CURVE key (40 characters)") from None
    return key


def _key_lines(path: str) -> list[bytes]:
    """The Z85 keys of a key file, one a line: the first word of each line; blank lines and lines
    that are "#" or start with "# " are skipped (a Z85 key may itself start with "#")."""
    with open(path) as f:
        words = [line.split()[0] for line in f.read().splitlines()
                 if line.strip() and line.strip() != "#" and not line.lstrip().startswith("# ")]
    return [_z85_key(word, path) for word in words]


def load_public_key(path: str) -> bytes:
    """The public key of a .pub file or of a key pair file: its first key either way."""
    keys = _key_lines(path)
    if not keys:
        raise ValueError(f"{path}: no public key in it")
    return keys[0]


def load_client_keys(source) -> set[bytes]:
    """The allowlist: a directory (every *.pub file in it), a file of Z85 public keys one a line
    (anything after the key on its line, blank lines and "# " comment lines are skipped), or an
    iterable of Z85 keys (str or bytes)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".pub"))
        else:
            files = [path]
        keys = {key for name in files for key in _key_lines(name)}
        where = path
    else:
        keys, where = {_z85_key(k, "curve_clients") for k in source}, "curve_clients"
    if not keys:
        raise ValueError(f"{where}: no client public keys "
                         "(a server with an empty allowlist would refuse everyone)")
    return keys


def curve_keys_from_env() -> str | None:
    """RLAX_CURVE_KEY: path of this process's key pair (with one shared pair, every role's)."""
    return os.environ.get("RLAX_CURVE_KEY") or None


class ZapHandler:
    """The ZAP handler of one context (ZeroMQ allows one): a REP socket on inproc://zeromq.zap.01
    in a daemon thread that admits a CURVE client only if its public key is on the allowlist of the
    server socket's ZAP domain. Unknown domains are refused; other mechanisms (NULL, loopback
    servers without keys) are not gated here."""

    _lock = threading.Lock()
    _by_ctx: dict[int, "ZapHandler"] = {}

    @classmethod
    def of(cls, ctx: zmq.Context) -> "ZapHandler":
        with cls._lock:
            handler = cls._by_ctx.get(id(ctx))
            if handler is None or not handler.thread.is_alive():
                handler = cls._by_ctx[id(ctx)] = cls(ctx)
            return handler

    def __init__(self, ctx: zmq.Context):
        self.domains: dict[bytes, tuple[str, frozenset]] = {}
        self.refused: dict[bytes, int] = {}
        self._warned: set[tuple[bytes, bytes]] = set()
        ready, self._error = threading.Event(), None
        self.thread = threading.Thread(target=self._run, args=(ctx, ready), name="rlax-zap", daemon=True)
        self.thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error

    def allow(self, domain: bytes, server: str, keys) -> None:
        self.domains[domain] = (server, frozenset(z85.decode(k) for k in keys))
        self.refused[domain] = 0

    def forget(self, domain: bytes) -> None:
        self.domains.pop(domain, None)

    def _run(self, ctx: zmq.Context, ready: threading.Event) -> None:
        try:
            sock = ctx.socket(zmq.REP)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("inproc://zeromq.zap.01")
        except zmq.ZMQError as e:  # someone else already handles ZAP in this context
            self._error = RuntimeError(f"cannot start the CURVE allowlist (ZAP) handler: {e}")
            ready.set()
            return
        ready.set()
        while True:
            try:
                request = sock.recv_multipart()
            except zmq.ZMQError:  # context terminated
                sock.close(0)
                return
            version, request_id, domain, address, _identity, mechanism = (request + [b""] * 6)[:6]
            credentials = request[6:]
            status, text, user = b"200", b"OK", b""
            if mechanism == b"CURVE":
                server, keys = self.domains.get(domain, ("?", frozenset()))
                if not credentials or credentials[0] not in keys:
                    status, text = b"400", b"client key not allowed"
                    if domain in self.refused:
                        self.refused[domain] += 1
                    who = z85.encode(credentials[0]) if credentials else b"?"
                    if (domain, who) not in self._warned:  # clients retry every 100 ms: say it once
                        self._warned.add((domain, who))
                        print(f"wire: {server} refused CURVE client {who.decode()} from "
                              f"{address.decode(errors='replace')}: key not on the allowlist", flush=True)
                else:  # the client's messages carry its key as their User-Id (wire.Server.client_key)
                    user = z85.encode(credentials[0])
            try:
                sock.send_multipart([version, request_id, status, text, user, b""])
            except zmq.ZMQError:
                sock.close(0)
                return


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="CURVE keys for the wire.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    keygen = sub.add_parser(
        "keygen", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="write a CURVE key pair DIR/NAME.key (chmod 600) and its public key DIR/NAME.pub",
        description="Write a CURVE key pair to DIR/NAME.key (public and secret key, chmod 600; keep it\n"
                    "private) and the public key alone to DIR/NAME.pub (hand it to the other side).",
        epilog="One shared pair (every role, nothing else to set):\n"
               "  python curve.py keygen keys            # then RLAX_CURVE_KEY=keys/curve.key everywhere\n"
               "Per-role pairs: one for the servers, one per client:\n"
               "  python curve.py keygen keys/server --name server\n"
               "  python curve.py keygen keys/clients --name worker0   # keys/clients/worker0.pub is allowed\n"
               "  servers: RLAX_CURVE_KEY=keys/server/server.key RLAX_CURVE_CLIENTS=keys/clients\n"
               "  clients: RLAX_CURVE_KEY=keys/clients/worker0.key "
               "RLAX_CURVE_SERVER_KEY=keys/server/server.pub\n"
               "RLAX_CURVE_CLIENTS is a directory of *.pub files or a file of Z85 public keys, one a line.")
    keygen.add_argument("dir")
    keygen.add_argument("--name", default="curve", help="file name stem (default: curve)")
    args = parser.parse_args()
    if args.cmd == "keygen":
        os.makedirs(args.dir, exist_ok=True)
        public, secret = zmq.curve_keypair()
        path = os.path.join(args.dir, args.name + ".key")
        pub_path = os.path.join(args.dir, args.name + ".pub")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(public.decode() + "\n" + secret.decode() + "\n")
        with open(pub_path, "w") as f:
            f.write(public.decode() + "\n")
        print(f"wrote {path} (secret: RLAX_CURVE_KEY of the role that owns it) and {pub_path} "
              f"(public: put it in a server's RLAX_CURVE_CLIENTS directory, or give it to clients as "
              f"RLAX_CURVE_SERVER_KEY); with one pair shared by every role, RLAX_CURVE_KEY={path} is all")

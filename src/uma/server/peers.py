"""Who is at the other end of a connection: the process, named as an app for fair share.

An app that names itself nowhere (no `app`, `configure`, `X-App` or `user`) is the process
that sent the request: one process's twelve connections are one app, not twelve, so its flood
no longer outnumbers another process's single question (docs/design/scheduling.md, "Fair share
between apps"). On the Unix socket the OS tells the peer's process id (SO_PEERCRED on Linux,
LOCAL_PEERPID on macOS). A loopback TCP connection has no such option; on Linux the kernel
tells the inode and owner of the client's end of it (sock_diag, as `ss` asks it: 0.02 ms; the
text of /proc/net/tcp says the same but costs milliseconds to read, the kernel walking every
bucket of its connection table, so it is only the fallback), and the process holding it
has a `socket:[inode]` link in /proc/<pid>/fd (about 20 us a process scanned: 0.1 ms when the
client is the newest of 93, 7 ms behind 300 others). Where that process cannot be seen
(another user's, to a daemon without root) the socket's owner is known still, and that user's
processes share one app. Elsewhere (macOS has no /proc, and running lsof for each connection
would cost a process start) an HTTP connection stays its own app.

The parsing and naming below are pure functions over bytes, text and fd links; the reading
is the thin rest.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[Address, int]

# The app name's characters (uma.app): anything else in a process's name becomes "-".
_UNNAMEABLE = re.compile(r"[^A-Za-z0-9._:@/+-]")
_COMM_CHARS = 15  # the kernel keeps 15 bytes of a process's name (TASK_COMM_LEN - 1)
# How long one lookup may scan /proc/<pid>/fd before it settles for the socket's owner.
SCAN_BUDGET_S = 0.25

# <linux/netlink.h>, <linux/sock_diag.h>, <linux/inet_diag.h>
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, ext, pad, states
_SOCKID = struct.Struct("!HH16s16s")  # inet_diag_sockid: ports, addresses (network order)
_SOCKID_REST = struct.Struct("=III")  # ... interface, cookie (INET_DIAG_NOCOOKIE: ~0)
_DIAG_MSG = struct.Struct("=BBBB48sIIIII")  # inet_diag_msg: ..., id, ..., uid, inode


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """A TCP socket as the kernel lists it (sock_diag, /proc/net/tcp): its inode (0 once no
    process holds it) and the id of the user who opened it."""

    inode: int
    uid: int


def process_app(pid: int, comm: str | None) -> str:
    """The app name of process `pid` called `comm` (its /proc/<pid>/comm, None where
    unknown): 'python3:4242', or 'pid4242' without a name. Stable for the process's life
    and valid for uma.app.app_name."""
    name = _UNNAMEABLE.sub("-", (comm or "").strip())[:_COMM_CHARS]
    return f"{name}:{pid}" if name else f"pid{pid}"


def user_app(uid: int) -> str:
    """The app name of a user whose processes this daemon cannot see: 'uid1001'."""
    return f"uid{uid}"


def loopback(host: str) -> Address | None:
    """The address of a client on this machine (127.0.0.0/8, ::1, or either as IPv4-mapped
    IPv6), normalised to IPv4 where it is one; None for any other host."""
    try:
        address = _plain(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return None
    return address if address.is_loopback else None


def find_socket(table: str, local: Endpoint, remote: Endpoint,
                byteorder: str = sys.byteorder) -> TcpSocket | None:
    """In the text of /proc/net/tcp or /proc/net/tcp6, the socket whose own end is `local`
    and whose other end is `remote` (IPv4-mapped addresses match their IPv4 form). The
    kernel prints each 32-bit word of an address in the host's byte order, the port in
    hex."""
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            if (_endpoint(fields[1], byteorder) == local
                    and _endpoint(fields[2], byteorder) == remote):
                return TcpSocket(inode=int(fields[9]), uid=int(fields[7]))
        except ValueError:
            continue
    return None


def diag_request(local: Endpoint, remote: Endpoint) -> bytes:
    """The sock_diag request (a netlink message) for the TCP socket whose own end is `local`
    and whose other end is `remote`."""
    family = socket.AF_INET if local[0].version == 4 else socket.AF_INET6
    sockid = _SOCKID.pack(local[1], remote[1], local[0].packed.ljust(16, b"\0"),
                          remote[0].packed.ljust(16, b"\0")) \
        + _SOCKID_REST.pack(0, 0xFFFFFFFF, 0xFFFFFFFF)
    body = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    return _NLMSG.pack(_NLMSG.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) \
        + body


def diag_reply(data: bytes, request: bytes) -> TcpSocket | None:
    """The socket a sock_diag reply describes, if it is the one `request` asked for; None for
    an error reply (ENOENT: no such socket) or anything else."""
    if len(data) < _NLMSG.size + _DIAG_MSG.size:
        return None
    _, kind, _, _, _ = _NLMSG.unpack_from(data)
    if kind != _SOCK_DIAG_BY_FAMILY:
        return None
    _, _, _, _, sockid, _, _, _, uid, inode = _DIAG_MSG.unpack_from(data, _NLMSG.size)
    asked = request[_NLMSG.size + _DIAG_REQ.size:][:_SOCKID.size]
    return TcpSocket(inode=inode, uid=uid) if sockid[:_SOCKID.size] == asked else None


def holder(inode: int, fds: Iterable[tuple[int, Iterable[str]]]) -> int | None:
    """The first process of `fds` ((pid, its fd links) pairs) holding socket `inode`. A socket
    shared across a fork is held by several: the first listed is taken."""
    if not inode:
        return None
    target = f"socket:[{inode}]"
    for pid, links in fds:
        if any(link == target for link in links):
            return pid
    return None


def _endpoint(text: str, byteorder: str) -> Endpoint:
    hex_address, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_address)
    if len(raw) not in (4, 16):
        raise ValueError(text)
    if byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw)
    return _plain(address), int(hex_port, 16)


def _plain(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# --- reading /proc ---------------------------------------------------------------------------


def peer_process(sock: socket.socket) -> int | None:
    """The id of the process at the other end of a Unix socket connection: SO_PEERCRED on
    Linux, LOCAL_PEERPID on macOS; None where the OS does not tell."""
    try:
        if hasattr(socket, "SO_PEERCRED"):
            pid, _, _ = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        elif sys.platform == "darwin":
            # SOL_LOCAL and LOCAL_PEERPID from <sys/un.h>; Python names neither
            pid = struct.unpack("i", sock.getsockopt(0, 0x002, 4))[0]
        else:
            return None
    except OSError:
        return None
    return pid or None  # 0: a process outside this one's PID namespace


def socket_app(pid: int | None) -> str | None:
    """The app name of a Unix socket's peer process (peer_process), or None where the OS did
    not tell it. Its name is read on Linux only: 'pid4242' elsewhere."""
    return None if pid is None else process_app(pid, _comm(pid))


def tcp_app(client: tuple[str, int], server: tuple[str, int]) -> str | None:
    """The app name of the process on this machine at the other end of the TCP connection
    from `client` to `server` (host, port pairs as the server sees them): its process, else
    its user; None for a client elsewhere, or where /proc does not tell (not Linux, or the
    client closed its end). Blocks for a /proc scan: a few milliseconds (at most
    SCAN_BUDGET_S); call it off the event loop."""
    client_ip, server_ip = loopback(client[0]), loopback(server[0])
    if client_ip is None or server_ip is None:
        return None
    # The client's end: its own address is the one we see it from, its other end is ours.
    local, remote = (client_ip, client[1]), (server_ip, server[1])
    found = _diag(local, remote) or _table(local, remote)
    if found is None:
        return None
    pid = holder(found.inode, _processes(found.uid, time.monotonic() + SCAN_BUDGET_S))
    return socket_app(pid) if pid is not None else user_app(found.uid)


class TcpPeer:
    """One HTTP connection's client process, as an app name: looked up once, on the first
    request that asks (off the event loop), and kept for the connection's life."""

    __slots__ = ("_client", "_server", "_lookup")

    def __init__(self, client: tuple[str, int] | None, server: tuple[str, int] | None) -> None:
        self._client, self._server = client, server
        self._lookup: asyncio.Future[str | None] | None = None

    async def app(self) -> str | None:
        if self._client is None or self._server is None or loopback(self._client[0]) is None:
            return None
        if self._lookup is None:
            self._lookup = asyncio.ensure_future(
                asyncio.to_thread(tcp_app, self._client, self._server))
        # Shielded: a request cancelled meanwhile leaves the answer to the connection's next.
        return await asyncio.shield(self._lookup)


def _diag(local: Endpoint, remote: Endpoint) -> TcpSocket | None:
    request = diag_request(local, remote)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                           _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(request)
            return diag_reply(nl.recv(8192), request)
    except (OSError, AttributeError):  # not Linux (no AF_NETLINK), or refused here
        return None


def _table(local: Endpoint, remote: Endpoint) -> TcpSocket | None:
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                found = find_socket(f.read(), local, remote)
        except OSError:
            continue
        if found is not None:
            return found
    return None


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read()
    except OSError:  # not Linux, or the process has gone
        return None


def _processes(uid: int, deadline: float) -> Iterator[tuple[int, Iterator[str]]]:
    """(pid, fd links) of `uid`'s processes, highest id first (a client is most often a
    process started after the daemon), until `deadline`."""
    try:
        pids = sorted((int(n) for n in os.listdir("/proc") if n.isdigit()), reverse=True)
    except OSError:
        return
    for pid in pids:
        if time.monotonic() > deadline:
            return
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        yield pid, _fd_links(pid)


def _fd_links(pid: int) -> Iterator[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's
        return
    for name in names:
        try:
            yield os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue

"""uma.server.peers: the process behind a connection, as an app name. The parsing and naming
over captured kernel text and bytes, the /proc and netlink reading on real sockets, and both
doors of a `uma run --http` telling processes apart with no app naming itself."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from uma import testing
from uma.app import app_name
from uma.client import Client
from uma.server import peers

LINUX = sys.platform.startswith("linux")
V4 = ipaddress.IPv4Address("127.0.0.1")
V6 = ipaddress.IPv6Address("::1")

# Captured on Linux 6.18 (x86_64) with three connections open: 127.0.0.1:45838 -> :44575,
# ::1:58234 -> :40925, and 127.0.0.1:55484 -> a dual-stack server on :40547 (whose end is in
# tcp6 as ::ffff:127.0.0.1). Each connection is listed twice, once for each end; lines 4 and
# 5 are in TIME_WAIT (no inode). The client of 45838's uid was 0, made 1000 here.
TCP = textwrap.dedent("""\
      sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
       0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1620 1 00000000375ff923 100 0 0 10 0
       1: 0100007F:AE1F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 194778 1 00000000d19b9bc4 100 0 0 10 0
       2: 0100007F:D8BC 0100007F:9E63 01 00000000:00000000 00:00000000 00000000     0        0 194786 2 00000000983b4fec 20 0 0 10 -1
       3: 0100007F:AE1F 0100007F:B30E 01 00000000:00000000 00:00000000 00000000     0        0 194780 1 00000000a7bf5936 20 0 0 10 -1
       4: 0100007F:8EF6 0100007F:9DD1 06 00000000:00000000 03:000000C7 00000000     0        0 0 3 0000000053c899ea
       5: 0100007F:8EFC 0100007F:9DD1 06 00000000:00000000 03:000000C7 00000000     0        0 0 3 00000000b90194cd
       6: 0100007F:B30E 0100007F:AE1F 01 00000000:00000000 00:00000000 00000000  1000        0 194779 2 00000000f157b204 20 0 0 10 -1
    """)  # noqa: E501 - the kernel's own lines
TCP6 = textwrap.dedent("""\
      sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
       0: 00000000000000000000000001000000:9FDD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 194781 1 00000000b06d56fd 100 0 0 10 0
       2: 0000000000000000FFFF00000100007F:9E63 0000000000000000FFFF00000100007F:D8BC 01 00000000:00000000 00:00000000 00000000     0        0 194787 1 0000000027c3bc48 20 0 0 10 -1
       3: 00000000000000000000000001000000:E37A 00000000000000000000000001000000:9FDD 01 00000000:00000000 00:00000000 00000000     0        0 194782 2 0000000073f0f249 20 0 0 10 -1
       4: 00000000000000000000000001000000:9FDD 00000000000000000000000001000000:E37A 01 00000000:00000000 00:00000000 00000000     0        0 194783 1 0000000036263f0c 20 0 0 10 -1
    """)  # noqa: E501
# sock_diag for the client's end of 127.0.0.1:45838 -> :44575 (inode 194779, uid 0): the
# request, the kernel's reply, and its reply to a request for a socket that does not exist.
DIAG_REQUEST = bytes.fromhex(
    "4800000014000100010000000000000002060000ffffffffb30eae1f7f00000100000000000000000000"
    "00007f00000100000000000000000000000000000000ffffffffffffffff")
DIAG_REPLY = bytes.fromhex(
    "7c00000014000000010000001d75000002010000b30eae1f7f0000010000000000000000000000007f00"
    "000100000000000000000000000000000000011000000000000000000000000000000000000000000000"
    "dbf80200050008000000000008000f00000000000c00150001000000000000000600160052000000")
DIAG_ENOENT = bytes.fromhex(
    "5c00000002000000010000001d750000feffffff4800000014000100010000000000000002060000ffff"
    "ffff000100027f0000010000000000000000000000007f000001000000000000000000000000000000"
    "00ffffffffffffffff")


# --- naming ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("comm", "name"), [
    ("python3\n", "python3:4242"),  # /proc/<pid>/comm ends in a newline
    ("Web Content\n", "Web-Content:4242"),  # characters an app name has not become "-"
    ("a{b}\"c\n", "a-b--c:4242"),
    ("a-very-long-process-name", "a-very-long-pro:4242"),  # the kernel's 15
    ("", "pid4242"), (None, "pid4242"), ("\n", "pid4242"),
])
def test_a_process_is_named_by_its_name_and_id(comm, name):
    assert peers.process_app(4242, comm) == name
    assert app_name(name) == name  # valid wherever an app name is


def test_a_user_is_named_by_its_id():
    assert app_name(peers.user_app(1001)) == "uid1001"


@pytest.mark.parametrize(("host", "address"), [
    ("127.0.0.1", V4), ("127.8.9.10", ipaddress.IPv4Address("127.8.9.10")), ("::1", V6),
    ("::ffff:127.0.0.1", V4),  # a dual-stack server sees an IPv4 client so
    ("10.0.0.1", None), ("::ffff:10.0.0.1", None), ("fe80::1%eth0", None), ("0.0.0.0", None),
    ("localhost", None), ("", None),
])
def test_only_this_machine_is_loopback(host, address):
    assert peers.loopback(host) == address


# --- /proc/net/tcp ---------------------------------------------------------------------------


def test_the_clients_end_is_found_not_the_servers():
    client, server = (V4, 45838), (V4, 44575)
    assert peers.find_socket(TCP, client, server, "little") == peers.TcpSocket(194779, 1000)
    assert peers.find_socket(TCP, server, client, "little") == peers.TcpSocket(194780, 0)
    assert peers.find_socket(TCP, client, (V4, 44576), "little") is None
    assert peers.find_socket(TCP, (ipaddress.IPv4Address("127.0.0.2"), 45838), server,
                             "little") is None
    assert peers.find_socket(TCP6, client, server, "little") is None


def test_ipv6_and_ipv4_mapped_ends_are_found():
    assert peers.find_socket(TCP6, (V6, 58234), (V6, 40925), "little").inode == 194782
    # The dual-stack server's own end, listed with IPv4-mapped addresses, matches IPv4 ones;
    # its client (an IPv4 socket) is in the IPv4 table.
    assert peers.find_socket(TCP6, (V4, 40547), (V4, 55484), "little").inode == 194787
    assert peers.find_socket(TCP, (V4, 55484), (V4, 40547), "little").inode == 194786


def test_big_endian_hosts_print_addresses_in_order():
    line = "   0: 7F000001:B30E 7F000001:AE1F 01 0:0 0:0 0 7 0 99 2"
    table = "header\n" + line
    assert peers.find_socket(table, (V4, 45838), (V4, 44575), "big") == peers.TcpSocket(99, 7)
    assert peers.find_socket(table, (V4, 45838), (V4, 44575), "little") is None


def test_malformed_lines_are_skipped():
    table = TCP.replace("0100007F:AE1F 0100007F:B30E", "0100007G:AE1F 0100007F:B30E") \
        + "   7: short line\n   8: 0100:AE1F 0100007F:B30E 01 0:0 0:0 0 0 0 5 1\n"
    assert peers.find_socket(table, (V4, 44575), (V4, 45838), "little") is None
    assert peers.find_socket(TCP, (V4, 45838), (V4, 44575), "little").inode == 194779


# --- sock_diag -------------------------------------------------------------------------------


def test_a_diag_request_asks_for_one_socket():
    assert peers.diag_request((V4, 45838), (V4, 44575)) == DIAG_REQUEST
    v6 = peers.diag_request((V6, 58234), (V6, 40925))
    assert v6[16] == socket.AF_INET6 and v6[17] == socket.IPPROTO_TCP
    assert v6[24:28] == bytes.fromhex("e37a9fdd")  # the ports, in network order
    assert v6[28:44] == V6.packed and v6[44:60] == V6.packed


def test_a_diag_reply_gives_the_sockets_inode_and_owner():
    assert peers.diag_reply(DIAG_REPLY, DIAG_REQUEST) == peers.TcpSocket(194779, 0)
    assert peers.diag_reply(DIAG_ENOENT, DIAG_REQUEST) is None
    assert peers.diag_reply(DIAG_REPLY[:40], DIAG_REQUEST) is None
    # A reply about another socket than the one asked for is not taken.
    other = peers.diag_request((V4, 45838), (V4, 44576))
    assert peers.diag_reply(DIAG_REPLY, other) is None


# --- the process holding a socket ------------------------------------------------------------


def test_the_holder_is_the_process_with_the_socket_link():
    table = [(900, ["/dev/null", "socket:[11]", "pipe:[12]"]),
             (800, ["socket:[194779]"]), (700, ["socket:[194779]"])]
    assert peers.holder(194779, table) == 800  # shared across a fork: the first listed
    assert peers.holder(11, table) == 900
    assert peers.holder(1947, table) is None  # no prefix match
    assert peers.holder(0, table) is None  # a socket no process holds any more


def test_the_scan_stops_at_the_holder():
    def table():
        yield 900, iter(["socket:[5]"])
        raise AssertionError("scanned past the holder")

    assert peers.holder(5, table()) == 900


# --- reading /proc and the socket options, on real connections --------------------------------


def test_a_unix_peer_is_this_process():
    a, b = socket.socketpair()
    with a, b:
        assert peers.peer_process(a) == os.getpid()
    assert peers.socket_app(None) is None


@pytest.mark.skipif(not LINUX, reason="/proc and sock_diag are Linux's")
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_loopback_client_is_named_by_its_process(host):
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.create_server((host, 0), family=family) as server:
        server.settimeout(30)
        port = server.getsockname()[1]
        script = ("import os, socket, sys; from uma.server.peers import socket_app; "
                  f"s = socket.create_connection(({host!r}, {port})); "
                  "print(socket_app(os.getpid()), flush=True); sys.stdin.read()")
        child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            conn, client = server.accept()
            with conn:
                name = child.stdout.readline().strip()
                local = (peers.loopback(client[0]), client[1])
                remote = (peers.loopback(host), port)
                # Both ways of finding the client's end agree.
                assert peers._diag(local, remote) == peers._table(local, remote) is not None
                assert peers.tcp_app(client[:2], conn.getsockname()[:2]) == name
                assert name.endswith(f":{child.pid}")
                # Within this process, its own end is found: this process.
                with socket.create_connection((host, port)) as mine:
                    theirs, _ = server.accept()
                    with theirs:
                        assert peers.tcp_app(mine.getsockname()[:2], mine.getpeername()[:2]) \
                            == peers.socket_app(os.getpid())
        finally:
            child.stdin.close()
            child.wait(30)
    assert peers.tcp_app(("10.0.0.1", 5), ("10.0.0.2", 80)) is None  # not this machine's


def test_an_http_connection_looks_its_process_up_once(monkeypatch):
    calls = []

    def lookup(client, server):
        calls.append((client, server))
        return "editor:7"

    monkeypatch.setattr(peers, "tcp_app", lookup)

    async def main():
        peer = peers.TcpPeer(("127.0.0.1", 5000), ("127.0.0.1", 8080))
        names = await asyncio.wait_for(asyncio.gather(peer.app(), peer.app(), peer.app()), 30)
        remote = peers.TcpPeer(("192.0.2.1", 5000), ("192.0.2.2", 8080))
        return names, await remote.app(), await peers.TcpPeer(None, None).app()

    assert asyncio.run(main()) == (["editor:7"] * 3, None, None)
    assert calls == [(("127.0.0.1", 5000), ("127.0.0.1", 8080))]


# --- both doors of `uma run` -----------------------------------------------------------------

# A client process: `n` HTTP connections and then `n` socket connections, all held open at
# once, one request each, none naming its app; prints the app name it expects to be.
CLIENT = """\
import contextlib, os, sys
import httpx
from uma.client import Client
from uma.server.peers import socket_app
url, path, n, door = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with contextlib.ExitStack() as stack:
    if door == "http":
        for c in [stack.enter_context(httpx.Client(base_url=url, timeout=30)) for _ in range(n)]:
            c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).raise_for_status()
    else:
        for c in [stack.enter_context(Client(path)) for _ in range(n)]:
            c.generate("hi", max_tokens=1)
print(socket_app(os.getpid()))
"""


@pytest.mark.skipif(not LINUX, reason="an HTTP client's process is found through /proc")
def test_each_process_is_one_app_on_both_doors(tiny_path):
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--parallel", "2",
                            "--threads", "1") as d, Client(d.socket) as watcher:
        for door in ("http", "socket"):
            before = watcher.metrics()["app_requests_total"]
            apps = [subprocess.run([sys.executable, "-c", CLIENT, d.http_url, d.socket, str(n),
                                    door], capture_output=True, text=True, timeout=60,
                                   check=True).stdout.strip() for n in (3, 1)]
            after = watcher.metrics()["app_requests_total"]
            # Three connections of one process are one app; another process is another.
            assert {a: after[a] - before.get(a, 0) for a in after
                    if after[a] != before.get(a, 0)} == {apps[0]: 3, apps[1]: 1}, door

"""Loopback ports for a server that binds many ports chosen for it (a Ray head binds a dozen and
gives its workers a range): a block of consecutive ports free right now, taken below the
kernel's ephemeral range, and what is listening where, with the pids that own it."""

from __future__ import annotations

import random
import re
import socket
import subprocess

# Ports are chosen from here: below the kernel's ephemeral range (32768 up on Linux, where
# `free_port()` and every outgoing connection take theirs) and above the usual fixed services.
PORT_LOW, PORT_HIGH = 20000, 32000


def free_range(size: int) -> int:
    """The first port of `size` consecutive ports free on 127.0.0.1 right now, at random between
    PORT_LOW and PORT_HIGH: below the kernel's ephemeral range (32768 up on Linux), where
    outgoing connections and every `bind(("127.0.0.1", 0))` (`free_port()`, test servers,
    engines, other Ray heads' own sockets) take theirs, so none of those can take one of these
    between this choice and Ray's bind (which came ~25 s later on a loaded machine). Two heads
    starting at once could still pick overlapping ranges: `RayHead.start` retries that."""
    for _ in range(100):
        first = random.randrange(PORT_LOW, PORT_HIGH - size)
        socks: list[socket.socket] = []
        try:
            for p in range(first, first + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return first
    raise RuntimeError(f"no {size} consecutive free ports on 127.0.0.1 between {PORT_LOW} and {PORT_HIGH}")


def listening_sockets() -> list[tuple[str, int, set[int]]]:
    """(address, port, owner pids) of every TCP socket listening on this machine (`ss -ltnp`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        address, _, port = fields[3].rpartition(":")
        owners = {int(pid) for pid in re.findall(r"pid=(\d+),", fields[5])} if len(fields) >= 6 else set()
        found.append((address, int(port), owners))
    return found

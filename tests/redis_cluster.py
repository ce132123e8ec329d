"""Start and stop a real 3-node Redis Cluster on loopback (shared test helper).

    with RedisCluster() as c:
        client = redis.cluster.RedisCluster.from_url(c.node_url)
        c.url  # redis+cluster://127.0.0.1:PORT (what the gateway and the workers take)

Three `redis-server --cluster-enabled yes` on free ports (and free cluster-bus ports), each in its own folder of one temporary
directory, joined by `redis-cli --cluster create ... --cluster-replicas 0`; ready once every node
reports `cluster_state:ok`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.redis_server import free_port


class RedisCluster:
    def __init__(self, nodes: int = 3) -> None:
        self.server = shutil.which("redis-server") or "redis-server"
        self.cli = shutil.which("redis-cli") or "redis-cli"
        self.ports = [free_port() for _ in range(nodes)]
        self.bus_ports = [free_port() for _ in range(nodes)]   # the default, port + 10000, may exceed 65535
        self.procs: list[subprocess.Popen[bytes]] = []
        self._dir = tempfile.TemporaryDirectory(prefix="specroute-redis-cluster-")

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    @property
    def node_url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def _cli(self, port: int, *args: str) -> str:
        return subprocess.run([self.cli, "-p", str(port), *args], capture_output=True, text=True, timeout=10).stdout

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for port, bus in zip(self.ports, self.bus_ports, strict=True):
            d = Path(self._dir.name) / str(port)
            d.mkdir()
            self.procs.append(subprocess.Popen(
                [self.server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-port", str(bus),
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--save", "",
                 "--appendonly", "no", "--dir", str(d), "--protected-mode", "yes"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        try:
            for port, proc in zip(self.ports, self.procs, strict=True):
                while "PONG" not in self._cli(port, "ping"):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server on {port} did not answer")
                    time.sleep(0.05)
            out = subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                                  "--cluster-replicas", "0", "--cluster-yes"],
                                 capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
            while not all("cluster_state:ok" in self._cli(p, "cluster", "info") for p in self.ports):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs = []

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._dir.cleanup()

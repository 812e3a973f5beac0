"""The local Redis Cluster's layout: its ports, its nodes' settings, and nodes.conf pointed at
the ports of a later start."""

from __future__ import annotations

from pathlib import Path

from costline.streams.stack.cluster import RedisClusterService, readdress
from costline.streams.stack.layout import Layout

# nodes.conf of node 1 as Redis 7.0 writes it, then as Redis 7.2 and Valkey do (",hostname").
NODE_1 = """\
b50f 127.0.0.1:56042@56045 master - 0 1796340050262 2 connected 5461-10922
95aa 127.0.0.1:56043@56046 master - 0 1796340050762 3 connected 10923-16383
fa0a 127.0.0.1:56041@56044 myself,master - 0 0 1 connected 0-5460
vars currentEpoch 3 lastVoteEpoch 0
"""
NODE_2 = """\
b50f 127.0.0.1:56042@56045, myself,master - 0 0 2 connected 5461-10922
95aa 127.0.0.1:56043@56046, master - 0 1796340050762 3 connected 10923-16383
fa0a 127.0.0.1:56041@56044, master - 0 1796340050262 1 connected 0-5460
vars currentEpoch 3 lastVoteEpoch 0
"""


def test_a_cluster_takes_six_ports_and_names_its_first_node(tmp_path: Path) -> None:
    service = RedisClusterService(Layout.of(tmp_path), "127.0.0.1", 7000)
    assert service.ports() == (7000, 7001, 7002, 7003, 7004, 7005)
    assert service.endpoint() == "redis://127.0.0.1:7000/0"
    assert service.exports() == {"COSTLINE_REDIS_URL": "redis://127.0.0.1:7000/0"}
    config = dict(line.split(" ", 1) for line in service.node_config(2).splitlines())
    assert config["port"] == "7002" and config["cluster-port"] == "7005"
    assert (config["cluster-enabled"], config["appendonly"], config["save"]) == (
        "yes", "yes", '""')
    assert config["dir"] == str(tmp_path / "data" / "redis-cluster" / "node-3")


def test_nodes_conf_follows_the_nodes_to_their_new_ports(tmp_path: Path) -> None:
    folders = [tmp_path / f"node-{i}" for i in (1, 2, 3)]
    for folder, text in zip(folders, [NODE_1, NODE_2, None], strict=True):
        folder.mkdir()
        if text is not None:  # node 3 lost its file: the others still name it
            (folder / "nodes.conf").write_text(text)
    readdress(folders, ["127.0.0.1:7000@7003", "127.0.0.1:7001@7004", "127.0.0.1:7002@7005"])
    assert (folders[0] / "nodes.conf").read_text() == """\
b50f 127.0.0.1:7001@7004 master - 0 1796340050262 2 connected 5461-10922
95aa 127.0.0.1:56043@56046 master - 0 1796340050762 3 connected 10923-16383
fa0a 127.0.0.1:7000@7003 myself,master - 0 0 1 connected 0-5460
vars currentEpoch 3 lastVoteEpoch 0
"""
    assert (folders[1] / "nodes.conf").read_text() == """\
b50f 127.0.0.1:7001@7004, myself,master - 0 0 2 connected 5461-10922
95aa 127.0.0.1:56043@56046, master - 0 1796340050762 3 connected 10923-16383
fa0a 127.0.0.1:7000@7003, master - 0 1796340050262 1 connected 0-5460
vars currentEpoch 3 lastVoteEpoch 0
"""
    assert not (folders[2] / "nodes.conf").exists()

"""The one place Redis clients are built: which URLs it refuses, and how, before any socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from costline.connectors.redis_client import check_url, connect, connect_async, is_cluster


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0",
    "redis://:s3cret@cache:6379/2",
    "redis://costline:s3cret@cache:6379",
    "rediss://cache:6380/0?ssl_cert_reqs=required",
    "unix:///run/redis/redis.sock?db=1",
])
def test_the_urls_redis_py_reads_are_kept(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(("url", "said"), [
    ("http://cache:6379/0", "not a Redis URL"),
    ("redis://:s3cr/t@cache:6379/0", "not a Redis URL"),
    ("redis://cache:6379/0?ssl_cert_reqs=required", "ssl_cert_reqs in the Redis URL need a "
                                                     "rediss:// URL"),
    ("rediss://:s3cret@cache:6380/0?ssl_ca_certs=/nowhere/ca.pem",
     "ssl_ca_certs in the Redis URL: no such file /nowhere/ca.pem"),
])
def test_a_url_that_cannot_work_is_refused_in_one_line_without_its_password(
        url: str, said: str) -> None:
    for build in (check_url, connect, connect_async, is_cluster):
        with pytest.raises(ValueError) as refused:
            build(url)
        assert said in str(refused.value) and "s3cr" not in str(refused.value)
        assert "\n" not in str(refused.value)


def test_a_tls_file_that_exists_is_accepted(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read before connecting\n")
    check_url(f"rediss://cache:6380/0?ssl_ca_certs={ca}")

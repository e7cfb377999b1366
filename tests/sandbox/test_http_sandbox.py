"""HTTP sandbox service and client on 127.0.0.1."""

import json
import time
import urllib.error
import urllib.request

import pytest

from rlvr.sandbox import HttpSandboxClient, LocalSandbox, SandboxConfig, SandboxJob, start_background_server
from rlvr.utils.errors import RewardError


@pytest.fixture(scope="module")
def service():
    server, url = start_background_server(LocalSandbox(SandboxConfig(wall_timeout_s=2.0, cpu_seconds=2, max_concurrency=2)))
    yield url
    server.shutdown()
    server.server_close()


def test_round_trip_and_statuses(service):
    client = HttpSandboxClient(service, wall_timeout_s=2.0, request_timeout_s=20.0)
    ok, err, slow = client.run_many([
        SandboxJob("print(input()[::-1])", "abc\n"), SandboxJob("1 / 0"), SandboxJob("import time\ntime.sleep(30)"),
    ])
    assert (ok.status, ok.stdout) == ("ok", "cba\n")
    assert err.status == "runtime_error" and "ZeroDivisionError" in err.stderr
    assert slow.status == "timeout" and 2.0 <= slow.wall_time_s < 4.0


def test_bad_request_is_rejected_without_retries(service):
    request = urllib.request.Request(service, data=b'{"stdin": "x"}', headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400 and "'code'" in json.loads(info.value.read())["error"]


def test_client_timeout_is_bounded():
    client = HttpSandboxClient("http://10.255.255.1:9/run", request_timeout_s=0.5, retries=0)
    start = time.monotonic()
    with pytest.raises(RewardError, match="failed after 1 attempt"):
        client.run("print(1)")
    assert time.monotonic() - start < 3.0

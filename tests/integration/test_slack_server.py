"""The local Slack-compatible server answers slack-sdk the way Slack does (loopback only)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from costline.connectors.slack_blocks import render_terminal
from costline.connectors.slack_server import LocalSlack, channel_id

TOKEN = "xoxb-test-0000-secret"
SECTION = {"type": "section", "text": {"type": "mrkdwn", "text": "*hello*"}}


@pytest.fixture
async def slack() -> AsyncIterator[LocalSlack]:
    async with LocalSlack(tokens=[TOKEN], channels=["general", "ml-platform"]) as server:
        yield server


@pytest.fixture
def client(slack: LocalSlack) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=slack.url)


async def error_of(call: object) -> str:
    with pytest.raises(SlackApiError) as caught:
        await call  # type: ignore[misc]
    return str(caught.value.response["error"])


async def test_auth_test_answers_with_the_bot_identity(client: AsyncWebClient) -> None:
    answer = await client.auth_test()
    assert answer["ok"] is True and answer["user_id"] == "U0COSTLINE"


async def test_wrong_or_missing_token_is_refused_like_slack(slack: LocalSlack) -> None:
    assert await error_of(AsyncWebClient(token="xoxb-wrong", base_url=slack.url)
                          .auth_test()) == "invalid_auth"
    assert await error_of(AsyncWebClient(base_url=slack.url).auth_test()) == "not_authed"
    assert all("xoxb" not in json.dumps(call.params) for call in slack.calls)


async def test_form_body_with_token_field_is_accepted(slack: LocalSlack) -> None:
    async with aiohttp.ClientSession() as http:
        form = {"token": TOKEN, "channel": "#general", "text": "hi",
                "blocks": json.dumps([SECTION])}
        async with http.post(slack.url + "chat.postMessage", data=form) as response:
            answer = await response.json()
    assert answer["ok"] is True
    assert slack.messages("general")[0].blocks == [SECTION]
    assert "token" not in slack.calls[-1].params


async def test_post_by_name_or_id_and_unknown_channel(client: AsyncWebClient,
                                                      slack: LocalSlack) -> None:
    by_name = await client.chat_postMessage(channel="#ml-platform", text="a")
    by_id = await client.chat_postMessage(channel=channel_id("ml-platform"), text="b")
    assert by_name["channel"] == by_id["channel"] == channel_id("ml-platform")
    assert re.fullmatch(r"\d{10}\.\d{6}", by_name["ts"])
    assert float(by_id["ts"]) > float(by_name["ts"])
    assert await error_of(client.chat_postMessage(channel="#nope", text="c")) == (
        "channel_not_found")


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
async def test_text_or_blocks_required_and_blocks_validated(client: AsyncWebClient) -> None:
    assert await error_of(client.chat_postMessage(channel="#general")) == "no_text"
    assert await error_of(client.chat_postMessage(
        channel="#general", blocks=[{"text": "no type"}])) == "invalid_blocks"
    long_header = {"type": "header", "text": {"type": "plain_text", "text": "x" * 151}}
    with pytest.raises(SlackApiError) as caught:
        await client.chat_postMessage(channel="#general", blocks=[long_header])
    assert "less than 151 characters [json-pointer:/blocks/0]" in caught.value.response[
        "errors"][0]


async def test_update_needs_an_existing_message_in_that_channel(client: AsyncWebClient,
                                                                slack: LocalSlack) -> None:
    posted = await client.chat_postMessage(channel="#general", text="v1")
    updated = await client.chat_update(channel=posted["channel"], ts=posted["ts"], text="v2",
                                       blocks=[SECTION])
    assert updated["ts"] == posted["ts"]
    message = slack.messages("general")[0]
    assert (message.text, message.edits) == ("v2", 1)
    assert await error_of(client.chat_update(channel=posted["channel"], ts="1.000001",
                                             text="x")) == "message_not_found"
    assert await error_of(client.chat_update(channel=channel_id("ml-platform"),
                                             ts=posted["ts"], text="x")) == "message_not_found"
    assert await error_of(client.chat_update(channel="#general", ts=posted["ts"],
                                             text="x")) == "channel_not_found"


async def test_thread_replies_hang_off_their_root(client: AsyncWebClient,
                                                  slack: LocalSlack) -> None:
    root = await client.chat_postMessage(channel="#general", text="root")
    await client.chat_postMessage(channel="#general", text="r1", thread_ts=root["ts"])
    await client.chat_postMessage(channel="#general", text="r2", thread_ts=root["ts"])
    assert [m.text for m in slack.messages("general")] == ["root"]
    assert [m.text for m in slack.replies("general", root["ts"])] == ["r1", "r2"]
    assert await error_of(client.chat_postMessage(channel="#general", text="x",
                                                  thread_ts="1.000001")) == "thread_not_found"


async def test_rate_limit_answers_429_with_retry_after_for_n_calls(slack: LocalSlack) -> None:
    slack.rate_limit_next(2, retry_after=7, method="chat.postMessage")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        statuses = []
        for method in ("auth.test", "chat.postMessage", "chat.postMessage",
                       "chat.postMessage"):
            async with http.post(slack.url + method,
                                 json={"channel": "#general", "text": "x"}) as response:
                statuses.append((response.status, response.headers.get("Retry-After")))
    assert statuses == [(200, None), (429, "7"), (429, "7"), (200, None)]


async def test_injected_failures_come_as_5xx_or_ok_false(client: AsyncWebClient,
                                                         slack: LocalSlack) -> None:
    slack.fail_next(1, status=503, error="service_unavailable")
    slack.fail_next(1, status=200, error="fatal_error")
    with pytest.raises(SlackApiError) as caught:
        await client.auth_test()
    assert caught.value.response.status_code == 503
    assert await error_of(client.auth_test()) == "fatal_error"
    assert (await client.auth_test())["ok"] is True
    assert [c.status for c in slack.calls] == [503, 200, 200]


async def test_conversations_list_pages_and_info_by_id(client: AsyncWebClient,
                                                       slack: LocalSlack) -> None:
    slack.add_channel("third")
    first = await client.conversations_list(limit=2)
    cursor = first["response_metadata"]["next_cursor"]
    second = await client.conversations_list(limit=2, cursor=cursor)
    names = [c["name"] for c in first["channels"] + second["channels"]]
    assert names == ["general", "ml-platform", "third"]
    assert second["response_metadata"]["next_cursor"] == ""
    info = await client.conversations_info(channel=channel_id("third"))
    assert info["channel"]["name"] == "third"
    assert await error_of(client.conversations_info(channel="C0NOPE")) == "channel_not_found"


async def test_every_call_is_recorded_with_its_time(client: AsyncWebClient,
                                                    slack: LocalSlack) -> None:
    before = time.time()
    await client.chat_postMessage(channel="#general", text="x")
    call = slack.calls_to("chat.postMessage")[0]
    assert call.params == {"channel": "#general", "text": "x"}
    assert before <= call.at <= time.time()


async def test_terminal_rendering_is_plain_text(client: AsyncWebClient,
                                                slack: LocalSlack) -> None:
    printed: list[str] = []
    slack.on_message = lambda event, channel, message: printed.append(
        render_terminal(event, channel, message))
    await client.chat_postMessage(channel="#general", text="fallback", blocks=[
        {"type": "header", "text": {"type": "plain_text", "text": ":warning: team-monthly"}},
        {"type": "section", "text": {"type": "mrkdwn", "text":
            "*$8,123.45* crossed warn_80 at <!date^1796025600^{time}|08:00 UTC>"}},
        {"type": "actions", "elements": [{"type": "button", "action_id": "a",
                                          "text": {"type": "plain_text", "text": "Keep"}}]}])
    assert printed[0].splitlines()[1:] == ["⚠️ TEAM-MONTHLY",
                                           "$8,123.45 crossed warn_80 at 08:00 UTC", "[Keep]"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_runs_as_a_module_on_the_given_port() -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "costline.connectors.slack_server", "--port",
                                str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()
        assert f"http://127.0.0.1:{port}/api/" in banner
    finally:
        process.terminate()
        process.wait(timeout=10)


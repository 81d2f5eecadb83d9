"""Background responses (service/openai/responses/background.py, follow.py) through the `openai`
SDK on an app in this process: answered at once, queued; a stream dropped after five events and
resumed with `starting_after` sees every event once, in order; a cancel stops a run; a background
response continues a conversation. A worker killed mid-run: tests/e2e/test_background_responses.py."""

from __future__ import annotations

import openai
import pytest

from tests.helpers import MODEL
from tests.helpers.apps import static_app
from tests.integration.test_stored_responses import sdk_in_process

TERMINAL = ("response.completed", "response.incomplete")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with static_app(api_key="k1,k2", data_dir=str(tmp_path_factory.mktemp("data"))) as app:
        yield app


@pytest.fixture
def sdk(app) -> openai.OpenAI:
    client = sdk_in_process(app, "/static/v1", "k1")
    client._strict_response_validation = False  # stream events: see tests/e2e/conftest.py streaming_sdk
    return client


def ask(sdk, **fields):
    return sdk.responses.create(model=MODEL, input="Tell me about the sea.", temperature=0, **fields)


def test_a_background_response_is_queued_at_once_and_done_once_its_events_end(sdk):
    queued = ask(sdk, background=True, max_output_tokens=8)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    with sdk.responses.retrieve(queued.id, stream=True) as events:  # follows it until its end
        *_, last = events
    assert last.type in TERMINAL
    done = sdk.responses.retrieve(queued.id)
    assert done.status == last.response.status and done.output_text == last.response.output_text != ""


def test_a_dropped_stream_resumed_with_starting_after_sees_every_event_once_in_order(sdk):
    first = []
    with ask(sdk, background=True, stream=True, max_output_tokens=24) as events:
        for event in events:
            first.append(event)
            if len(first) == 5:
                break  # the connection drops here: the run goes on
    response_id = first[0].response.id
    with sdk.responses.retrieve(response_id, stream=True, starting_after=4) as events:
        rest = list(events)
    numbers = [event.sequence_number for event in first + rest]
    assert numbers == list(range(len(numbers))), numbers
    assert rest[-1].type in TERMINAL and sum(event.type in TERMINAL for event in first + rest) == 1
    with sdk.responses.retrieve(response_id, stream=True, starting_after=len(numbers) - 1) as events:
        assert list(events) == []  # nothing past its end


def test_a_cancel_stops_a_queued_run_and_a_done_one_stays(sdk, app, held_rounds):
    held = ask(sdk, background=True, max_output_tokens=200)  # its run waits for the fence
    cancelled = sdk.responses.cancel(held.id)
    assert cancelled.status == "cancelled"
    held_rounds()
    with sdk.responses.retrieve(held.id, stream=True) as events:
        assert all(event.type not in TERMINAL for event in events)  # it ended without finishing
    assert sdk.responses.retrieve(held.id).status == "cancelled"
    done = ask(sdk, max_output_tokens=4)
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(done.id)  # not a background one
    queued = ask(sdk, background=True, max_output_tokens=4)
    with sdk.responses.retrieve(queued.id, stream=True) as events:
        list(events)
    assert sdk.responses.cancel(queued.id).status != "cancelled"  # done before the cancel: it stays


def test_a_background_turn_continues_a_conversation_and_is_continued(sdk):
    first = ask(sdk, max_output_tokens=8)
    second = ask(sdk, background=True, max_output_tokens=8, previous_response_id=first.id)
    with pytest.raises(openai.BadRequestError) as running:
        ask(sdk, max_output_tokens=8, previous_response_id=second.id)  # not done yet
    assert running.value.body["param"] == "previous_response_id"
    with sdk.responses.retrieve(second.id, stream=True) as events:
        list(events)
    third = ask(sdk, max_output_tokens=8, previous_response_id=second.id)
    assert len(sdk.responses.input_items.list(third.id).data) == 5


def test_background_asks_for_store_and_another_keys_stream_is_a_404(app, sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(sdk, background=True, store=False)
    assert refused.value.body["param"] == "background"
    queued = ask(sdk, background=True, max_output_tokens=4)
    theirs = sdk_in_process(app, "/static/v1", "k2")
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(queued.id, stream=True)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.cancel(queued.id)
    with sdk.responses.retrieve(queued.id, stream=True) as events:
        list(events)


def test_a_response_deleted_while_followed_ends_its_stream_with_an_error(app, sdk, held_rounds):
    held = ask(sdk, background=True, max_output_tokens=200)  # its run waits for the fence
    client, auth = app.test_client(), {"Authorization": "Bearer k1"}
    reply = client.get(f"/static/v1/responses/{held.id}?stream=true", headers=auth, buffered=False)
    assert reply.status_code == 200
    sdk.responses.delete(held.id)
    held_rounds()
    text = reply.get_data(as_text=True)  # the follower's next look finds it gone: its stream ends
    assert "event: error" in text and '"code": "not_found"' in text, text[-500:]

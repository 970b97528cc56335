"""The response stream between a decoupled model's threads and the event loop: bounded,
ordered, cancellable, closed once. Real threads, a real loop; waits on the stream's own
state (a sender blocked on the limit), never on time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from inferd.errors import ErrorKind, InferdError
from inferd.streams import STREAM_QUEUE_LIMIT, ResponseStream, StreamClosedError

DEADLINE_S = 30.0


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached"
        await asyncio.sleep(0.001)


def producer(stream: ResponseStream, count: int, sent: list[int]) -> threading.Thread:
    """Sends `count` responses (the last with the final flag), noting each one sent."""

    def run() -> None:
        for i in range(count):
            stream.send({"OUT": np.array([i])}, final=i == count - 1)
            sent.append(i)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_sender_blocks_at_the_limit_until_the_client_reads() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        sent: list[int] = []
        thread = producer(stream, 3 * STREAM_QUEUE_LIMIT, sent)
        await until(lambda: stream.senders_waiting == 1, "a blocked sender")
        # Not one response more than the limit waits for the client.
        assert len(sent) == STREAM_QUEUE_LIMIT
        first = await stream.next()
        await until(lambda: len(sent) == STREAM_QUEUE_LIMIT + 1, "the next send")
        await until(lambda: stream.senders_waiting == 1, "the sender blocked again")
        assert len(sent) == STREAM_QUEUE_LIMIT + 1
        received = [first]
        while not received[-1].final:
            received.append(await stream.next())
        thread.join(DEADLINE_S)
        assert [int(item.outputs["OUT"][0]) for item in received if item.outputs] == list(
            range(3 * STREAM_QUEUE_LIMIT)
        )
        await asyncio.wait_for(stream.closed, DEADLINE_S)
        assert stream.dropped == 0

    asyncio.run(scenario())


def test_cancel_unblocks_the_sender_and_drops_what_it_sends() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        sent: list[int] = []
        thread = producer(stream, 2 * STREAM_QUEUE_LIMIT, sent)
        await until(lambda: stream.senders_waiting == 1, "a blocked sender")
        assert not stream.is_cancelled()
        stream.cancel()
        thread.join(DEADLINE_S)
        assert not thread.is_alive() and len(sent) == 2 * STREAM_QUEUE_LIMIT  # nothing raised
        assert stream.is_cancelled()
        assert stream.dropped == 2 * STREAM_QUEUE_LIMIT  # the unread ones and the later ones
        await asyncio.wait_for(stream.closed, DEADLINE_S)  # its final flag still closed it

    asyncio.run(scenario())


def test_a_send_after_the_final_flag_raises() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        stream.send(None, final=True)
        with pytest.raises(StreamClosedError):
            stream.send({"OUT": np.array([1])})
        item = await stream.next()
        assert item.final and not item.is_response

    asyncio.run(scenario())


def test_a_failed_stream_ends_with_the_error_and_tells_the_model_to_stop() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        stream.send({"OUT": np.array([0])})
        error = InferdError(ErrorKind.MODEL_ERROR, "boom")
        assert stream.fail(error) is True
        assert stream.fail(error) is False  # closed once
        assert stream.is_cancelled()  # the model should stop...
        stream.send({"OUT": np.array([1])})  # ...and what it still sends is dropped
        stream.send(None, final=True)
        assert stream.dropped == 1
        first, last = await stream.next(), await stream.next()
        assert first.outputs is not None and not first.final
        assert last.error is error and last.final
        await asyncio.wait_for(stream.closed, DEADLINE_S)

    asyncio.run(scenario())

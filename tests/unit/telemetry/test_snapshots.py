"""snapshots.items: a scrape thread reads a dict the event loop keeps adding keys to."""

from __future__ import annotations

import sys
import threading

from inferd.telemetry.snapshots import items


def test_items_while_another_thread_inserts() -> None:
    shared: dict[int, int] = {}
    inserts = 200_000
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                pairs = items(shared)
                assert all(value == 2 * key for key, value in pairs)
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads every few µs: as many races as possible
    reader = threading.Thread(target=read)
    try:
        reader.start()
        for key in range(inserts):
            shared[key] = 2 * key
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert not errors, repr(errors[0])
    assert len(items(shared)) == inserts


def test_a_key_removed_meanwhile_is_left_out() -> None:
    shared = {"a": 1, "b": 2}
    assert items(shared) == [("a", 1), ("b", 2)]
    del shared["a"]
    assert items(shared) == [("b", 2)]

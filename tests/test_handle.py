"""A request handle's consumer side in an event loop (uma.handle): take() catches up on every
queued event in one step, and consumers of one loop are woken with one call a burst."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from uma.handle import RequestHandle, TokenEvent

ENDED = object()  # stands for the Result: the handle only tells it from None


def handle(rid: int = 1) -> RequestHandle:
    return RequestHandle(rid, cancel=lambda: None)


def event(i: int) -> TokenEvent:
    return TokenEvent(f"t{i}", (i,))


def test_take_returns_everything_queued_then_nothing_once_ended():
    h = handle()

    async def consume():
        return [await h.take(), await h.take()]

    for i in range(3):
        h._push(event(i))
    h._push(result=ENDED)
    first, second = asyncio.run(consume())
    assert [e.text for e in first] == ["t0", "t1", "t2"]
    assert second == []


def test_take_waits_for_an_event_pushed_from_another_thread():
    h = handle()

    async def consume():
        waiting = asyncio.ensure_future(h.take())
        await asyncio.sleep(0)  # the take is waiting now (nothing queued)
        assert not waiting.done()
        threading.Thread(target=h._push, args=(event(7),)).start()
        return await waiting

    assert [e.token_ids for e in asyncio.run(consume())] == [(7,)]


def test_a_burst_for_many_consumers_calls_their_loop_once():
    handles = [handle(i) for i in range(50)]
    pushed = threading.Event()

    async def consume():
        loop = asyncio.get_running_loop()
        calls = []
        real = loop.call_soon_threadsafe

        def counted(*args):
            calls.append(args)
            return real(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        waits = [asyncio.ensure_future(h.take()) for h in handles]
        await asyncio.sleep(0)  # every consumer waits

        def burst():
            for i, h in enumerate(handles):
                h._push(event(i))
            pushed.set()

        threading.Thread(target=burst).start()
        pushed.wait()  # the loop is held while the whole burst arrives
        got = await asyncio.gather(*waits)
        return calls, got

    calls, got = asyncio.run(consume())
    assert [[e.token_ids for e in events] for events in got] == [[(i,)] for i in range(50)]
    assert len(calls) == 1  # one wake-up for fifty ready consumers


def test_no_wake_up_is_lost_while_the_loop_runs_the_last_one():
    # pushes race the loop's own wake-up call; every event still reaches its consumer
    handles = [handle(i) for i in range(8)]
    n = 300

    async def consume(h):
        seen = []
        while events := await h.take():
            seen.extend(e.token_ids[0] for e in events)
        return seen

    def produce():
        for i in range(n):
            for h in handles:
                h._push(event(i))
        for h in handles:
            h._push(result=ENDED)

    async def main():
        tasks = [asyncio.ensure_future(consume(h)) for h in handles]
        await asyncio.sleep(0)
        threading.Thread(target=produce).start()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == [list(range(n))] * len(handles)


def test_a_closed_loop_is_not_woken_and_a_new_loop_still_is():
    h = handle()

    async def wait_once():
        waiting = asyncio.ensure_future(h.take())
        await asyncio.sleep(0)
        waiting.cancel()

    asyncio.run(wait_once())  # leaves a waiter of a loop that is now closed
    h._push(event(1))  # nothing to wake there, and no error
    h2 = handle(2)

    async def consume():
        waiting = asyncio.ensure_future(h2.take())
        await asyncio.sleep(0)
        threading.Thread(target=h2._push, args=(event(2),)).start()
        return await waiting

    assert [e.text for e in asyncio.run(consume())] == ["t2"]


def test_a_loop_that_is_gone_leaves_no_waker_behind():
    h = handle()
    loops = []

    async def wait_once():
        loops.append(weakref.ref(asyncio.get_running_loop()))
        waiting = asyncio.ensure_future(h.take())
        await asyncio.sleep(0)
        waiting.cancel()

    asyncio.run(wait_once())
    h._push(event(1))  # the waiter it left is for a loop that is gone: nothing to wake
    gc.collect()
    assert loops[0]() is None  # neither its waker nor the handle kept it alive

"""uma.engine.contexts: which context a request runs in, and a turn that spans both (the real
core, a tiny synthetic model)."""

import uma


def test_a_queued_background_request_promoted_runs_beside_the_streams(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1, background_ctx=512,
                    background_seqs=1) as e:
        blocker = e.submit("busy", max_tokens=100_000, ignore_eos=True, priority="background")
        next(iter(blocker))  # running in the background context, which has one sequence
        waiting = e.submit("promote me", max_tokens=4, ignore_eos=True, priority="background")
        e.set_priority(waiting, "interactive")
        # It can only finish now by moving to the interactive context: the blocker holds the
        # background one until cancelled.
        assert waiting.result(timeout=60).usage.completion_tokens == 4
        blocker.cancel()
        assert blocker.result(timeout=60).finish_reason == "cancelled"


def test_a_prompt_too_long_for_the_background_context_runs_in_the_streams(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, background_ctx=32,
                    background_seqs=1) as e:
        e.wait_ready()
        e._lane.scheduler.trace = []
        room = e._lane.scheduler.n_ctx_seq  # llama.cpp pads a context to 256 positions
        assert room < e.n_ctx_seq
        long = e.submit(list(range(10, 10 + room + 20)), max_tokens=4, ignore_eos=True,
                        priority="background")
        assert long.result(timeout=60).usage.completion_tokens == 4
        assert e._lane.scheduler.trace == []


def test_a_background_tick_that_breaks_ends_only_the_background_requests(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, background_ctx=256,
                    background_seqs=1) as e:
        stream = e.submit("a stream", max_tokens=64, ignore_eos=True)
        next(iter(stream))

        def broken():
            raise RuntimeError("the background policy broke")

        e._lane.scheduler.schedule = broken  # the lane's next tick fails as a whole
        bg = e.submit("background work", max_tokens=8, priority="background").result(timeout=60)
        assert bg.finish_reason == "error" and "the background policy broke" in str(bg.error)
        assert stream.result(timeout=60).usage.completion_tokens == 64
        after = e.submit("a later stream", max_tokens=4, ignore_eos=True).result(timeout=60)
        assert after.finish_reason == "length"


def test_closing_cancels_the_background_contexts_requests(tiny_path):
    e = uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, background_ctx=256, background_seqs=1)
    handle = e.submit("forever", max_tokens=100_000, ignore_eos=True, priority="background")
    next(iter(handle))
    e.close()
    assert handle.result(timeout=30).finish_reason == "cancelled"


"""Signals are acted on by a relay thread, never inside a lock the main thread holds."""

from __future__ import annotations

import os
import signal
import threading

from django_workhorse.worker.signal_relay import SignalRelay, relayed


def test_a_signal_landing_while_the_main_thread_holds_the_lock_its_action_needs_is_acted_on():
    # A Python handler runs in the main thread between two bytecodes: had it called the action, the
    # action would wait for a lock its own thread holds (a worker once ignored SIGTERM so, inside
    # its wake-up Event's wait()).
    lock = threading.Lock()
    acted = threading.Event()

    def action() -> None:
        if lock.acquire(timeout=10):
            lock.release()
            acted.set()

    with relayed({signal.SIGUSR1: action}):
        with lock:
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(1000):  # bytecodes, so the handler has run before the lock is released
                pass
            assert not acted.is_set()
        assert acted.wait(10)


def test_each_signal_runs_its_own_action_in_order_and_a_failing_action_stops_no_other(caplog):
    seen: list[str] = []
    done = threading.Event()

    def fail() -> None:
        seen.append("usr1")
        raise RuntimeError("boom")

    def last() -> None:
        seen.append("usr2")
        done.set()

    with relayed({signal.SIGUSR1: fail, signal.SIGUSR2: last}):
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert done.wait(10)
    assert seen == ["usr1", "usr2"]
    assert "Acting on signal SIGUSR1 failed" in caplog.text


def test_the_previous_handlers_come_back_and_the_relay_thread_ends():
    def previous(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGUSR1, previous)
    try:
        relay = SignalRelay({signal.SIGUSR1: lambda: None})
        relay.start()
        assert signal.getsignal(signal.SIGUSR1) is not previous
        assert any(t.name == "workhorse-signals" for t in threading.enumerate())
        relay.stop()
        assert signal.getsignal(signal.SIGUSR1) is previous
        assert not any(t.name == "workhorse-signals" for t in threading.enumerate())
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_off_the_main_thread_the_relay_does_nothing():
    errors: list[BaseException] = []

    def off_main() -> None:
        try:
            with relayed({signal.SIGUSR1: lambda: None}):
                pass
        except BaseException as exc:  # signal.signal() off the main thread raises ValueError
            errors.append(exc)

    before = signal.getsignal(signal.SIGUSR1)
    thread = threading.Thread(target=off_main)
    thread.start()
    thread.join(10)
    assert errors == []
    assert signal.getsignal(signal.SIGUSR1) is before

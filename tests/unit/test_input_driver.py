"""The console's input thread, on a real pseudo-terminal: it waits for input, not on a timer, and
still gives keys, a lone Escape, a prompt stop and a second start after a suspend."""

import os
import pty
import selectors
import signal
import threading
import time
import tty

from textual import events

from gpuscope.tui.input_driver import IdleInputDriver

from helpers import wait_until


class RecordingDriver(IdleInputDriver):
    """The driver with its events kept here instead of posted to an app."""

    def __init__(self, terminal: int) -> None:
        super().__init__(app=None)
        self.fileno = terminal
        self.keys: list[str] = []

    def process_message(self, message) -> None:
        if isinstance(message, events.Key):
            self.keys.append(message.key)


async def test_the_input_thread_sleeps_until_a_key_and_still_reads_keys_escape_and_stops(monkeypatch):
    master, terminal = pty.openpty()
    tty.setraw(terminal)  # as the driver's start sets the terminal: keys come one by one
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}  # the driver sets them
    waits: list[float | None] = []
    select = selectors.PollSelector.select
    monkeypatch.setattr(selectors.PollSelector, "select",
                        lambda self, timeout=None: (waits.append(timeout), select(self, timeout))[1])
    try:
        driver = RecordingDriver(terminal)
        for run in range(2):  # a suspended console starts the thread again on the same driver
            driver.exit_event.clear()
            waits.clear()
            thread = threading.Thread(target=driver.run_input_thread, daemon=True)
            thread.start()
            time.sleep(1.0)
            assert waits == [None]  # one wait, with no timeout (Textual's thread: ten of 0.1 s)
            os.write(master, b"q")
            wait_until(lambda: driver.keys[-1:] == ["q"], timeout=5, what="the key")
            os.write(master, b"\x1b")  # a lone Escape: a key once nothing follows it in time
            wait_until(lambda: driver.keys[-1:] == ["escape"], timeout=5, what="Escape")
            assert any(t is not None and 0 < t <= 0.5 for t in waits)  # waited for the parser's deadline
            stopped = time.monotonic()
            driver.exit_event.set()
            thread.join(5)
            assert not thread.is_alive() and time.monotonic() - stopped < 0.5, run
        assert driver.keys == ["q", "escape"] * 2
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.close(master)
        os.close(terminal)

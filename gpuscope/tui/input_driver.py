"""The console's terminal driver: Textual's own, with an input thread that sleeps until input comes,
and the text style reset before the terminal is handed back.

Textual's input thread wakes ten times a second, input or not, to see whether it should stop and
whether a lone Escape has waited long enough to be a key rather than the start of a sequence.
Each wake-up costs a timer, a system call and the interpreter's lock: 0.1-0.2 ms of CPU on a
virtual machine, 1-2 ms a second for an idle console, more than its whole process table. This
thread waits on the terminal with no timeout, except while the parser holds a lone Escape (then
until the parser's own deadline); stopping the driver wakes it through a pipe.

The console's updates leave the text style of their last cells in effect for the next
(gpuscope.tui.terminal_cells); the driver resets it when it stops (on exit and on a suspend), so
that the shell, or a program run meanwhile, does not write in the console's colours.
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder
from threading import Event, Lock

from textual._parser import ParseError
from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

_POLL_S = 0.1  # Textual's own period: kept where the parser's deadline cannot be read
_UNKNOWN = object()  # Textual's parser no longer says when it waits


class _WakingEvent(Event):
    """An Event that, once set, also wakes the input thread waiting on its pipe (if one waits)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = Lock()
        self._wake_fd: int | None = None

    def wake_through(self, fd: int | None) -> None:
        with self._lock:
            self._wake_fd = fd

    def set(self) -> None:
        super().set()
        with self._lock:
            if self._wake_fd is not None:
                try:
                    os.write(self._wake_fd, b"x")
                except OSError:  # full: the thread has yet to read what woke it
                    pass


class IdleInputDriver(LinuxDriver):
    """LinuxDriver whose input thread wakes for input, for a pending Escape and to stop: never
    on a timer; and which resets the text style when it stops."""

    resets_style_on_stop = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.exit_event: _WakingEvent = _WakingEvent()

    def stop_application_mode(self) -> None:
        self.write("\x1b[0m")  # before the alternate screen is left: some terminals keep the style
        super().stop_application_mode()

    def run_input_thread(self) -> None:
        """Textual's loop (LinuxDriver.run_input_thread), waiting without a timeout."""
        # A pipe for each run of the thread: Textual closes the driver while the console is
        # suspended and starts the thread again on the same driver when it resumes.
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self.exit_event.wake_through(wake_write)
        selector = selectors.PollSelector()  # not select(): no limit on the descriptors' numbers
        selector.register(self.fileno, selectors.EVENT_READ)
        selector.register(wake_read, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode

        def timeout() -> float | None:
            deadline = getattr(parser, "_timeout_time", _UNKNOWN)  # set while a lone Escape waits
            if not (deadline is None or isinstance(deadline, float)):
                return _POLL_S
            return None if deadline is None else max(0.0, deadline - get_time())

        def process(ready: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> None:
            for n, (key, _) in enumerate(ready, 1):
                if key.fd == wake_read:
                    try:
                        os.read(wake_read, 64)
                    except OSError:
                        pass
                    continue
                data = decode(os.read(self.fileno, 1024 * 4), final=final and n == len(ready))
                if not data:
                    break  # standard input was closed
                for event in parser.feed(data):
                    self.process_message(event)
            for event in parser.tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process(selector.select(timeout()))
            selector.unregister(self.fileno)
            process(selector.select(_POLL_S), final=True)
        finally:
            self.exit_event.wake_through(None)
            selector.close()
            os.close(wake_read)
            os.close(wake_write)
            try:
                for _ in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass

"""The console's title bar shows at once, before Python has imported and laid out the console;
the console then takes the same screen over. Where it never starts, the terminal is given back
before anything is said."""

import gc
import os

import pytest

from gpuscope.commands import console
from gpuscope.config import Settings
from gpuscope.errors import Failure


class Source:
    def prefetch(self) -> None:
        pass

    def stop(self) -> None:
        pass


class App:
    """A console that took the terminal and gave it back (as Textual's driver does)."""

    took_terminal = True
    return_code = 0

    def add_cleanup(self, cleanup) -> None:
        pass

    def when_shown(self, callback) -> None:
        pass

    def run(self) -> None:
        pass


@pytest.fixture
def terminal(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((40, 10)))
    (tmp_path / "config.toml").write_text("[journal]\nenabled = false\n")
    return Settings.load(env={"GPUSCOPE_CONFIG": str(tmp_path / "config.toml")})


def test_the_title_bar_shows_first_and_the_console_takes_the_screen_over(terminal, monkeypatch, capfd):
    monkeypatch.setattr(console, "console_app", lambda *a, **k: App())
    assert console.run_console(terminal, Source(), None, pid=None) == 0
    out = capfd.readouterr().out
    assert out.startswith("\x1b[?1049h") and " gpuscope " in out and "starting…" in out
    assert console.LEAVE_SKELETON not in out  # the console left the alternate screen itself


def test_a_console_that_never_starts_gives_the_terminal_back_before_its_error_is_said(terminal, monkeypatch, capfd,
                                                                                   collector):
    def refused(*a, **k):
        raise Failure("the console cannot start")

    monkeypatch.setattr(console, "console_app", refused)
    with pytest.raises(Failure):
        console.run_console(terminal, Source(), None, pid=None)
    out = capfd.readouterr().out
    assert out.startswith("\x1b[?1049h") and out.endswith(console.LEAVE_SKELETON)
    assert gc.isenabled() and gc.get_freeze_count() == 0  # and the garbage collector as it was


class ShownApp(App):
    """A console that shows its first frame while it runs, then ends."""

    def __init__(self) -> None:
        self.shown = []
        self.collector_on_at_start = None

    def when_shown(self, callback) -> None:
        self.shown.append(callback)

    def run(self) -> None:
        self.collector_on_at_start = gc.isenabled()
        for callback in self.shown:
            callback()


@pytest.fixture
def collector():
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def test_what_the_start_built_is_frozen_out_of_collections_once_the_first_frame_shows(terminal, monkeypatch, collector):
    app = ShownApp()
    monkeypatch.setattr(console, "console_app", lambda *a, **k: app)
    assert console.run_console(terminal, Source(), None, pid=None) == 0
    assert app.collector_on_at_start is False  # no collection walks the heap while the console starts
    assert gc.get_freeze_count() > 1000  # the modules, styles and widgets it built
    assert gc.isenabled()


"""What a screen reads of its console, typed: screens reach it through `self.app`, which Textual
types as a plain App."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from textual.app import App

    from gpuscope.core.leak import LeakThresholds
    from gpuscope.core.node.model import Frame
    from gpuscope.core.session.interface import Session


class ConsoleApp(Protocol):
    session: Session  # what the console shows: live or recorded
    thresholds: LeakThresholds  # the settings' [alerts]
    frame: Frame | None  # the frame shown (a replay's at its position), None before the first


def console_of(app: App) -> ConsoleApp:
    return cast(ConsoleApp, app)


def session_of(app: App) -> Session:
    return console_of(app).session

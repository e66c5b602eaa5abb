"""The session a screen's console runs over, typed: screens reach it through `self.app`, which
Textual types as a plain App."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from textual.app import App

    from gpuscope.core.session.interface import Session


class _ConsoleApp(Protocol):
    session: Session  # what the console shows: live or recorded


def session_of(app: App) -> Session:
    return cast(_ConsoleApp, app).session

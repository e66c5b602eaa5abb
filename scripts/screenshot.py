"""Render the README's picture: the console attached to the demo service, as an SVG.

    python scripts/screenshot.py [--seconds 25] [--theme gpuscope-dark] [-o docs/console.svg]

It runs the real demo (service + load) and the real console headless at 120x40 for a while,
then saves Textual's screenshot of it. The README's pictures were taken in a PID namespace of
their own, so that the table holds only the demo's processes:

    unshare --pid --fork --mount-proc python scripts/screenshot.py -o docs/console.svg
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from gpuscope.core.node.live import NodeSource
from gpuscope.demo.run import Demo
from gpuscope.tui.app import GpuScopeApp


async def shoot(seconds: float, theme: str, out: Path) -> None:
    demo = Demo()
    demo.start()
    try:
        app = GpuScopeApp(NodeSource(interval=1.0, focus_pid=demo.service.pid), theme=theme)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(seconds)
            app.query_one("#chart").show(app.frame.chart, force=True, now=app.frame.time)
            await pilot.pause()
            out.parent.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(filename=out.name, path=str(out.parent))
    finally:
        demo.stop()
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--theme", default="gpuscope-dark")
    parser.add_argument("-o", "--output", type=Path, default=Path("docs/console.svg"))
    args = parser.parse_args()
    asyncio.run(shoot(args.seconds, args.theme, args.output))


if __name__ == "__main__":
    main()

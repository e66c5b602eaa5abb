"""The service panel over injected serving snapshots (Pilot)."""

from gpuscope.core.settings import SloConfig
from gpuscope.core.serving.changepoint import Jump
from gpuscope.core.serving.model import FleetRow, ServingSnapshot, SignalPoint, Signals, StageStats
from gpuscope.tui.app import GpuScopeApp
from gpuscope.tui.service import ServicePanel

from frames import T0, FakeServing, FakeSource, frame, live
from pilot_wait import until



def snapshot(**changes) -> ServingSnapshot:
    history = tuple(
        SignalPoint(T0 - 60 + i, Signals(e2e_latency_p95_s=0.5, e2e_latency_p99_s=0.6 if i < 40 else 2.0, tokens_per_s=100.0 + i))
        for i in range(60)
    )
    base = dict(
        time=T0, source="scrape", target="http://127.0.0.1:8000/metrics", profile="rag", window_s=30.0,
        signals=Signals(e2e_latency_p50_s=0.3, e2e_latency_p95_s=0.5, e2e_latency_p99_s=2.0, ttft_p95_s=0.95,
                        tpot_p95_s=0.012, tokens_per_s=160.0, requests_per_s=9.5, error_rate=0.0, queue_depth=3.0),
        stages=(StageStats("retriever", 0.02, 0.06, 0.07, 0.1), StageStats("llm", 0.3, 0.45, 0.5, 0.9)),
        history=history, as_of=T0, p99_jump=Jump(started=T0 - 20, before_s=0.6, after_s=2.0),
    )
    base.update(changes)
    return ServingSnapshot(**base)


async def test_signals_stages_slo_breach_and_latency_jump():
    serving = FakeServing(snapshot())
    app = GpuScopeApp(live(FakeSource(frame()), serving=serving), slo=SloConfig(ttft_p95_s=0.8))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = app.query_one(ServicePanel).text.plain
        assert "SERVICE rag · scrape http://127.0.0.1:8000/metrics" in text
        assert "TTFT95 !950ms" in text  # over its 800 ms SLO: marked, not only coloured
        assert "P95 500ms" in text and "tok/s 160.0" in text and "queue 3" in text
        assert "retriever █░░░░░░░░░ 20ms/60ms 10%" in text and "llm █████████░" in text
        assert "▲ P99 jumped from 600 ms to 2.00 s at " in text
    assert serving.stopped


async def test_the_panel_renders_the_cores_jump_and_finds_none_itself():
    # the history jumps (0.6 s -> 2 s), but the snapshot says no jump was found: none is shown
    app = GpuScopeApp(live(FakeSource(frame()), serving=FakeServing(snapshot(p99_jump=None))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "jumped" not in app.query_one(ServicePanel).text.plain


async def test_an_unreachable_target_says_since_when_not_stale_numbers():
    down = snapshot(state="unreachable since 12:03:41, retrying (connection refused)")
    app = GpuScopeApp(live(FakeSource(frame()), serving=FakeServing(down)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = app.query_one(ServicePanel).text.plain
        assert "✖ unreachable since 12:03:41, retrying" in text and "numbers as of" in text


async def test_no_serving_source_no_panel():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.query_one(ServicePanel).display


async def test_the_fleet_view_names_where_memory_grows_fastest():
    fleet = (FleetRow("node-7", "3", "GPU-x", "vllm-0", "serving", 70_000.0, 12.5),
             FleetRow("node-2", "0", "GPU-y", None, None, 40_000.0, 0.1))
    app = GpuScopeApp(live(FakeSource(frame()), serving=FakeServing(snapshot(source="prometheus", fleet=fleet))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = app.query_one(ServicePanel).text.plain
        assert "FLEET growth node-7/gpu3/vllm-0 +12.5 MiB/s" in text and "node-2/gpu0 +0.1 MiB/s" in text


async def test_the_wizard_shows_the_same_jump_on_its_service_step():
    from textual.widgets import OptionList

    from gpuscope.tui.textlines import TextLines
    from gpuscope.tui.wizard import WizardScreen

    snap = snapshot()
    app = GpuScopeApp(live(FakeSource(frame()), serving=FakeServing(snap)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        wizard = app.screen
        assert isinstance(wizard, WizardScreen)
        wizard.query_one("#steps", OptionList).highlighted = 2  # 3. Throughput per request
        await pilot.pause()
        text = wizard.query_one("#step", TextLines).text.plain
        assert text.startswith("3. ") and snap.p99_jump.describe() in text


async def test_an_answer_that_is_not_metrics_says_so_on_the_service_line():
    from metrics_server import MetricsServer, Reply

    from gpuscope.core.serving.profiles import BUILTIN_PROFILES
    from gpuscope.core.serving.scrape import ScrapeCollector
    from gpuscope.core.serving.source import ServingSource

    with MetricsServer() as server:
        server.route("/metrics", Reply("<!DOCTYPE html>\n<html><body>Login</body></html>\n", content_type="text/html"))
        source = ServingSource(ScrapeCollector([server.url()], window_s=30.0, profiles=BUILTIN_PROFILES), interval=0.1)
        app = GpuScopeApp(live(FakeSource(frame()), serving=source))
        async with app.run_test(size=(120, 40)) as pilot:
            panel = app.query_one(ServicePanel)
            await until(pilot, lambda: "not metrics" in panel.text.plain, "the panel to say what the page is")
            assert f"✖ {server.url()}: not metrics (an HTML page)" in panel.text.plain

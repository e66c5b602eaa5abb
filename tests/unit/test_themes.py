"""Theme files: the built-in ones, user themes from the XDG folder, broken files, the console's
theme key, the remembered choice, NO_COLOR and animations."""

import os

import pytest
from textual.filter import Monochrome, NoColor

from gpuscope import theme_files
from gpuscope.theme_files import ANSI_NAMES, ThemeFileError, load_theme_file, load_themes
from gpuscope.tui.app import GpuScopeApp

from frames import FakeSource, frame, live

BUILT_IN = ["gpuscope-ansi", "gpuscope-dark", "gpuscope-high-contrast", "gpuscope-light"]


def user_themes() -> "os.PathLike":
    folder = theme_files.user_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_built_in_themes_load_and_the_ansi_one_uses_only_the_terminal_palette():
    themes, problems = load_themes()
    assert problems == [] and sorted(themes) == BUILT_IN
    ansi = themes["gpuscope-ansi"]
    assert ansi.ansi and all(v in ANSI_NAMES for v in [*ansi.colours.values(), *ansi.variables.values()])
    assert not themes["gpuscope-dark"].ansi and not themes["gpuscope-light"].dark


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name = 'x'\nprimary = ", "not valid TOML"),
        ("name = 'x'\nprimary = '#123456'\nsparkle = '#fff'", "unknown key 'sparkle'"),
        ("name = 'x'\nprimary = 'blurple'", "'blurple' is not a colour"),
        ("name = 'x'\nprimary = '#12345'", "'#12345' is not a colour"),
        ("name = 'x y'\nprimary = '#123456'", "name must be letters"),
        ("name = 'x'\nsecondary = '#123456'", "'primary' is required"),
        ("name = 'x'\nprimary = '#123456'\nansi = 'yes'", "ansi must be true or false"),
        ("name = 'x'\nprimary = '#123456'\n[variables]\ngpuscope-gpu = 12", "variables.gpuscope-gpu"),
    ],
)
def test_a_broken_theme_file_is_one_line_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "broken.toml"
    path.write_text(text)
    with pytest.raises(ThemeFileError) as caught:
        load_theme_file(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_user_themes_come_from_the_xdg_config_folder_and_broken_ones_are_skipped():
    folder = user_themes()
    (folder / "mine.toml").write_text("name = 'mine'\ndark = false\nprimary = '#336699'\n")
    (folder / "gpuscope-dark.toml").write_text("name = 'gpuscope-dark'\nprimary = '#FF0000'\n")  # overrides
    (folder / "broken.toml").write_text("name = 'broken'\nprimary = 'not-a-colour'\n")
    themes, problems = load_themes()
    assert sorted(themes) == sorted([*BUILT_IN, "mine"])
    assert themes["gpuscope-dark"].colours["primary"] == "#FF0000"
    assert len(problems) == 1 and "broken.toml" in problems[0]


async def test_a_broken_theme_is_reported_once_in_a_notification_and_the_console_runs():
    (user_themes() / "broken.toml").write_text("primary = 'nope'\n")
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        notes = [n for n in app._notifications if "broken.toml" in n.message]
        assert len(notes) == 1 and notes[0].title == "theme file skipped"
        assert app.theme == "gpuscope-dark" and "broken" not in app.available_themes


async def test_t_cycles_the_themes_and_the_choice_is_remembered():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        seen = [app.theme]
        for _ in BUILT_IN:
            await pilot.press("t")
            seen.append(app.theme)
        assert seen == ["gpuscope-dark", "gpuscope-high-contrast", "gpuscope-light", "gpuscope-ansi", "gpuscope-dark"]
        await pilot.press("t")
        assert app.theme == "gpuscope-high-contrast"
    assert theme_files.remembered() == "gpuscope-high-contrast"
    assert theme_files.remembered_path().read_text().strip() == "gpuscope-high-contrast"


async def test_the_palette_offers_each_theme_instead_of_textuals_picker():
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Theme" not in titles and "Next theme" in titles
        assert [t for t in titles if t.startswith("Theme: ")] == [f"Theme: {n}" for n in BUILT_IN]


async def test_growth_keeps_its_arrow_and_takes_its_colour_from_the_theme():
    app = GpuScopeApp(live(FakeSource(frame())), theme="gpuscope-ansi")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        table = app.query_one("ProcessTable")
        assert table.growth_style == "bold color(3)"  # ansi_yellow: the terminal's own yellow
        row = next(r for r in table.order if r.pid == 4242)
        assert table.cell(row.key, "growth").startswith("▲")


async def test_no_color_removes_colour_instead_of_turning_it_grey(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        filters = app.get_line_filters()
        assert any(isinstance(f, NoColor) for f in filters) and not any(isinstance(f, Monochrome) for f in filters)
        # Without colour the cursor row is still visible: reverse video.
        assert app.query_one("ProcessTable").get_component_rich_style("process-table--cursor").reverse


async def test_no_animations_unless_asked_for(monkeypatch):
    app = GpuScopeApp(live(FakeSource(frame())))
    assert app.animation_level == "none"
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "full")
    assert GpuScopeApp(live(FakeSource(frame()))).animation_level != "none"


def drawn_colours(strips, chars=None) -> set[str]:
    """The foreground colours (#rrggbb) of what is drawn, only of `chars` if given."""
    return {seg.style.color.get_truecolor().hex.lower() for strip in strips for seg in strip
            if seg.style is not None and seg.style.color is not None and seg.text.strip()
            and (chars is None or any(c in chars for c in seg.text))}


BRAILLE = {chr(c) for c in range(0x2801, 0x2900)}


@pytest.mark.parametrize("theme", ["gpuscope-light", "gpuscope-high-contrast"])
async def test_switching_theme_recolours_the_chart_lines_the_growth_column_and_the_device_bars(theme):
    """The app's theme is set directly (no hook of the app's own): each widget follows it by itself."""
    spec = load_themes()[0][theme]
    dark = load_themes()[0]["gpuscope-dark"]
    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        from gpuscope.tui.chart import MemoryChart
        from gpuscope.tui.processes import ProcessTable
        from gpuscope.tui.textlines import TextLines

        chart = app.query_one(MemoryChart)
        growth = app.query_one(ProcessTable).query_one("#col-growth", TextLines)
        bars = app.query_one("#dev-bars", TextLines)

        def seen():
            chart.render_line(0)  # the chart draws its lines when painted
            return drawn_colours(chart._strips, BRAILLE), drawn_colours(growth._strips), drawn_colours(bars._strips)

        before = seen()
        assert dark.variables["gpuscope-gpu"].lower() in before[0]
        app.theme = theme
        await pilot.pause()
        lines, column, device = seen()
        assert spec.variables["gpuscope-gpu"].lower() in lines and spec.variables["gpuscope-rss"].lower() in lines
        assert dark.variables["gpuscope-gpu"].lower() not in lines
        assert spec.variables["gpuscope-growth"].lower() in column and column != before[1]
        assert spec.colours["success"].lower() in device and device != before[2]


async def test_each_line_s_base_style_follows_every_theme_as_textual_computes_it():
    """Text widgets and the chart paint each line over the style Textual keeps for the widget
    until its styles change (not walked up the DOM per line): after each theme it must still be
    the style the widget and its ancestors make now."""
    from gpuscope.tui.chart import MemoryChart
    from gpuscope.tui.textlines import TextLines

    app = GpuScopeApp(live(FakeSource(frame())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        widgets = [*app.query(TextLines), app.query_one(MemoryChart)]
        for theme in [*BUILT_IN, "gpuscope-dark"]:
            app.theme = theme
            await pilot.pause()
            for widget in widgets:
                strip = widget.render_line(widget.size.height + 1)  # past the text: the base style alone
                assert {seg.style for seg in strip} == {widget.rich_style}, (theme, widget)


async def test_the_wizard_marks_its_steps_in_the_theme_s_colours():
    """The diagnosis's step marks and verdict follow the theme, as the table and the chart do."""
    from gpuscope.tui.palette import palette_of
    from gpuscope.tui.wizard import WizardScreen

    app = GpuScopeApp(live(FakeSource(frame())), theme="gpuscope-ansi")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        wizard = app.screen
        assert isinstance(wizard, WizardScreen)
        styles = {str(span.style) for span in wizard.query_one("#wizard-title").text.spans}
        assert any(palette_of(app).success in s or palette_of(app).error in s or palette_of(app).warning in s
                   for s in styles), styles
        before = palette_of(app)
        app.theme = "gpuscope-light"
        await pilot.pause()
        after = palette_of(app)
        assert before != after
        styles = {str(span.style) for span in wizard.query_one("#wizard-title").text.spans}
        assert any(after.success in s or after.error in s or after.warning in s for s in styles), styles


@pytest.mark.parametrize("theme", ["gpuscope-light", "gpuscope-dark"])
async def test_the_chosen_theme_is_in_the_first_paint_and_the_css_is_parsed_once(monkeypatch, theme):
    """Switching theme makes Textual parse the whole stylesheet again and restyle every widget
    (~50 ms of a start of ~0.5 s): the chosen theme is set before the stylesheet is first parsed."""
    from textual.css import stylesheet

    parsed = []
    real_parse = stylesheet.parse

    def parse(scope, css, read_from, **kwargs):
        parsed.append(str(read_from[0]))
        return real_parse(scope, css, read_from, **kwargs)

    monkeypatch.setattr(stylesheet, "parse", parse)
    spec = load_themes()[0][theme]
    app = GpuScopeApp(live(FakeSource(frame())), theme=theme)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.theme == theme
        assert app.screen.styles.background.hex.lower() == spec.colours["background"].lower()
        dark = theme != "gpuscope-light"
        assert app.has_class(f"-theme-{theme}") and app.has_class("-dark-mode") == dark != app.has_class("-light-mode")
        assert len([p for p in parsed if p.endswith("gpuscope.tcss")]) == 1, parsed
        await pilot.press("t")  # and a switch afterwards is Textual's own
        assert app.theme != theme and not app.has_class(f"-theme-{theme}")

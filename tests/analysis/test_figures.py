"""The paper figures' computations: RoPE's long-term decay bound (RoFormer §3.4.3) and the sinusoidal
dot-product curve, checked against closed forms and against the project's own RoPE / sinusoidal code."""

import numpy as np
import pytest
import torch

from linrope.analysis.figures import main, rope_decay_bound, rope_thetas, sinusoidal_dot


@pytest.mark.parametrize("d", [16, 64, 128])
def test_decay_bound_at_distance_zero_is_its_closed_form(d):
    # every S_j(0) = j, so (1/(d/2)) Σ_{j=1}^{d/2} j = (d/2 + 1) / 2
    expected = sum(range(1, d // 2 + 1)) / (d // 2)
    assert rope_decay_bound(0, d) == pytest.approx(expected) == pytest.approx((d / 2 + 1) / 2)
    assert rope_decay_bound(0, 128) == pytest.approx(32.5)


def test_decay_bound_matches_the_sum_written_out():
    d, theta = 32, rope_thetas(32)
    for r in (1, 7, 50):
        s = [abs(sum(np.exp(1j * r * theta[t]) for t in range(j))) for j in range(1, d // 2 + 1)]
        assert rope_decay_bound(r, d) == pytest.approx(sum(s) / (d // 2))


def test_decay_bound_falls_on_average_with_distance():
    b = rope_decay_bound(np.arange(256), 128)
    assert (b <= b[0] + 1e-12).all() and (b > 0).all()
    windows = b.reshape(8, 32).mean(1)  # mean over distances 0-31, 32-63, ...
    assert (np.diff(windows) < 0).all(), windows
    assert b[200:].max() < 0.5 * b[0]


def test_decay_bound_bounds_the_rotated_product():
    """|<R_m q, R_n k>| <= max_j |h_{j+1} - h_j| · Σ_j |S_j(m - n)| (Abel summation, h_{d/2} = 0),
    with the project's apply_rope."""
    from linrope.ops.rope import apply_rope

    d = 64
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        q, k = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
        qc, kc = torch.complex(q[0::2], q[1::2]), torch.complex(k[0::2], k[1::2])
        h = torch.cat([qc * kc.conj(), torch.zeros(1, dtype=qc.dtype)])
        step = (h[1:] - h[:-1]).abs().max().item()
        for m, n in [(5, 0), (40, 3), (200, 17)]:
            rq, rk = apply_rope(q[None], torch.tensor([m]))[0], apply_rope(k[None], torch.tensor([n]))[0]
            dot = float(rq @ rk)
            assert abs(dot) <= step * (d // 2) * rope_decay_bound(m - n, d) + 1e-9


def test_sinusoidal_dot_closed_form_symmetry_and_project_table():
    from linrope.positions.functional import sinusoidal_table

    dim = 128
    k = np.arange(-50, 51)
    w = 10000.0 ** (-2.0 * np.arange(dim // 2) / dim)
    curve = sinusoidal_dot(k, dim)
    assert curve[50] == pytest.approx(dim / 2)  # k = 0: Σ (sin² + cos²)
    assert np.allclose(curve, np.cos(k[:, None] * w).sum(1))  # Σ_i cos(k ω_i)
    assert np.allclose(curve, curve[::-1])  # symmetric: blind to the direction of the offset
    assert np.allclose(sinusoidal_dot(k, dim, t=37), curve)  # independent of t
    pe = sinusoidal_table(torch.arange(200), dim).double().numpy()
    assert np.allclose(pe[60] @ pe[60 + k].T, curve, atol=1e-3)


def test_figures_cli_writes_both_pngs(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--max-distance", "64"]) == 0
    for name in ("rope_decay.png", "sinusoidal_dot.png"):
        assert (tmp_path / name).stat().st_size > 1000
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out


# ---- linrope.base.plots: the encoding the report's figures share -------------------------------------------------------
def test_config_style_hue_per_position_scheme_style_per_attention():
    from linrope.base.plots import POSITION_COLOURS, config_style

    def style(kind, position, **extra):
        return config_style(
            {
                "model.attention.kind": kind,
                "model.position.name": position,
                **{f"model.{k.replace('__', '.')}": v for k, v in extra.items()},
            }
        )

    softmax_rope, linear_rope = style("softmax", "rope"), style("linear", "rope", attention__feature_map="elu")
    assert softmax_rope["color"] == linear_rope["color"]  # one hue per scheme
    assert (softmax_rope["linestyle"], linear_rope["linestyle"]) == ("-", "--")  # style per attention kind
    assert style("linear", "none", attention__feature_map="elu")["color"] != linear_rope["color"]
    assert style("linear", "rope", attention__feature_map="cosine")["linestyle"] == ":"
    both = style("linear", "rope", attention__feature_map="elu", attention__placement="both")
    assert both["marker"] == "D" and both["color"] == linear_rope["color"] and linear_rope["marker"] == "o"
    assert style("softmax", "rope", position__scaling="pi")["marker"] == "^"
    assert len(set(POSITION_COLOURS.values())) == len(POSITION_COLOURS)
    assert style("softmax", "brand_new")["color"] == style("softmax", "brand_new")["color"]  # stable fallback


def test_a_diverged_seed_is_left_out_of_its_curve_and_counted():
    """A seed whose value turns NaN (diverged) is left out of the mean and band from there, and the legend counts it:
    the mean over every seed was NaN, and the curve of a configuration with one diverged seed stopped at that step."""
    from linrope.base.plots import Curve, Panel, by_last_value, make_figure

    nan = float("nan")
    split = Curve("split", {1: [4.0, 6.0], 3: [3.0, nan], 5: [2.0, nan]}, {"color": "#d62728"})
    whole = Curve("whole", {1: [5.0], 3: [4.5], 5: [4.4]}, {"color": "#1f77b4"})
    assert split.summary() == ([1, 3, 5], [5.0, 3.0, 2.0], [4.0, 3.0, 2.0], [6.0, 3.0, 2.0])
    assert split.diverged() == 1 and whole.diverged() == 0
    assert [c.label for c in by_last_value([whole, split])] == ["split", "whole"]  # ordered by the finite means
    ax = make_figure([Panel("p", [split, whole])], xlabel="x", ylabel="y", title="t").axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"split (1 seed diverged: left out)": [5.0, 3.0, 2.0], "whole": [5.0, 4.5, 4.4]}


def test_curves_are_seed_means_with_a_band_and_the_legend_is_outside_and_kept(tmp_path):
    import matplotlib.image
    from matplotlib.collections import PolyCollection

    from linrope.base.plots import Curve, Panel, make_figure, save

    spread = Curve("spread", {1: [1.0, 2.0, 6.0], 2: [2.0, 2.0, 2.0]}, {"color": "#d62728"})
    flat = Curve("flat", {1: [5.0], 2: [4.0]}, {"color": "#1f77b4", "linestyle": "--"})
    empty = Curve("empty", {}, {})
    fig = make_figure([Panel("p", [spread, flat, empty])], xlabel="x", ylabel="y", title="only what ran")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["flat", "spread"]
    assert list(lines["spread"].get_ydata()) == [3.0, 2.0] and list(lines["flat"].get_ydata()) == [5.0, 4.0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # only the curve whose seeds differ gets a band
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == 1.0 and ys.max() == 6.0  # lowest to highest seed
    assert fig._suptitle.get_text().startswith("only what ran")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend, box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= box.x1  # outside the axes, to the right
    tight = fig.get_tightbbox(renderer)  # in inches; bbox_inches="tight" saves exactly this (plus padding)
    assert tight.x1 * fig.dpi >= legend.x1 - 1
    path = save(fig, tmp_path / "c.png", dpi=100)
    height, width = matplotlib.image.imread(path).shape[:2]
    assert width >= (tight.x1 - tight.x0) * 100 - 2 and height >= (tight.y1 - tight.y0) * 100 - 2
    assert make_figure([Panel("p", [empty])], xlabel="x", ylabel="y") is None


def test_plot_length_table_draws_one_line_per_scaling_without_na(tmp_path, monkeypatch):
    from linrope.base import plots

    rows = [
        {"length": 64, "scaling": "none", "bpb": 2.0, "status": "ok"},
        {"length": 128, "scaling": "none", "bpb": 2.5, "status": "ok"},
        {"length": 128, "scaling": "ntk", "bpb": 2.2, "status": "ok"},
        {"length": 256, "scaling": "none", "bpb": None, "status": "n/a (position table has 64 rows)"},
    ]
    seen = {}
    real = plots.make_figure

    def spy(panels, **kw):
        fig = real(panels, **kw)
        seen["lines"] = {
            line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in fig.axes[0].get_lines()
        }
        seen["kw"] = kw
        return fig

    monkeypatch.setattr(plots, "make_figure", spy)
    saved = plots.plot_length_table(rows, tmp_path / "e.png", train_context=64, title="softmax_rope")
    assert saved.stat().st_size > 1000
    assert seen["lines"]["as trained"] == [(64, 2.0), (128, 2.5)] and seen["lines"]["ntk"] == [(128, 2.2)]
    assert seen["kw"]["ylabel"] == "bits per byte" and seen["kw"]["vlines"] == [64]


def test_every_row_of_an_evaluate_figure_has_a_style_of_its_own(tmp_path, monkeypatch):
    """evaluate's figure of a RoPE model: 5 rows under each protocol and the context-limited control, 11 in all; the
    control ("windows window256") was drawn in the colour of "as trained" (the palette has 10)."""
    from linrope.base import plots
    from linrope.evaluation.tables import row_name

    rows = [
        {"length": n, "protocol": p, "scaling": s, "window": None, "bpb": 2.0, "status": "ok"}
        for n in (256, 512)
        for p in ("sliding", "windows")
        for s in ("none", "pi", "ntk", "yarn", "dynamic")
    ] + [{"length": 512, "protocol": "windows", "scaling": "none", "window": 256, "bpb": 2.0, "status": "ok"}]
    seen = {}
    monkeypatch.setattr(plots, "plot_curves", lambda panels, path, **kw: seen.setdefault("curves", panels[0].curves))
    plots.plot_length_table(rows, tmp_path / "e.png", train_context=256, name=row_name)
    styles = {
        c.label: (c.style["color"], str(c.style["linestyle"]), c.style.get("marker", "o")) for c in seen["curves"]
    }
    assert len(styles) == 11 and len(set(styles.values())) == 11
    assert styles["windows window256"][0] not in {v[0] for k, v in styles.items() if k != "windows window256"}


def test_reference_levels_are_drawn_across_every_panel_with_their_labels():
    """The extrapolation figure marks the unigram and the n-gram references (the table marks a mean above the
    unigram collapsed; the figure showed no level to read that against)."""
    from linrope.base.plots import Curve, Panel, make_figure

    curve = Curve("a", {128: [2.0, 2.1], 256: [5.0, 5.2]}, {})
    fig = make_figure(
        [Panel("one", [curve]), Panel("two", [curve])],
        xlabel="x",
        ylabel="y",
        hlines={"unigram (train split, reference)": 4.753, "5-gram (train split, reference)": 1.653},
    )
    for ax in fig.axes:
        levels = {ln.get_label(): ln.get_ydata()[0] for ln in ax.get_lines() if "reference" in ln.get_label()}
        assert levels == {"unigram (train split, reference)": 4.753, "5-gram (train split, reference)": 1.653}
        assert "unigram (train split, reference)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_curves_that_share_their_only_x_are_points_side_by_side_with_every_seed():
    """One arm (a recall study at one width): no line or band to draw, so each configuration is its mean with a bar
    from the lowest to the highest seed and a circle per seed, shifted apart so the bars do not hide each other."""
    from matplotlib.container import ErrorbarContainer

    from linrope.base.plots import BAND_NOTE, Curve, Panel, make_figure

    curves = [Curve("a", {64: [0.3, 0.5, 0.7]}, {}), Curve("b", {64: [0.48, 0.5]}, {}), Curve("c", {64: [1.0]}, {})]
    fig = make_figure([Panel("", curves)], xlabel="width", ylabel="acc", log2_x=True, note=BAND_NOTE)
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [c.get_label() for c in bars] == ["a", "b", "c"]
    xs = [float(c.lines[0].get_xdata()[0]) for c in bars]
    assert xs == sorted(xs) and len(set(xs)) == 3 and all(48 < x < 85 for x in xs)  # apart, around 64
    assert [float(c.lines[0].get_ydata()[0]) for c in bars] == pytest.approx([0.5, 0.49, 1.0])
    low, high = bars[0].lines[2][0].get_segments()[0][:, 1]  # the bar: lowest to highest seed
    assert (low, high) == pytest.approx((0.3, 0.7))
    seeds = sorted(float(y) for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_linestyle() == "None"
                   for y in ln.get_ydata())  # fmt: skip
    assert seeds == pytest.approx([0.3, 0.48, 0.5, 0.5, 0.7, 1.0])  # every seed drawn
    lo, hi = ax.get_xlim()
    assert lo < 64 < hi and hi / lo < 2.5  # a window around the shared x
    assert "bar: lowest to highest seed" in fig._suptitle.get_text() and "band" not in fig._suptitle.get_text()

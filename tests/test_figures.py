"""Every figure of the catalog, rendered and read back from what it draws: no raw mathtext, no text off
the canvas, no drawn text on top of another, no legend over plotted data; from the tiny study's tables
and from tables made to reach each figure's branches. Exact and fast: it reads the drawn artists' window
extents after one layout pass, with no image comparison."""

from __future__ import annotations

import itertools
from dataclasses import replace
from unittest import mock

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from matplotlib import cbook
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from uph.report.catalog import FIGURES, TABLES
from uph.report.figures import ATTENTIONS, STYLE, attention_styles, literal, render, save_all
from uph.report.study import Study, load_study

TOLERANCE = 1.0  # pixels


def drawn_texts(fig: Figure, style: dict = STYLE) -> list[Text]:
    """The texts `fig` draws (a tick label outside its axis' view is made but not drawn), after one
    draw pass that lays the figure out as saving it does (uph.report.figures.save draws under STYLE)."""
    drawn, draw = [], Text.draw

    def record(text, renderer):
        if text.get_visible() and text.get_text():  # Text.draw draws nothing otherwise
            drawn.append(text)
        return draw(text, renderer)

    with mpl.rc_context(style), mock.patch.object(Text, "draw", record):
        fig.draw_without_rendering()
    return drawn


def data_covered(ax, region: Bbox) -> str | None:
    """What of `ax`'s plotted data lies in `region` (display pixels), or None: lines and markers,
    bands, error bars, scatter points, images and texts drawn in data coordinates."""
    for line in ax.lines:
        if line.get_transform() is not ax.transData or not line.get_visible():
            continue  # a reference line (axhline, axvline) spans the axes whatever the data
        path = line.get_transform().transform_path(line.get_path())
        if region.count_contains(path.vertices) or (
            line.get_linestyle() not in ("None", "", " ") and path.intersects_bbox(region, filled=False)
        ):
            return f"line {line.get_label()!r}"
    for collection in ax.collections:
        if isinstance(collection, PathCollection):  # scatter: markers at data offsets
            points = collection.get_offset_transform().transform(collection.get_offsets())
            if region.count_contains(points):
                return "scatter points"
            continue
        for path in collection.get_paths():
            shown = collection.get_transform().transform_path(path)
            if shown.intersects_bbox(region, filled=isinstance(collection, PolyCollection)):
                return type(collection).__name__
    for artist in [*ax.images, *ax.texts]:
        if artist.get_visible() and Bbox.intersection(artist.get_window_extent(), region) is not None:
            return type(artist).__name__
    return None


def drawn_problems(fig: Figure, style: dict = STYLE) -> list[str]:
    """Each fault a reader would see in `fig` drawn under `style`, one line each."""
    texts = drawn_texts(fig, style)
    problems = []
    width, height = fig.bbox.width, fig.bbox.height
    extents = {}
    for text in texts:
        shown, is_math = text._preprocess_math(text.get_text())
        if not is_math and (cbook.is_math_text(text.get_text()) or "\\mathdefault" in shown):
            problems.append(f"raw mathtext {shown!r}")
        box = extents[text] = text.get_window_extent()
        if box.x0 < -TOLERANCE or box.y0 < -TOLERANCE or box.x1 > width + TOLERANCE or box.y1 > height + TOLERANCE:
            where = ", ".join(f"{v:.0f}" for v in box.extents)
            problems.append(
                f"text {shown!r} runs off the canvas (x0, y0, x1, y1 = {where} in {width:.0f} x {height:.0f})"
            )
    for a, b in itertools.combinations(texts, 2):
        overlap = Bbox.intersection(extents[a], extents[b])
        if overlap is not None and min(overlap.width, overlap.height) > TOLERANCE:
            problems.append(f"texts {a.get_text()!r} and {b.get_text()!r} overlap")
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend, ax in itertools.product(legends, fig.axes):
        region = Bbox.intersection(legend.get_window_extent(), ax.bbox)
        if region is not None and (what := data_covered(ax, region)):
            problems.append(f"a legend covers {what} of the axes {ax.get_title()!r}")
    return problems


# --- the check finds each fault ---------------------------------------------------------------------


def test_the_check_finds_raw_mathtext_text_off_the_canvas_overlaps_and_a_covering_legend():
    landed = {**STYLE, "text.parse_math": False}  # the earlier style: log ticks drawn as raw $...$
    with mpl.rc_context(landed):
        fig = Figure(figsize=(3, 2), dpi=100, layout="constrained")
        ax = fig.subplots()
        ax.plot([1, 10, 100], [1, 2, 3])
        ax.set_xscale("log")
    assert "raw mathtext '$\\\\mathdefault{10^{1}}$'" in drawn_problems(fig, landed)

    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(3, 2), dpi=100, layout="constrained")
        ax = fig.subplots()
        ax.plot([0, 1], [0, 1])
        ax.set_xticks([0, 1])
        fig.text(0.9, 0.5, "a label that does not fit")
        ax.text(0.5, 0.5, "one")
        ax.text(0.5, 0.5, "two")
    problems = drawn_problems(fig)
    assert "text 'a label that does not fit' runs off the canvas" in "\n".join(problems)
    assert "texts 'one' and 'two' overlap" in problems

    for plot in (
        lambda ax: ax.plot([0, 1], [0, 1], label="line"),
        lambda ax: ax.plot([0.9], [0.9], marker="o", linestyle="none", label="point"),
        lambda ax: ax.fill_between([0, 1], [0.8, 0.8], [1, 1], label="band"),
        lambda ax: ax.scatter([0.95], [0.95], label="scatter"),
    ):
        with mpl.rc_context(STYLE):
            fig = Figure(figsize=(3, 2), dpi=100, layout="constrained")
            ax = fig.subplots()
            plot(ax)
            ax.set_xlim(0, 1), ax.set_ylim(0, 1)
            ax.legend(loc="upper right")
        assert any(p.startswith("a legend covers") for p in drawn_problems(fig)), plot
        with mpl.rc_context(STYLE):
            ax.get_legend().remove()
            fig.legend(loc="outside right center")
        assert drawn_problems(fig) == []


def test_a_data_label_is_drawn_as_itself():
    fig = Figure(dpi=100, layout="constrained")
    labels = ["$x$", "a_b", "two\nlines", "$x^$", r"c\$d", "cost $5 or $6"]
    with mpl.rc_context(STYLE):
        fig.subplots().set_xticks(range(len(labels)), map(literal, labels), rotation=90)
    shown = [t._preprocess_math(t.get_text()) for t in drawn_texts(fig) if t.get_text() in map(literal, labels)]
    assert shown == [(label.replace("\n", "↵"), False) for label in labels]


# --- every figure, from the tiny study's tables and from tables that reach its branches --------------


@pytest.fixture(scope="session")
def tiny_tables(tiny_study) -> Study:
    results = tiny_study.workdir / "results"
    return load_study(
        {name: results / "tables" / f"{name}.csv" for name in TABLES},
        sorted(results.glob("copy_task/attention~*/seed~*/curves.parquet")),
        sorted(results.glob("feedback/method~*/curves.parquet")),
        copy_task_vocab=8,
    )


ODD_IDS = ["$HOME_dir$", "a_b$c", "two\nlines", "$x^$"]  # mathtext if drawn as it is, and a line break


def one_user(study: Study) -> Study:
    user = sorted(study.cross_user["theta_user"])[0]
    cross = study.cross_user
    personalization = study.personalization[study.personalization["control"] != "own vs others"]
    return replace(
        study,
        cross_user=cross[(cross["theta_user"] == user) & (cross["text_user"] == user)],
        personalization=personalization.assign(n_users=1),
    )


def one_seed(study: Study) -> Study:
    def first_seed(table):
        return table[table["seed"] == table["seed"].min()]

    names = ["copy_task", "copy_task_curves", "feedback", "feedback_curves", "attention", "attention_curves"]
    return replace(study, **{name: first_seed(getattr(study, name)) for name in names})


def without_solver(solver: str):
    def drop(study: Study) -> Study:
        names = ["personalization", "capacity", "dose_response", "cross_user"]
        return replace(study, **{name: (t := getattr(study, name))[t["solver"] != solver] for name in names})

    return drop


def odd_user_ids(study: Study) -> Study:
    users = sorted(study.cross_user["theta_user"].unique())
    rename = dict(zip(users, ODD_IDS, strict=True))
    return replace(study, cross_user=study.cross_user.replace({"theta_user": rename, "text_user": rename}))


def many_users(study: Study, n: int = 189) -> Study:
    """A cross-user matrix beyond the users the figure names (uph.report.figures.NAMED_USERS): n roles of
    plays of 1 to 8 roles each, as config/full.yaml's 189 roles of 36 plays."""
    point = study.cross_user.iloc[0]
    users = [f"play_{i % 36:02d}/Role {i:03d}" for i in range(n)]
    delta = np.random.default_rng(0).normal(0, 0.003, (n, n))
    rows = [
        {**point, "theta_user": u, "text_user": v, "delta_nll": delta[i, j]}
        for (i, u), (j, v) in itertools.product(enumerate(users), repeat=2)
    ]
    return replace(study, cross_user=pd.DataFrame(rows))


def no_cross_user(study: Study) -> Study:
    return replace(study, cross_user=study.cross_user.iloc[:0])


def every_attention_kind(study: Study) -> Study:
    """The attention tables and the copy-task curves with every kind (nine, the matched controls and diff
    among them) and, in the attention study, both models: the legends must stay readable."""

    def every(table: pd.DataFrame, models=()) -> pd.DataFrame:
        copies = [table.assign(attention=kind) for kind in ATTENTIONS]
        return pd.concat([frame.assign(model=model) for frame in copies for model in models] or copies)

    return replace(
        study,
        attention=every(study.attention, ("residual", "seed")),
        attention_curves=every(study.attention_curves, ("residual", "seed")),
        copy_task_curves=every(study.copy_task_curves),
    )


VARIANTS = {
    "test config": lambda study: study,
    "one user": one_user,
    "one seed": one_seed,
    "no adam": without_solver("adam"),
    "no exact": without_solver("exact"),
    "odd user ids": odd_user_ids,
    "189 users": many_users,
    "no cross-user point": no_cross_user,
    "every attention kind": every_attention_kind,
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_figure_draws_without_raw_math_text_off_the_canvas_or_a_legend_on_its_data(tiny_tables, variant):
    study = VARIANTS[variant](tiny_tables)
    faults = {name: problems for name in FIGURES if (problems := drawn_problems(render(name, study)))}
    assert not faults


def test_the_cross_user_figure_names_every_user_as_it_is_and_outlines_the_diagonal(tiny_tables):
    fig = render("cross_user", odd_user_ids(tiny_tables))  # the test config has 2 cross-user points
    texts = drawn_texts(fig)
    matrices = [ax for ax in fig.axes if ax.images]
    names = [(user.replace("\n", "↵"), False) for user in sorted(ODD_IDS)]
    for ax in matrices:
        for axis in (ax.xaxis, ax.yaxis) if ax is matrices[0] else (ax.xaxis,):  # rows named once
            labels = [t for t in texts if t in axis.get_ticklabels()]
            assert [t._preprocess_math(t.get_text()) for t in labels] == names
        outlined = sorted((p.get_x(), p.get_y()) for p in ax.patches if not p.get_fill())
        assert outlined == [(k - 0.5, k - 0.5) for k in range(len(ODD_IDS))]
        assert ax.images[0].norm.vmin == -ax.images[0].norm.vmax  # centred on 0

    fig = render("cross_user", many_users(tiny_tables))  # 189 users: each play named over its block of roles
    (ax,) = [ax for ax in fig.axes if ax.images]
    assert len([p for p in ax.patches if not p.get_fill()]) == 189
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == [f"play_{i:02d} ({6 if i < 9 else 5})" for i in range(36)]
    assert ax.get_xticks()[0] == pytest.approx(2.5) and len(ax.get_lines()) == 2 * 35  # block borders
    study = many_users(tiny_tables, 100)  # ids that name no play: every third user named
    plain = {user: f"user{k:03d}" for k, user in enumerate(sorted(study.cross_user["theta_user"].unique()))}
    fig = render(
        "cross_user", replace(study, cross_user=study.cross_user.replace({"theta_user": plain, "text_user": plain}))
    )
    (ax,) = [ax for ax in fig.axes if ax.images]
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"user{k:03d}" for k in range(0, 100, 3)]


def test_a_matched_control_is_dashed_in_its_variants_colour(tiny_tables):
    styles = attention_styles(ATTENTIONS)
    assert styles["standard_capped"] == {**styles["triple_capped"], "linestyle": "--", "markerfacecolor": "none"}
    assert styles["standard_qknorm"] == {**styles["triple_qknorm"], "linestyle": "--", "markerfacecolor": "none"}
    leaders = [kind for kind in ATTENTIONS if kind not in ("standard_capped", "standard_qknorm")]
    assert len({styles[kind]["color"] for kind in leaders}) == len(leaders)  # diff its own colour among them
    fig = render("attention_loud_copy", every_attention_kind(tiny_tables))
    (legend,) = fig.legends
    shown = {text.get_text(): handle for text, handle in zip(legend.get_texts(), legend.legend_handles)}
    assert len(shown) == len(ATTENTIONS) + 3  # the kinds, the two models and the training length
    capped, control = shown["triple_capped"], shown["standard_capped"]
    assert capped.get_color() == control.get_color() and control.get_linestyle() == "--"
    assert control.get_markerfacecolor() == "none" and capped.get_linestyle() == "-"


def test_a_heads_several_d_are_told_apart_by_line_style_in_the_capacity_figure(tiny_tables):
    """config/full.yaml fits svd_uncond at d 32, 128 and 576: each d draws its own line style in the head's
    colour, named once in the legend; a sweep of one d (the default) names none."""
    capacity = tiny_tables.capacity
    heads = capacity[~capacity["head"].isin(("full_bias", "unigram", "neural_cache"))]
    assert heads["d"].nunique() == 1  # the test config: one d
    wider = replace(tiny_tables, capacity=pd.concat([capacity, heads.assign(d=128), heads.assign(d=576)]))
    for study, named in ((tiny_tables, []), (wider, [f"d = {d:g}" for d in (heads["d"].iloc[0], 128, 576)])):
        fig = render("capacity", study)
        (legend,) = fig.legends
        assert [t.get_text() for t in legend.get_texts() if t.get_text().startswith("d = ")] == named
        paths = [line for line in fig.axes[0].lines if line.get_marker() == "."]  # the rings are "o"
        drawn = {(line.get_color(), line.get_linestyle()) for line in paths}
        plotted = study.capacity[study.capacity["head"].isin([*heads["head"].unique(), "full_bias"])]
        assert len(drawn) == plotted.groupby(["head", "d"]).ngroups  # each (head, d) a colour and style of its own


def test_figures_written_in_parallel_are_the_bytes_written_one_by_one(tiny_tables, tmp_path):
    names = ["personalization", "cross_user", "feedback"]
    written = {}
    for processes in (1, 3):
        folder = tmp_path / str(processes)
        folder.mkdir()
        paths = {name: (folder / f"{name}.png", folder / f"{name}.pdf") for name in names}
        assert list(save_all(tiny_tables, paths, processes=processes)) == names  # in order, once each
        written[processes] = {path.name: path.read_bytes() for path in sorted(folder.iterdir())}
    assert len(written[1]) == 2 * len(names) and written[1] == written[3]

"""control_plane.console.svg_bar_chart: one bar per bucket, stacks scale to the tallest, labels escaped."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from control_plane.console import svg_bar_chart as chart

NS = "{http://www.w3.org/2000/svg}"
SERIES = ("2xx", "4xx", "5xx")


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def rects(svg: str) -> list[ET.Element]:
    return list(parse(svg).iter(f"{NS}rect"))


def height_of(svg: str, cls: str) -> list[float]:
    return [float(r.get("height", "0")) for r in rects(svg) if r.get("class") == cls]


@pytest.mark.parametrize("n", [1, 3, 24])
def test_one_bar_group_per_bucket(n: int) -> None:
    buckets = [chart.Bucket(f"{i:02d}h", {"2xx": 1.0}) for i in range(n)]
    svg = chart.stacked_bars(buckets, SERIES, "requests")
    groups = [g for g in parse(svg).iter(f"{NS}g") if g.get("class") == "bucket"]
    assert len(groups) == n
    assert len(rects(svg)) == n


def test_the_tallest_stack_fills_the_plot_and_the_others_scale_to_it() -> None:
    svg = chart.stacked_bars([chart.Bucket("a", {"2xx": 10}), chart.Bucket("b", {"2xx": 5}),
                              chart.Bucket("c", {"2xx": 2.5})], SERIES, "t")
    full = chart.HEIGHT - chart.TOP - chart.BOTTOM
    assert height_of(svg, "bar-2xx") == pytest.approx([full, full / 2, full / 4])


def test_a_stack_splits_by_series_in_their_order_bottom_up() -> None:
    svg = chart.stacked_bars([chart.Bucket("a", {"5xx": 1, "2xx": 3})], SERIES, "t")
    by_cls = {r.get("class"): r for r in rects(svg)}
    full = chart.HEIGHT - chart.TOP - chart.BOTTOM
    assert float(by_cls["bar-2xx"].get("height", "0")) == pytest.approx(full * 3 / 4)
    assert float(by_cls["bar-5xx"].get("height", "0")) == pytest.approx(full / 4)
    # 2xx is first in the series: it sits at the bottom, 5xx above it
    assert float(by_cls["bar-5xx"].get("y", "0")) < float(by_cls["bar-2xx"].get("y", "0"))


@pytest.mark.parametrize(("values", "bars"), [
    ({}, 0), ({"2xx": 0}, 0), ({"2xx": -3}, 0), ({"4xx": 2}, 1), ({"2xx": 1, "4xx": 1, "5xx": 1}, 3),
    ({"other": 9}, 0),  # a series not asked for is not drawn
])
def test_only_positive_values_of_the_given_series_are_drawn(values: dict[str, float], bars: int) -> None:
    assert len(rects(chart.stacked_bars([chart.Bucket("a", values)], SERIES, "t"))) == bars


def test_no_buckets_or_all_zero_gives_an_empty_chart_not_a_division_by_zero() -> None:
    assert rects(chart.stacked_bars([], SERIES, "t")) == []
    assert rects(chart.stacked_bars([chart.Bucket("a", {})] * 4, SERIES, "t")) == []


def test_each_bar_carries_its_figures_in_a_title_and_labels_are_escaped() -> None:
    svg = chart.stacked_bars([chart.Bucket("<b>&", {"2xx": 2, "5xx": 1.5})], SERIES, 'x"<script>', unit=" req")
    assert "<script>" not in svg and "<b>" not in svg
    titles = [t.text for t in parse(svg).iter(f"{NS}title")]
    assert titles[0] == 'x"<script>'
    assert titles[1] == "<b>&: 2xx 2 req, 5xx 1.5 req"


def test_bucket_labels_every_nth() -> None:
    svg = chart.stacked_bars([chart.Bucket(str(i), {"2xx": 1}) for i in range(24)], SERIES, "t", label_every=6)
    labels = [t.text for t in parse(svg).iter(f"{NS}text") if t.get("class") == "bucket-label"]
    assert labels == ["0", "6", "12", "18"]


def test_the_axis_names_the_top_value() -> None:
    svg = chart.stacked_bars([chart.Bucket("a", {"2xx": 7, "4xx": 5})], SERIES, "t")
    axis = [t.text for t in parse(svg).iter(f"{NS}text") if t.get("class") == "axis-label"]
    assert axis == ["12"]


def test_series_become_css_classes_and_the_legend_names_them() -> None:
    html = chart.legend(["2xx", "no answer"])
    assert re.findall(r'class="swatch ([^"]+)"', html) == ["bar-2xx", "bar-no-answer"]
    assert ">no answer<" in html

"""The pieces report.html and compare.html share: one page, its tables and figures, and how values read."""

import base64
import re

from hookscope.viz.page import STYLE, figure_html, format_value, page_html, section_html, table_html


def test_a_page_carries_its_style_and_escapes_its_title():
    page = page_html("a <b> & c", "<p>body</p>", head="<script>x</script>")
    assert page.startswith("<!DOCTYPE html>") and "<title>a &lt;b&gt; &amp; c</title>" in page
    assert f"<style>{STYLE}</style>" in page and "<script>x</script></head>" in page
    assert "<main>\n<p>body</p>\n</main>" in page


def test_a_figure_embeds_the_png_itself():
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    html = figure_html(png, 'loss "raw"', wide=True)
    data = re.search(r'src="data:image/png;base64,([^"]+)"', html).group(1)
    assert base64.b64decode(data) == png
    assert html.startswith('<figure class="wide">')
    assert "<figcaption>loss &quot;raw&quot;</figcaption>" in html
    assert figure_html(png, "x").startswith("<figure><img")


def test_tables_align_numeric_columns_and_sections_escape_their_lead():
    table = table_html(["layer", "dead_units"], [["<code>fc</code>", "3"]], {1}, "t")
    assert '<table id="t">' in table and '<th class="num">dead units</th>' in table
    assert '<td><code>fc</code></td><td class="num">3</td>' in table
    section = section_html("Findings", "a < b", table)
    assert section.startswith('<section><h2>Findings</h2><p class="lead">a &lt; b</p>')


def test_values_read_as_a_person_writes_them():
    assert [format_value(v) for v in (None, True, 1234567, 0.000123456, float("nan"), [3, 32, 32])] == [
        "—",
        "True",
        "1,234,567",
        "0.0001235",
        "nan",
        "3×32×32",
    ]

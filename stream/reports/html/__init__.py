"""The self-contained HTML report (``faultstream report --html``).

Standard library only: the page is drawn from the plain data of
:func:`stream.reports.text.build_report`, and nothing here imports the rest of the project.

Modules, from low to high level:

``markup``
    escaping, elements, and the text of numbers and times;
``svg``
    the plot frame, round axis scales, SVG shapes, axes and legends;
``charts``
    each chart, from report data to one ``<figure>`` holding an SVG;
``sections``
    each section of the page (summary cards, tables, the charts in their place);
``page``
    the document (CSS, Content-Security-Policy, header, footer) and writing its file.
"""

from stream.reports.html.page import check_writable, render_html, write_html

__all__ = ["check_writable", "render_html", "write_html"]

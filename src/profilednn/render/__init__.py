"""Building blocks for HTML reports, below every job that renders one.

- ``html``: one self-contained page (inline CSS, sortable tables, the script), the
  :class:`~profilednn.render.html.Section` a job's report contributes, and the blocks it
  is built from (``table``, ``cards``, ``key_values``, ``figure``, ``esc``).
- ``charts``: matplotlib figures in the reports' style, as inline SVG or PNG (``Chart``,
  ``chart_figure``, ``chart_axes``, ``chart_subplots``, ``short_label``, ``PALETTE``).

Nothing here knows a job; the pieces are imported by module (``render.charts`` pulls in
matplotlib, so the package itself imports nothing).
"""

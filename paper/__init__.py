"""The paper's figures, tables and quoted numbers, generated from results files only.

``python -m paper.figures [--results DIR] [--out DIR] [--strict]`` (or ``make -C paper
figures``) reads ``benchmark/results/*.json`` and writes ``Figures/*.pdf|png``,
``Tables/*.tex`` and ``Generated/*.tex`` under ``--out`` (default: this directory).
Nothing in the text is typed in by hand: see :mod:`paper.macros`.
"""

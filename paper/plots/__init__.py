"""One module per figure (or table): a ``SPEC`` (:class:`paper.figures.FigureSpec`) whose
caption text lives beside the code that draws it."""

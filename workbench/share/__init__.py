"""What leaves the run folder: figures and the report a colleague opens without Python.

``plots`` (the house plotly template, labels with units, validity marks) and ``report`` (the self-contained HTML
report of one run or a comparison of runs, its findings and evidence). Reads run folders and predictions; the
experiments draw their figures with ``plots``.
"""

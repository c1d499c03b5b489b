"""Predictions: models of cost that say what a measurement should find before it is made.

``roofline`` (the latency model: bytes and FLOPs per step, the device probe's figures, the calibration record),
``roofline_calibration`` (its fit, the per-machine cache and today's check, the ``Predictor``, MBU / MFU over the
peaks of a point's own dtype) and ``predictions``
(the roofline applied: suite plans, predictions beside measurements, residuals), ``twin``, ``twin_engine`` and
``twin_cost`` (the serving twin: the engines' own scheduling code on a virtual clock with a calibrated per-step cost
model; ``twin_engine`` is one engine replica), ``twin_validation`` (the twin beside a run's measured serving and
scheduling points: its errors, knees and recommendations, in words), ``twin_study`` (what ``workbench simulate``
runs: notebooks 08 and 11's points simulated, capacity per SLO, confirming picks for real), ``profile_step`` (where one decode step's time goes, beside the
roofline's bytes-at-bandwidth time). Above the run machinery (a plan reads suites and point ids) and serving, below
reports and experiments.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["predictions", "profile_step", "roofline", "roofline_calibration", "twin", "twin_cost", "twin_study",
           "twin_validation"]
